"""Paper scale of mosa: configs/paper/mosa.yaml parses with the real CLI without the dataset, builds on the meta device
in seconds, and plans (lit_iclr/mosa/plan.py). The paper-size DiT (1.95 B parameters; AdamW state alone 15.6 GB in
fp32) does not fit 24 GB: no CPU step."""
from __future__ import annotations

import time

from lit_iclr.core.plan import build_on_meta, count_params, method_hooks, plan
from tests.twin import ROOT, print_config

CONFIG = str(ROOT / "configs/paper/mosa.yaml")


def test_paper_config_prints_without_the_dataset(capsys):
    assert "class_path" in print_config("configs/paper/mosa.yaml", capsys)


def test_paper_config_builds_on_meta_in_seconds():
    t0 = time.perf_counter()
    module, datamodule, _ = build_on_meta([CONFIG])
    assert time.perf_counter() - t0 < 60
    assert all(p.device.type == "meta" for p in module.parameters())
    stated = method_hooks(module).PAPER.get("params")
    if stated:  # the paper's parameter count, within 5%
        assert abs(count_params(module)["total"] / stated - 1) < 0.05


def test_paper_plan_counts_the_dit_and_does_not_fit_24_gb_on_one_device():
    p = plan([CONFIG])
    assert 1.9e9 < p.params["total"] < 2.0e9 and p.gradient
    n = p.params["total"]
    assert 16 * n > 24e9  # fp32 weights + gradients + two AdamW moments, before any activation
