"""The tiny twin through the CLI (fit, then test with the analysis and VEA; the fit must lower the loss on its training
questions below the untrained model's and below chance), and the real configs parsed."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tests.twin import fit_twin, metric_rows, print_config


def cross_entropy_on(vlm, dataset) -> float:
    """Mean cross-entropy of `vlm`'s answers over every question of `dataset` (the loss the fit minimises)."""
    batch = next(iter(DataLoader(dataset, batch_size=len(dataset))))
    with torch.no_grad():
        return F.cross_entropy(vlm.eval()(batch["x"], batch["q"]).logits, batch["y"], ignore_index=-1).item()


def test_tiny_twin_fits_and_tests_through_the_cli(tmp_path, capsys):
    cli = fit_twin("vea", tmp_path)
    rows = metric_rows(tmp_path)
    val = [float(r["val/acc"]) for r in rows if r.get("val/acc")]
    assert val and all(0 <= v <= 1 for v in val) and (tmp_path / "checkpoints" / "last.ckpt").exists()
    # learned: on its own training questions the fitted model's loss is below the same config's untrained model's
    # (`validate` builds it with the same seed and trains nothing; its tower is not pretrained either)
    untrained = fit_twin("vea", tmp_path / "untrained", "--data.init_args.data_dir", str(tmp_path / "data"),
                         subcommand="validate")
    train_set = cli.datamodule.datasets["train"]
    trained_ce, untrained_ce = cross_entropy_on(cli.model.vlm, train_set), cross_entropy_on(untrained.model.vlm, train_set)
    assert trained_ce < 0.8 * min(untrained_ce, math.log(cli.model.hparams.num_answers)), (trained_ce, untrained_ce)
    # fit ends with the headline: VEA against plain decoding, both scored on the odd-indexed validation questions
    out = capsys.readouterr().out
    assert "headline: val/acc/vea" in out and "plain decoding" in out
    last_val = {k: float(v) for r in rows for k, v in r.items() if v and k.startswith("val/")}
    # the baseline recomputed by hand: argmax answer of the trained model on the odd-indexed val questions, by `gold`
    vlm = cli.model.vlm.eval()
    hits, n = 0.0, 0
    with torch.no_grad():
        for batch in cli.datamodule.val_dataloader():
            odd = batch["index"] % 2 == 1
            pred = vlm(batch["x"][odd], batch["q"][odd]).logits.argmax(-1)
            hits += float(batch["gold"][odd][torch.arange(len(pred)), pred].sum())
            n += len(pred)
    assert n == 16 and last_val["val/vea_questions"] == n  # 32 val questions: the 16 odd-indexed ones are scored
    assert abs(last_val["val/acc/plain"] - hits / n) < 1e-6
    assert 0 <= last_val["val/acc/vea"] <= 1 and 0 <= last_val["val/acc/oracle_mask"] <= 1
    fit_twin("vea", tmp_path, "--ckpt_path", str(tmp_path / "checkpoints" / "last.ckpt"), subcommand="test")
    last = {k: v for r in metric_rows(tmp_path) for k, v in r.items() if v}
    for name in ("plain", "vea", "vea_random_layers", "vea_shallow_layers", "vea_random_mask", "crop", "assembly",
                 "oracle_mask"):
        assert 0 <= float(last[f"test/acc/{name}"]) <= 1
    shares = [float(last[f"test/layer/rapt_share_{i}"]) for i in range(2)]
    assert all(0 <= s <= 1 for s in shares)
    aurocs = [float(last[f"test/layer/auroc_{i}"]) for i in range(2)]
    assert all(0 <= a <= 1 for a in aurocs) and not any(math.isnan(a) for a in aurocs)
    assert list((tmp_path / "figures").glob("test_layers*.png"))


def test_real_config_parses(capsys):
    out = print_config("configs/vea.yaml", capsys)
    assert "lit_iclr.vea.VEAModule" in out and "EvidenceVQA" in out and "top_frac: 0.25" in out and "patch_size: 16" in out
    assert "num_answers" not in out and "vocab_size: 512" in out  # num_answers, vocab_size: linked, written once (data)


def test_scenes_twin_fits_through_the_cli(tmp_path):
    fit_twin("vea_scenes", tmp_path)
    val = [float(r["val/acc"]) for r in metric_rows(tmp_path) if r.get("val/acc")]
    assert val and all(0 <= v <= 1 for v in val)


def test_scenes_config_parses(capsys):
    out = print_config("configs/vea_scenes.yaml", capsys)
    assert "patch_size: 8" in out and "num_items: 3" in out and "p_same_group: 0.5" in out


def test_grid_config_parses(capsys):
    out = print_config("configs/vea_grid.yaml", capsys)
    assert "patch_size: 8" in out and "depth: 6" in out and "num_layers: 2" in out and "top_frac: 0.25" in out
