"""`drop_failing_nvml_check`: the NVML-based CUDA check is dropped only where NVML cannot be loaded, and torch's answer
stays the same."""
from __future__ import annotations

import os

import torch

from lit_iclr.core import cuda_check


def test_kept_where_nvml_works(monkeypatch):
    monkeypatch.setenv(cuda_check.NVML_CHECK, "1")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 2)
    assert cuda_check.drop_failing_nvml_check() is False
    assert os.environ[cuda_check.NVML_CHECK] == "1"  # GPU machines keep Lightning's fork-safe check


def test_dropped_where_nvml_fails_with_the_same_answer(monkeypatch):
    monkeypatch.setenv(cuda_check.NVML_CHECK, "1")
    answer = torch.cuda.is_available()
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: -1)  # NVML cannot be loaded
    assert cuda_check.drop_failing_nvml_check() is True
    assert cuda_check.NVML_CHECK not in os.environ
    monkeypatch.undo()
    assert torch.cuda.is_available() == answer


def test_importing_the_trainer_leaves_no_failing_check_on_this_machine():
    import lit_iclr.core.trainer  # noqa: F401  (imports Lightning, which sets the check)

    if torch.backends.cuda.is_built() and torch.cuda._device_count_nvml() < 0:
        assert os.environ.get(cuda_check.NVML_CHECK) != "1"
