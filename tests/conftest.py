"""Offline, CPU-only, quiet defaults for every test."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("LIT_ICLR_LINE_PROGRESS", "1")


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for the test, as a fit of a tiny model sets it; torch's default threads contend on a shared
    CPU. A package opts in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")` or an autouse wrapper."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
