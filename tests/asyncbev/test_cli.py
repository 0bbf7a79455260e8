"""The tiny twin through the CLI (training, devkit evaluation in validation, checkpoint) and the real config parsed."""
from __future__ import annotations

import math

import pytest
import torch

from tests.twin import fit_twin, metric_rows, print_config


def training_loss(model, batches) -> float:
    """The detector's training objective (heatmap + box + flow) on the given batches, batch statistics in BatchNorm."""
    model.train()
    with torch.no_grad():
        return sum(float(model.losses(b)["loss"]) for b in batches) / len(batches)


def test_tiny_twin_fits_and_evaluates_through_the_cli(tmp_path):
    cli = fit_twin("asyncbev", tmp_path)
    # learned: on the training batches, the trained detector's objective is below the same config's untrained one
    trained = cli.trainer.lightning_module
    torch.manual_seed(0)
    untrained = type(trained)(**{k: v for k, v in trained.hparams.items() if not k.startswith("_")})
    batches = list(cli.datamodule.train_dataloader())[:2]
    after, before = training_loss(trained, batches), training_loss(untrained, batches)
    assert after < 0.9 * before, (after, before)
    rows = metric_rows(tmp_path)
    train = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert train and all(math.isfinite(v) for v in train)
    flow = [float(r["val/loss_flow"]) for r in rows if r.get("val/loss_flow")]
    assert flow and flow[-1] > 0  # 0.5 s offset: the moving objects give a non-zero flow target
    nds = [float(r["val/all_NDS"]) for r in rows if r.get("val/all_NDS")]
    assert nds and 0.0 <= nds[-1] <= 1.0  # nuscenes-devkit ran on the whole mini_val split
    emc = [float(r["val/dynamic_NDS/emc"]) for r in rows if r.get("val/dynamic_NDS/emc")]
    assert emc and 0.0 <= emc[-1] <= 1.0  # the EMC baseline scored on the same weights (val_baselines)
    own = [(r["val/dynamic_NDS"], r["val/dynamic_NDS/asyncbev"]) for r in rows if r.get("val/dynamic_NDS")]
    assert own and own[-1][0] == own[-1][1]  # the model's own metric under both names
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()


@pytest.mark.parametrize("config", ["configs/asyncbev.yaml", "configs/asyncbev_full.yaml"])
def test_real_configs_parse(config, capsys):
    out = print_config(config, capsys)
    assert "lit_iclr.asyncbev.AsyncBEV" in out and "NuScenesAsync" in out and "compensation: asyncbev" in out
    assert "num_classes" not in out.split("data:")[0].split("init_args:")[1]  # linked from the data
