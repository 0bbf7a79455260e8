"""Every configs/paper/*.yaml: built on the meta device in seconds, its parameter count within 5% of the paper's where
the paper states one, planned (FLOPs, memory) without allocating; and, for the models that fit in 24 GB, one real
forward and backward at batch 1 with real-size inputs on the CPU, with a finite loss and finite gradients.

Models whose batch-1 CPU step is large (over FAST_BYTES of memory or FAST_FLOPS per step) run in the slow suite
(`pytest -m slow tests/core/test_paper_configs.py`); the fast ones run by default.
"""
from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest
import torch

from lit_iclr.core import plan as P
from lit_iclr.core.plan_memory import Strategy, held_by_forward
from tests.twin import print_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs" / "paper").glob("*.yaml"))
CPU_LIMIT = 24e9  # "fits in 24 GB": the batch-1 fp32 step on one device
FAST_BYTES = 3 * 2**30
FAST_FLOPS = 2e11  # about 5-10 s forward + backward on 2 cores
META_SECONDS = 30.0
ACT_TOLERANCE = 0.15  # planned vs. held activation bytes (caches built in the forward are held, not saved)


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # configs name files relative to the repository (configs/paper/hf/...)


@functools.cache
def _meta(config: str):
    t0 = time.perf_counter()
    module, dm, trainer_cfg = P.build_on_meta([config])
    return module, dm, trainer_cfg, time.perf_counter() - t0


@functools.cache
def _batch1(config: str) -> tuple[float, int, dict]:
    """(fp32 single-device bytes, FLOPs, activation terms) of the batch-1 step, planned on the meta device."""
    module, dm, _, _ = _meta(config)
    hooks = P.method_hooks(module)
    batch = hooks.example_batch(dm, 1, "meta")
    flops, acts, _ = P.measure_step(module, batch, hooks.step_loss)
    memory = P._memory(module, batch, Strategy("single", 1), "32-true", hooks, acts)
    return memory["total"], flops, memory


@pytest.mark.parametrize("config", CONFIGS)
def test_prints_through_the_cli_without_the_dataset(config, capsys):
    assert "class_path" in print_config(config, capsys)


@pytest.mark.parametrize("config", CONFIGS)
def test_builds_on_meta_in_seconds_with_the_papers_parameter_count(config):
    module, _, _, seconds = _meta(config)
    assert seconds < META_SECONDS, f"{config}: building on the meta device took {seconds:.1f} s"
    # methods without gradient training (bandits, cascades) may have no parameters at all, and a few bytes of
    # statistics buffers on the CPU; nothing that grows with the paper's sizes is allocated
    real = {n: t for n, t in [*module.named_parameters(), *module.named_buffers()] if t.device.type != "meta"}
    assert sum(t.nbytes for t in real.values()) < 2**20, f"{config}: tensors were allocated: {list(real)[:5]}"
    paper = getattr(P.method_hooks(module), "PAPER", {}) or {}
    if paper.get("params"):
        n = P.count_params(module)["total"]
        assert abs(n / paper["params"] - 1) <= 0.05, (
            f"{config}: {n:,} parameters, the paper states {paper['params']:,.0f} ({paper.get('params_source')})")


# plans whose meta step takes minutes (a Python loop over merge units or time steps in the method's step; 100-120 s and
# 40 s on the loaded 2-core machine): planned at batch 1 in the default suite is still too slow, so only in the slow one
SLOW_PLANS = {"configs/paper/namex.yaml", "configs/paper/reimts.yaml"}


def _check_plan(config: str, batch_size: int | None) -> None:
    p = P.plan([config], batch_size=batch_size)
    if p.params["total"]:
        assert p.flops > 0, f"{config}: no FLOPs counted"
        assert p.memory["weights"] > 0
    assert p.memory["total"] > 0
    assert p.params["total"] == sum(p.params["per_group"].values())
    text = P.format_plan(p)
    assert "FLOPs" in text and "memory / device" in text


@pytest.mark.parametrize("config", [c for c in CONFIGS if c not in SLOW_PLANS])
def test_plan_counts_flops_and_memory(config):
    _check_plan(config, batch_size=1)


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_plan_at_the_papers_batch(config):
    _check_plan(config, batch_size=None)


def _input_bytes(batch) -> int:
    leaves = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    return sum(t.untyped_storage().nbytes() for t in leaves if isinstance(t, torch.Tensor))


def _cpu_step(config: str):
    torch.manual_seed(0)
    module, dm, _ = P.build([config], "cpu")
    hooks = P.method_hooks(module)
    module.train()
    batch = hooks.example_batch(dm, 1, "cpu")
    held, loss = held_by_forward(lambda: hooks.step_loss(module, batch))
    if loss is None:
        return
    # the plan's activations (saved tensors on the meta device) against what the CPU forward really keeps alive
    planned = _batch1(config)[2]["activations"] - _input_bytes(batch)
    assert abs(planned - held) <= ACT_TOLERANCE * max(held, 2**20), (
        f"{config}: the plan counts {planned / 2**20:.1f} MiB of activations, the CPU forward holds {held / 2**20:.1f} MiB")
    assert loss.dim() == 0 and torch.isfinite(loss), f"{config}: loss {loss}"
    loss.backward()
    grads = [(n, q.grad) for n, q in module.named_parameters() if q.requires_grad]
    assert any(g is not None for _, g in grads), f"{config}: no parameter received a gradient"
    bad = [n for n, g in grads if g is not None and not torch.isfinite(g).all()]
    assert not bad, f"{config}: non-finite gradients in {bad[:5]}"


def _batch1_case(config: str, fast: bool) -> None:
    module = _meta(config)[0]
    floor = sum(16 * q.numel() if q.requires_grad else 4 * q.numel() for q in module.parameters())
    if floor > CPU_LIMIT:  # fp32 weights, gradients and Adam's m, v alone: no need to run the meta step
        pytest.skip(f"{config}: weights, gradients and optimiser state alone need {floor / 1e9:.1f} GB (> 24 GB)")
    total, flops, _ = _batch1(config)
    if total > CPU_LIMIT:
        pytest.skip(f"{config}: the batch-1 step needs {total / 1e9:.1f} GB (> 24 GB)")
    small = total <= FAST_BYTES and flops <= FAST_FLOPS
    if small != fast:
        pytest.skip(f"{config}: {'large' if fast else 'small'} batch-1 step ({total / 2**30:.2f} GiB, "
                    f"{flops / 1e9:.1f} GFLOP): runs in the {'slow' if fast else 'fast'} suite")
    _cpu_step(config)


@pytest.mark.parametrize("config", CONFIGS)
def test_batch1_forward_backward_on_cpu(config):
    _batch1_case(config, fast=True)


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_batch1_forward_backward_on_cpu_large(config):
    _batch1_case(config, fast=False)

