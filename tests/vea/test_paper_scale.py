"""Paper scale of vea: configs/paper/vea.yaml parses with the real CLI without the dataset, builds on the meta device in
seconds, and plans (lit_iclr/vea/plan.py). Training-free; LLaVA-1.5-7B (28 GB in fp32) does not fit 24 GB, so no CPU
pass."""
from __future__ import annotations

import time

from lit_iclr.core.plan import build_on_meta, count_params, method_hooks, plan
from tests.twin import ROOT, print_config

CONFIG = str(ROOT / "configs/paper/vea.yaml")


def test_paper_config_prints_without_the_dataset(capsys):
    assert "class_path" in print_config("configs/paper/vea.yaml", capsys)


def test_paper_config_builds_on_meta_in_seconds():
    t0 = time.perf_counter()
    module, datamodule, _ = build_on_meta([CONFIG])
    assert time.perf_counter() - t0 < 60
    assert all(p.device.type == "meta" for p in module.parameters())
    stated = method_hooks(module).PAPER.get("params")
    if stated:  # the paper's parameter count, within 5%
        assert abs(count_params(module)["total"] / stated - 1) < 0.05


def test_paper_plan_counts_two_answering_passes_of_llava():
    p = plan([CONFIG])
    assert not p.gradient
    tokens = 576 + 40
    # two forwards of ~2 x 7 B FLOPs per token, batch 8 (matrix products only)
    assert 0.8 < p.flops / (2 * 8 * tokens * 2 * 7.0e9) < 1.2
