"""Paper scale of evotest: configs/paper/evotest.yaml parses with the real CLI without the dataset, builds on the meta
device in seconds, and plans (lit_iclr/evotest/plan.py). No gradients; the 8 B actor (32 GB in fp32) does not fit 24
GB, so no CPU pass."""
from __future__ import annotations

import time

from lit_iclr.core.plan import build_on_meta, count_params, method_hooks, plan
from tests.twin import ROOT, print_config

CONFIG = str(ROOT / "configs/paper/evotest.yaml")


def test_paper_config_prints_without_the_dataset(capsys):
    assert "class_path" in print_config("configs/paper/evotest.yaml", capsys)


def test_paper_config_builds_on_meta_in_seconds():
    t0 = time.perf_counter()
    module, datamodule, _ = build_on_meta([CONFIG])
    assert time.perf_counter() - t0 < 60
    assert all(p.device.type == "meta" for p in module.parameters())
    stated = method_hooks(module).PAPER.get("params")
    if stated:  # the paper's parameter count, within 5%
        assert abs(count_params(module)["total"] / stated - 1) < 0.05


def test_paper_plan_counts_the_actor_forward():
    p = plan([CONFIG])
    assert not p.gradient and p.steps == 50 * 110
    assert p.params["per_group"]["actor_lm"] == 8_030_261_248
    assert 0.8 < p.flops / (2 * 16 * 2056 * 8.03e9) < 1.2
