"""Freed host memory kept in the process for the next training step (glibc's malloc thresholds fixed).

PyTorch's CPU tensors come from plain `malloc`. With glibc's defaults, a block above the mmap threshold (128 KiB at
first, moved up to the largest block freed so far, at most 32 MiB) is mapped fresh from the kernel and unmapped when
freed, and free memory at the top of the heap beyond the trim threshold is handed back to the kernel. A training step
allocates and frees the same activations every step, so it page-faults them in anew each time: 20-50 faults per VGF
update at its default size, about 3 % of the step (`seeds/platform.md`). Fixed thresholds keep the freed pages for
reuse, as tcmalloc or jemalloc would (PyTorch's CPU performance guide suggests preloading one of them); the cost is that
the process's resident memory stays at its peak instead of shrinking between steps.

Set `LIT_ICLR_MALLOC_DEFAULTS=1` to keep glibc's defaults; `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_` set in
the environment are the user's choice and are left alone.
"""
from __future__ import annotations

import ctypes
import os
import platform

OPT_OUT = "LIT_ICLR_MALLOC_DEFAULTS"
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_THRESHOLD = 32 << 20  # blocks up to 32 MiB come from the heap and are reused (glibc's own dynamic maximum)
TRIM_THRESHOLD = 512 << 20  # up to 512 MiB of free heap is kept instead of returned to the kernel


def keep_freed_host_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; returns whether they were set (glibc only, and neither
    opted out nor set by the user)."""
    if os.environ.get(OPT_OUT) == "1" or any(k in os.environ for k in USER_SETTINGS):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the C library this process already uses
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
