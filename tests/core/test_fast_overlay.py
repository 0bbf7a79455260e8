"""Every twin config under the fast overlay (`--config configs/trainer/fast.yaml`) ends with its method's headline:
the method declares one, its metric and every in-run baseline were logged, and the summary renders them.

`*_sample` twins are predict configs that read a trained run's checkpoints (their headline is tested in their
method's folder). A fast pair runs by default; the sweep over every twin is marked slow.
"""
from pathlib import Path

import pytest

from lit_iclr.core.hub import final_metrics
from lit_iclr.core.summary import module_headline
from lit_iclr.registry import METHODS
from tests.twin import ROOT, fit_twin

CONFIGS = sorted(p.stem for p in (ROOT / "tests" / "configs").glob("*.yaml") if not p.stem.endswith("_sample"))
FAST = {"reimts", "aire_prune"}
FAST_OVERLAY = str(ROOT / "configs" / "trainer" / "fast.yaml")


def test_every_method_has_a_twin_here():
    assert {m for m in METHODS if not any(c == m or c.startswith(m + "_") for c in CONFIGS)} == set()


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in FAST else [pytest.mark.slow]) for n in CONFIGS])
def test_fast_overlay_ends_with_the_headline_and_its_baselines(tmp_path: Path, name: str, capsys):
    cli = fit_twin(name, tmp_path / "run", "--config", FAST_OVERLAY, "--trainer.enable_progress_bar", "false")
    head = module_headline(cli.model)
    assert head is not None, f"{type(cli.model).__name__} declares no headline()"
    out = capsys.readouterr().out
    summary = out[out.rindex("lit-iclr: fit done"):]
    key = head.metric.format(stage="val")
    assert f"headline: {key}" in summary
    assert "was not logged" not in summary, summary
    assert "not logged" not in summary, summary  # a baseline computed in the run but missing from it
    logged = set(cli.trainer.callback_metrics) | set(final_metrics(tmp_path / "run"))  # some log after the fit
    for baseline in head.baselines.values():
        assert baseline.format(stage="val") in logged, (baseline, sorted(logged))
