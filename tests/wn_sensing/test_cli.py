"""The tiny twin through the CLI and the real configs parsed."""
from __future__ import annotations

import pytest

from tests.twin import fit_twin, metric_rows, print_config


def test_tiny_twin_fits_through_the_cli(tmp_path):
    fit_twin("wn_sensing", tmp_path)
    rows = metric_rows(tmp_path)
    val = [float(r["val/rel_error"]) for r in rows if r.get("val/rel_error")]
    train = [float(r["train/rel_error"]) for r in rows if r.get("train/rel_error")]
    # 40 iterations from a 1e-3 initialisation: the error must already have dropped well below its start (~1)
    assert len(val) == 2 and val[-1] < val[0] < 0.9 and train[0] > val[-1]
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert list((tmp_path / "figures").glob("val_spectrum*.png"))
    # GD beside it in the same fit is plain GD run alone (algorithms.solve) for the same number of iterations
    import math

    import torch

    from lit_iclr.wn_sensing.algorithms import SolverConfig, solve
    from lit_iclr.wn_sensing.problem import read_problem

    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    hp = ckpt["hyper_parameters"]
    problem = read_problem(next((tmp_path / "data").rglob("problem.npz")))
    alone = solve(SolverConfig(method="gd", rank=hp["rank"], lr=hp["baseline_lr"], init_scale=hp["init_scale"],
                               seed=hp["seed"]), problem.op, problem.y, problem.target, iters=ckpt["global_step"])
    gd = [float(r["val/log10_rel_error_gd"]) for r in rows if r.get("val/log10_rel_error_gd")]
    assert gd[-1] == pytest.approx(math.log10(float(alone["errors"][-1])), rel=1e-9)


def test_real_configs_parse(capsys):
    out = print_config("configs/wn_sensing.yaml", capsys)
    assert "MatrixSensing" in out and "SensingData" in out and "dim: 40" in out
    out = print_config("configs/wn_sensing_image.yaml", capsys)
    assert "target: image" in out and "operator: rank_one" in out
