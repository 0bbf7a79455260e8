"""Paper scale of stageroute: configs/paper/stageroute.yaml parses with the real CLI without the dataset, builds on the
meta device in seconds, and plans (lit_iclr/stageroute/plan.py). No gradients: step_loss is None and the module has no
parameters."""
from __future__ import annotations

import time

from lit_iclr.core.plan import build_on_meta, count_params, method_hooks, plan
from tests.twin import ROOT, print_config

CONFIG = str(ROOT / "configs/paper/stageroute.yaml")


def test_paper_config_prints_without_the_dataset(capsys):
    assert "class_path" in print_config("configs/paper/stageroute.yaml", capsys)


def test_paper_config_builds_on_meta_in_seconds():
    t0 = time.perf_counter()
    module, datamodule, _ = build_on_meta([CONFIG])
    assert time.perf_counter() - t0 < 60
    assert all(p.device.type == "meta" for p in module.parameters())
    stated = method_hooks(module).PAPER.get("params")
    if stated:  # the paper's parameter count, within 5%
        assert abs(count_params(module)["total"] / stated - 1) < 0.05


def test_paper_plan_is_forward_only_with_no_parameters():
    p = plan([CONFIG])
    assert not p.gradient and p.params["total"] == 0 and p.batch_size == 500
