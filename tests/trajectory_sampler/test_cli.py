"""Every config's tiny twin through the CLI (fit the predictor, then `predict` the sampler over its checkpoint folder),
and every real config parsed."""
from __future__ import annotations

import json

import pytest
import torch

from lit_iclr.cli import main
from tests.twin import fit_twin, metric_rows, print_config, twin_config

TASKS = ["trajectory_sampler", "trajectory_sampler_dna", "trajectory_sampler_modes", "trajectory_sampler_counterfactual"]


def fit_then_sample(task, tmp_path, *extra):
    fit_twin(task, tmp_path / "fit")
    ckpts = sorted((tmp_path / "fit" / "checkpoints").glob("trajectory-*.ckpt"))
    assert len(ckpts) >= 3  # the trajectory, not just the final model
    fit_twin(f"{task}_sample", tmp_path / "sample", "--model.init_args.checkpoint_dir", str(tmp_path / "fit" / "checkpoints"),
             *extra, subcommand="predict")
    return json.loads((tmp_path / "sample" / "summary.json").read_text()), torch.load(
        tmp_path / "sample" / "samples.pt", weights_only=True)


def test_boolean_twin_fits_and_samples(tmp_path):
    summary, samples = fit_then_sample("trajectory_sampler", tmp_path)
    rows = metric_rows(tmp_path / "fit")
    assert any(r.get("val/mse") for r in rows)
    assert summary["method"] == "trajectory" and summary["checkpoints"] == 3 and summary["chains"] == 32
    assert summary["evaluations_per_chain"] == 3 * 3 + 3  # K*m steps + one evaluation per stage switch
    x = samples["x"]
    assert x.shape == (32, 10) and set(x.unique().tolist()) <= {0.0, 1.0}
    assert 0 <= summary["needle_rate"] <= 1 and 0 < summary["acceptance"] <= 1
    assert summary["score_mean"] == pytest.approx(float(samples["score"].mean()), rel=1e-5)


def test_dna_twin_keeps_fixed_positions(tmp_path):
    summary, samples = fit_then_sample("trajectory_sampler_dna", tmp_path, "--model.init_args.method", "tempering")
    x = samples["x"]
    assert x.shape == (32, 12, 4) and torch.allclose(x.sum(-1), torch.ones(32, 12))
    from lit_iclr.trajectory_sampler import SequenceAffinityData

    dm = SequenceAffinityData(data_dir=str(tmp_path / "fit" / "data"), length=12, num_samples=300, pairs=4, num_chains=32)
    start = dm.chain_starts(torch.Generator().manual_seed(0))
    assert torch.equal(x[:, [0, 11]], start[:, [0, 11]])  # fixed positions never move
    assert summary["method"] == "tempering" and "true_score_max" in summary


def test_modes_twin_runs_mala(tmp_path):
    summary, samples = fit_then_sample("trajectory_sampler_modes", tmp_path, "--model.init_args.smc", "true")
    assert samples["x"].shape == (32, 2) and torch.isfinite(samples["x"]).all()
    assert 0 <= summary["modes_covered"] <= 8 and 0 <= summary["mode_tv"] <= 1


def test_counterfactual_twin_respects_the_edit_budget(tmp_path):
    summary, samples = fit_then_sample("trajectory_sampler_counterfactual", tmp_path)
    assert samples["x"].shape == (6, 784)  # 2 queries x 3 chains
    assert (samples["edits"] <= 5).all() and 0 <= summary["success_rate"] <= 1
    assert (samples["target"] == 7).all()


@pytest.mark.parametrize("config", [f"configs/{t}{s}.yaml" for t in TASKS for s in ("", "_sample")])
def test_real_configs_parse(config, capsys):
    out = print_config(config, capsys)
    assert "lit_iclr.trajectory_sampler" in out
    if config.endswith("_sample.yaml"):
        assert "checkpoint_dir:" in out and "method: trajectory" in out
    else:
        assert "every_n_train_steps:" in out and "save_top_k: -1" in out  # the fit keeps its trajectory


def test_missing_checkpoint_folder_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["predict", "--config", twin_config("trajectory_sampler_sample"), "--model.init_args.checkpoint_dir",
              str(tmp_path / "none"), "--trainer.default_root_dir", str(tmp_path / "run"),
              "--data.init_args.data_dir", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no checkpoint folder" in err and "fix:" in err
