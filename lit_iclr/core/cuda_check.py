"""CUDA availability checks without a failing NVML load per call.

Importing Lightning sets `PYTORCH_NVML_BASED_CUDA_CHECK=1`, so that `torch.cuda.is_available()` asks NVML instead of
initialising the CUDA runtime (which would make a later fork unsafe). Where NVML cannot be loaded (no NVIDIA driver:
any CPU-only machine), torch then tries to `dlopen` libnvidia-ml on every call and, when that fails, falls back to the
CUDA runtime query it was meant to avoid. PyTorch's optimizers call that check in every `step()` (the graph-capture
health check), so a CPU run paid 0.15-0.3 ms per optimizer step for a failing library load and the same answer.
"""
from __future__ import annotations

import os

import torch

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def drop_failing_nvml_check() -> bool:
    """Unset the NVML-based check when NVML cannot be loaded; torch's answer is the runtime query either way. Returns
    whether it was dropped (kept wherever NVML works: GPU machines keep Lightning's fork-safe check)."""
    if os.environ.get(NVML_CHECK) != "1" or not torch.backends.cuda.is_built():
        return False
    if torch.cuda._device_count_nvml() >= 0:
        return False
    del os.environ[NVML_CHECK]
    return True
