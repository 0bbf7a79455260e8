"""Freed host memory is reused by the next step instead of being page-faulted in again (`core/host_memory.py`)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from lit_iclr.core.host_memory import OPT_OUT, keep_freed_host_memory

# a "training step" of tensors of 1-3 MiB allocated, written and freed, 20 times; prints the median page faults per
# step (the median: a one-off, such as a thread pool starting on a loaded machine, is not a per-step cost)
STEPS = """
import resource, statistics, sys, torch
from lit_iclr.core.host_memory import keep_freed_host_memory
print(keep_freed_host_memory())
def step():
    ts = [torch.ones(256 * 1024 * (1 + i % 3)) for i in range(8)]
    del ts
step()
faults = []
for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(statistics.median(faults))
"""


def faults_per_step(**env: str) -> tuple[bool, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != OPT_OUT}
    out = subprocess.run([sys.executable, "-c", STEPS], env={**clean, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_kept_memory_is_not_faulted_in_every_step():
    """With glibc's defaults most runs map the 12 MiB of each step (3072 pages) anew every step and some adapt part-way
    (180-450 faults per step seen: `faults_per_step(LIT_ICLR_MALLOC_DEFAULTS="1")`); kept, none."""
    set_, kept = faults_per_step()
    assert set_
    assert kept < 20


@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_MMAP_THRESHOLD_": "65536"}, {OPT_OUT: "1"}])
def test_the_users_own_malloc_settings_are_left_alone(env, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert keep_freed_host_memory() is False  # returns before touching the allocator
