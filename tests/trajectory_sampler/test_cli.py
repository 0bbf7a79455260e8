"""Every config's tiny twin through the CLI (fit the predictor, then `predict` the sampler over its checkpoint folder),
and every real config parsed."""
from __future__ import annotations

import json

import pytest
import torch

from lit_iclr.cli import main
from tests.twin import fit_twin, metric_rows, print_config, twin_config

TASKS = ["trajectory_sampler", "trajectory_sampler_dna", "trajectory_sampler_modes", "trajectory_sampler_counterfactual"]


SMALL = ("--model.init_args.sampler_chains", "32", "--model.init_args.sampler_checkpoints", "3",
         "--model.init_args.sampler_steps", "3")  # the fit's own sampler comparison, kept tiny


def fit_then_sample(task, tmp_path, *extra, fit_extra=SMALL):
    fit_twin(task, tmp_path / "fit", *fit_extra)
    ckpts = sorted((tmp_path / "fit" / "checkpoints").glob("trajectory-*.ckpt"))
    assert len(ckpts) >= 3  # the trajectory, not just the final model
    fit_twin(f"{task}_sample", tmp_path / "sample", "--model.init_args.checkpoint_dir", str(tmp_path / "fit" / "checkpoints"),
             *extra, subcommand="predict")
    return json.loads((tmp_path / "sample" / "summary.json").read_text()), torch.load(
        tmp_path / "sample" / "samples.pt", weights_only=True)


# the twin trained long enough to learn its needle (150 steps, lr 1e-2), three checkpoints; a small in-fit comparison
LEARN = ("--trainer.max_steps", "150", "--checkpoint.every_n_train_steps", "50",
         "--model.init_args.optimizer.init_args.lr", "0.01", "--model.init_args.sampler_chains", "64",
         "--model.init_args.sampler_checkpoints", "5", "--model.init_args.sampler_steps", "6")


def test_boolean_twin_learns_and_samples_its_target(tmp_path, capsys):
    from lit_iclr.trajectory_sampler import BooleanLandscapeData, LandscapePredictor
    from lit_iclr.trajectory_sampler.headline import bits_index, tv_to
    from lit_iclr.trajectory_sampler.landscapes import all_binary
    from lit_iclr.trajectory_sampler.trajectory import load_trajectory

    fit_twin("trajectory_sampler", tmp_path / "fit", *LEARN)
    fit_out = capsys.readouterr().out
    fit_twin("trajectory_sampler_sample", tmp_path / "sample", "--model.init_args.checkpoint_dir",
             str(tmp_path / "fit" / "checkpoints"), "--model.init_args.steps_per_checkpoint", "6", subcommand="predict")
    summary = json.loads((tmp_path / "sample" / "summary.json").read_text())
    samples = torch.load(tmp_path / "sample" / "samples.pt", weights_only=True)
    assert summary["method"] == "trajectory" and summary["checkpoints"] == 3 and summary["chains"] == 32
    assert summary["evaluations_per_chain"] == 3 * 6 + 3  # K*m steps + one evaluation per stage switch
    x = samples["x"]
    assert x.shape == (32, 10) and set(x.unique().tolist()) <= {0.0, 1.0}
    # the predictor learned: its held-out MSE is far below a freshly initialised predictor's, computed here
    dm = BooleanLandscapeData(data_dir=str(tmp_path / "fit" / "data"), n_bits=10, needle_size=4, num_samples=300)
    dm.setup("fit")
    torch.manual_seed(0)
    fresh = LandscapePredictor(input_dim=10, hidden=16)
    with torch.no_grad():
        fresh_mse = float(((fresh(dm.x[dm.val_idx]) - dm.y[dm.val_idx]) ** 2).mean())
    last = {k: float(v) for r in metric_rows(tmp_path / "fit") for k, v in r.items() if v and k.startswith("val/")}
    assert last["val/mse"] < 0.5 * fresh_mse
    # the samplers sample the final model's target: exact pi ~ exp(f_final) over all 2^10 states, computed here
    _, models = load_trajectory(tmp_path / "fit" / "checkpoints")
    with torch.no_grad():
        pi = torch.softmax(models[-1](all_binary(10)).reshape(-1).double(), 0)
    uniform = torch.randint(0, 2, (64, 10), generator=torch.Generator().manual_seed(123)).float()
    tv_uniform = tv_to(bits_index(uniform), pi)
    assert tv_to(bits_index(x), pi) < tv_uniform - 0.15        # the predict run's chains moved toward the target
    assert last["val/sampler_tv_trajectory"] < tv_uniform - 0.15  # and so did the fit's own trajectory sampler
    f = dm.landscape()
    assert summary["needle_rate"] == pytest.approx(float(f.in_needle(x).float().mean()))
    assert summary["needle_rate"] > 4 * 2.0**-4               # 2^-4: a uniform chain's chance to sit in the needle
    # the fit's summary shows the method against its baselines, computed in the same run
    assert "headline: val/sampler_tv_trajectory" in fit_out and "final-model MCMC" in fit_out and "tempering" in fit_out
    for m in ("final", "temperature", "tempering"):
        assert 0 <= last[f"val/sampler_tv_{m}"] <= 1


def test_dna_twin_keeps_fixed_positions_and_climbs_the_true_affinity(tmp_path):
    from lit_iclr.trajectory_sampler import SequenceAffinityData

    summary, samples = fit_then_sample("trajectory_sampler_dna", tmp_path, "--model.init_args.method", "tempering",
                                       fit_extra=(*SMALL, "--trainer.max_steps", "150",
                                                  "--model.init_args.optimizer.init_args.lr", "0.01"))
    x = samples["x"]
    assert x.shape == (32, 12, 4) and torch.allclose(x.sum(-1), torch.ones(32, 12))
    dm = SequenceAffinityData(data_dir=str(tmp_path / "fit" / "data"), length=12, num_samples=300, pairs=4, num_chains=32)
    start = dm.chain_starts(torch.Generator().manual_seed(0))
    assert torch.equal(x[:, [0, 11]], start[:, [0, 11]])  # fixed positions never move
    assert summary["method"] == "tempering"
    f = dm.landscape()  # the exact affinity f*, read here from the generated data
    assert summary["true_score_mean"] == pytest.approx(float(f(x).mean()), rel=1e-5)
    assert summary["true_score_mean"] > float(f(start).mean()) + 0.5  # the designs beat their random starts


def _val_series(folder, key):
    return [float(r[key]) for r in metric_rows(folder) if r.get(key)]


# long enough for each twin's predictor to learn (the 30- and 6-step twins barely move their loss)
MODES_LEARN = ("--trainer.max_steps", "150", "--checkpoint.every_n_train_steps", "50",
               "--model.init_args.optimizer.init_args.lr", "0.01", *SMALL)
CF_LEARN = ("--trainer.max_steps", "42", "--checkpoint.every_n_train_steps", "14",
            "--model.init_args.optimizer.init_args.lr", "0.01")


def test_modes_twin_learns_and_runs_mala(tmp_path):
    summary, samples = fit_then_sample("trajectory_sampler_modes", tmp_path, "--model.init_args.smc", "true",
                                       fit_extra=MODES_LEARN)
    assert samples["x"].shape == (32, 2) and torch.isfinite(samples["x"]).all()
    assert 0 <= summary["modes_covered"] <= 8 and 0 <= summary["mode_tv"] <= 1
    mse = _val_series(tmp_path / "fit", "val/mse")
    assert len(mse) > 10 and mse[-1] < 0.3 * mse[0], mse  # the predictor learned the landscape (101 -> 14 here)


def test_counterfactual_twin_learns_and_respects_the_edit_budget(tmp_path):
    from lit_iclr.trajectory_sampler import FashionMNISTCounterfactualData
    from lit_iclr.trajectory_sampler.trajectory import load_trajectory

    summary, samples = fit_then_sample("trajectory_sampler_counterfactual", tmp_path, fit_extra=CF_LEARN)
    assert samples["x"].shape == (6, 784)  # 2 queries x 3 chains
    assert (samples["edits"] <= 5).all() and 0 <= summary["success_rate"] <= 1
    assert (samples["target"] == 7).all()
    ce = _val_series(tmp_path / "fit", "val/ce")
    assert len(ce) >= 2 and ce[-1] < ce[0] - 0.05, ce  # the classifier learned (2.30 -> 2.17 here)
    # the edits raised the final classifier's log-probability of the target class over the query images'
    dm = FashionMNISTCounterfactualData(max_train=256, val_size=128, num_queries=2)
    dm.setup("predict")
    _, models = load_trajectory(tmp_path / "fit" / "checkpoints")
    with torch.no_grad():
        ref = models[-1](dm.queries).log_softmax(-1)[:, 7]
        out = models[-1](samples["x"]).log_softmax(-1)[:, 7]
    assert float(out.mean()) > float(ref.mean()), (ref, out)


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
