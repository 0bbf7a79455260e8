"""The tiny twin through the CLI (fit + test), and the real configs parsed."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.twin import fit_twin, metric_rows, print_config


def supervised_loss(net, loader, concept_weight: float) -> float:
    """CE(y) + lambda * BCE(c) of a CBM's deterministic path (z = mu) over every training batch, computed here."""
    total, n = 0.0, 0
    with torch.no_grad():
        for b in loader:
            enc = net.encode(b["x"])
            out = net.decide(enc, enc["mu"])
            bce = F.binary_cross_entropy_with_logits(out["c_logits"], b["c"], reduction="none").sum(1)
            ce = F.cross_entropy(out["y_logits"], b["y"], reduction="none")
            total += float((ce + concept_weight * bce).sum())
            n += len(b["y"])
    return total / n


def test_tiny_twin_fits_and_tests_through_the_cli(tmp_path):
    cli = fit_twin("cibm", tmp_path)
    # learned: the trained CBM fits its training data better than the same config's untrained CBM (same seed)
    trained = cli.trainer.lightning_module
    torch.manual_seed(0)
    untrained = type(trained)(**{k: v for k, v in trained.hparams.items() if not k.startswith("_")})
    loader = cli.datamodule.train_dataloader()
    lam = trained.hparams.concept_weight
    after, before = supervised_loss(trained.net, loader, lam), supervised_loss(untrained.net, loader, lam)
    assert after < 0.9 * before, (after, before)
    rows = metric_rows(tmp_path)
    val = [float(r["val/acc"]) for r in rows if r.get("val/acc")]
    mi = [float(r["val/mi_xc"]) for r in rows if r.get("val/mi_xc")]
    beta = [float(r["train/beta"]) for r in rows if r.get("train/beta")]
    assert val and all(0 <= v <= 1 for v in val) and (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert mi and all(0 <= v <= 3.47 for v in mi)  # 0 <= I_hat <= log M (M = 32 subsample points)
    assert beta and beta[0] != 0.5  # the dual variable moved after the first batch
    assert list((tmp_path / "figures").glob("fit_information_plane*.png"))
    fit_twin("cibm", tmp_path, "--ckpt_path", str(tmp_path / "checkpoints" / "last.ckpt"), subcommand="test")
    rows = metric_rows(tmp_path)
    tti = [float(r["test/tti_random_full"]) for r in rows if r.get("test/tti_random_full")]
    assert tti and 0 <= tti[-1] <= 1
    assert list((tmp_path / "figures").glob("test_interventions*.png"))


def test_real_config_parses(capsys):
    out = print_config("configs/cibm.yaml", capsys)
    assert "lit_iclr.cibm.CIBM" in out and "CUBConcepts" in out and "beta_lr: -0.01" in out
    assert "concept_groups" not in out and "input_shape" not in out  # linked from the data, never written in YAML
