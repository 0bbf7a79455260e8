"""VGF end to end: the tiny twin configs through the CLI (both readers), the real configs parse, exact resume,
and the TD target against an explicit per-particle computation."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_iclr.cli import main
from lit_iclr.vgf.module import VGF

ROOT = Path(__file__).resolve().parents[2]


def fit(config: str, tmp_path: Path, *extra: str):
    return main(["fit", "--config", str(ROOT / config), "--trainer.default_root_dir", str(tmp_path / "run"),
                 "--data.init_args.data_dir", str(tmp_path / "data"), *extra])


@pytest.mark.parametrize("config", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("vgf*.yaml")))
def test_real_config_parses(config, capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(ROOT / config), "--print_config"])
    assert e.value.code == 0
    assert "lit_iclr.vgf." in capsys.readouterr().out


def test_ogbench_twin_fits_and_evaluates_every_budget(tmp_path):
    cli = fit("tests/configs/vgf_cube.yaml", tmp_path)
    m = cli.trainer.callback_metrics
    assert cli.model.hparams.obs_dim == 28 and cli.model.hparams.action_dim == 5  # linked from the data
    assert int(cli.model.updates) == 4
    for name in ("L0", "L2"):
        assert 0.0 <= float(m[f"val/success_{name}"]) <= 100.0
        assert float(m[f"val/return_{name}"]) <= 0.0  # OGBench single-task rewards are <= 0
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
    assert list((tmp_path / "data").glob("ogbench-cube-single-play-*/cube-single-play-v0.npz"))


def test_d4rl_twin_fits_a_vgf_with_amortised_gradients(tmp_path):
    cli = fit("tests/configs/vgf.yaml", tmp_path)
    m = cli.trainer.callback_metrics
    assert cli.model.eval_groups() == ["bc", "L0", "L1"] and torch.isfinite(m["val/score_bc"])
    assert cli.model.action_grad is not None and "train/grad_loss" in m
    assert cli.model.hparams.obs_dim == 10 and cli.model.hparams.action_dim == 2
    assert torch.isfinite(m["val/score_L1"])
    assert len(cli.trainer.optimizers) == 3


def test_resume_mid_epoch_equals_uninterrupted(tmp_path):
    """Pre-empted after 3 gradient steps (mid-epoch; 2 optimizers -> global_step 6), resumed: equals a straight run."""
    import tests.core.toy as toy  # CrashAtStep: simulates the pre-emption

    base = ["--trainer.limit_val_batches", "0", "--data.init_args.steps_per_epoch", "4",
            "--model.init_args.amortized", "false"]
    full = fit("tests/configs/vgf.yaml", tmp_path / "full", *base)
    crash = '{"class_path": "tests.core.toy.CrashAtStep", "init_args": {"step": 6}}'
    with pytest.raises(toy.Crash):
        fit("tests/configs/vgf.yaml", tmp_path / "part", *base, "--trainer.callbacks+", crash,
            "--checkpoint.every_n_train_steps", "1")
    ckpt = tmp_path / "part" / "run" / "checkpoints" / "last.ckpt"
    assert int(torch.load(ckpt, weights_only=True)["state_dict"]["updates"]) == 3
    resumed = fit("tests/configs/vgf.yaml", tmp_path / "part", *base, "--ckpt_path", str(ckpt))
    assert int(resumed.model.updates) == int(full.model.updates) == 8
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    fresh = fit("tests/configs/vgf.yaml", tmp_path / "other", *base, "--model.init_args.seed", "1")
    pairs = zip(full.model.state_dict().values(), fresh.model.state_dict().values(), strict=True)
    moved = max((a - b).abs().max().item() for a, b in pairs if a.is_floating_point())
    assert moved > 1e-5  # the comparison can fail: another noise stream gives other weights


def test_td_target_is_reward_plus_discounted_mean_of_min_target_q():
    torch.manual_seed(0)
    m = VGF(obs_dim=3, action_dim=2, actor_hidden=[8], critic_hidden=[8], num_particles=4, train_flow_steps=2,
            bc_flow_steps=2, discount=0.9, value_q_agg="min")
    with torch.no_grad():
        for p in m.target_critic.parameters():
            p.add_(0.1 * torch.randn_like(p))  # target differs from the online critic
    batch = {"next_observations": torch.randn(5, 3), "rewards": torch.randn(5), "masks": torch.tensor([1., 0, 1, 1, 0])}
    y = m.td_target(batch, torch.Generator().manual_seed(1))
    obs_rep, x0 = m.reference_particles(batch["next_observations"], torch.Generator().manual_seed(1))
    x, _ = m.move(obs_rep, x0, 2)
    expect = torch.zeros(5)
    for b in range(5):
        vals = [min(m.target_critic(batch["next_observations"][b], x[b, j])[k].item() for k in range(2))
                for j in range(4)]
        expect[b] = batch["rewards"][b] + 0.9 * batch["masks"][b] * sum(vals) / 4
    torch.testing.assert_close(y, expect, rtol=1e-5, atol=1e-5)


def test_acting_budget_zero_is_best_of_n_and_budgets_share_one_transport():
    torch.manual_seed(0)
    m = VGF(obs_dim=3, action_dim=2, actor_hidden=[8], critic_hidden=[8], num_particles=5, bc_flow_steps=2)
    obs = torch.randn(4, 3)
    out = m.act(obs, budgets=(0, 2), generator=torch.Generator().manual_seed(0))
    obs_rep, x0 = m.reference_particles(obs, torch.Generator().manual_seed(0))
    q0 = m.critic.value(obs_rep, x0, m.hparams.value_q_agg)
    torch.testing.assert_close(out[0][0], x0[torch.arange(4), q0.argmax(-1)])
    x2, _ = m.move(obs_rep, x0, 2)
    q2 = m.critic.value(obs_rep, x2, m.hparams.value_q_agg)
    torch.testing.assert_close(out[2][1], q2.max(-1).values)


def test_td3bc_baseline_twin_fits_and_reports_its_policy(tmp_path):
    cli = fit("tests/configs/vgf_td3bc.yaml", tmp_path)
    m = cli.trainer.callback_metrics
    assert int(cli.model.updates) == 4 and torch.isfinite(m["val/score_pi"])
    # the actor's target moved toward the actor only on actor steps (policy_freq = 2): 2 of 4 updates
    assert not torch.equal(cli.model.actor.net[0].weight, cli.model.target_actor.net[0].weight)


def test_evaluation_policy_names_parse():
    from lit_iclr.vgf.module import parse_policy

    assert parse_policy("L3") == ("flow", 3) and parse_policy("ascent10") == ("ascent", 10)
    assert parse_policy("bc") == ("bc", 0)
    with pytest.raises(ValueError, match="unknown evaluation policy"):
        parse_policy("L")


@pytest.mark.parametrize("name", ["fql", "iql"])
def test_fql_and_iql_baseline_twins_fit_and_report_their_policy(name, tmp_path):
    cli = fit(f"tests/configs/vgf_{name}.yaml", tmp_path)
    m = cli.trainer.callback_metrics
    assert int(cli.model.updates) == 4 and torch.isfinite(m["val/score_pi"])
    assert not torch.equal(cli.model.critic.net[0].weight, cli.model.target_critic.net[0].weight)


def test_updates_per_batch_gives_the_same_run_with_fewer_trainer_batches(tmp_path):
    """Four gradient steps per Trainer batch: the same updates in the same order (weights, Adam's state, global_step),
    and the logged training metrics are the means over all the updates of the logging window."""
    base = ["--trainer.limit_val_batches", "0", "--data.init_args.steps_per_epoch", "8", "--trainer.max_epochs", "1",
            "--model.init_args.amortized", "false", "--trainer.log_every_n_steps", "2"]
    single = fit("tests/configs/vgf.yaml", tmp_path / "single", *base)
    grouped = fit("tests/configs/vgf.yaml", tmp_path / "grouped", *base, "--data.init_args.updates_per_batch", "4")
    assert int(grouped.model.updates) == int(single.model.updates) == 8
    assert grouped.trainer.global_step == single.trainer.global_step == 16  # 2 optimizer steps per update
    assert grouped.trainer.fit_loop.epoch_loop.batch_progress.total.completed == 2  # 8 updates in 2 Trainer batches
    for (name, a), b in zip(single.model.state_dict().items(), grouped.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    for a, b in zip(single.trainer.optimizers, grouped.trainer.optimizers, strict=True):
        for sa, sb in zip(a.state.values(), b.state.values(), strict=True):
            torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], rtol=0, atol=1e-9)
    # log_every_n_steps counts Trainer batches: the grouped run logs once (2nd batch), the mean of all 8 updates; the
    # single run logs every 2nd update, the mean of each pair, so the grouped value is the mean of the single run's four
    single_log, grouped_log = _logged(tmp_path / "single", "train/critic_loss"), _logged(tmp_path / "grouped",
                                                                                       "train/critic_loss")
    assert len(single_log) == 4 and len(grouped_log) == 1
    assert grouped_log[0] == pytest.approx(sum(single_log) / 4, rel=1e-5)


def _logged(run: Path, key: str) -> list[float]:
    from tests.twin import metric_rows

    (csv_file,) = run.rglob("metrics.csv")
    return [float(r[key]) for r in metric_rows(csv_file.parent) if r.get(key)]


def test_num_threads_is_set_at_setup_and_checked():
    before = torch.get_num_threads()
    want = 2 if before == 1 else 1
    try:
        model = VGF(obs_dim=3, action_dim=2, actor_hidden=[8], critic_hidden=[8], num_threads=want)
        model.setup("fit")
        assert torch.get_num_threads() == want
        VGF(obs_dim=3, action_dim=2, actor_hidden=[8], critic_hidden=[8]).setup("fit")  # null: left as it is
        assert torch.get_num_threads() == want
        model.teardown("fit")
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
    for bad in (0, True):
        with pytest.raises(ValueError, match="num_threads"):
            VGF(obs_dim=3, action_dim=2, num_threads=bad)


def test_matmul_auto_builds_the_networks_on_the_processor_s_library(monkeypatch):
    from lit_iclr.core import onednn_linear

    monkeypatch.setattr(onednn_linear, "onednn_available", lambda: True)
    for vendor, want in (("GenuineIntel", "aten"), ("AuthenticAMD", "onednn")):
        monkeypatch.setattr(onednn_linear, "cpu_vendor", lambda v=vendor: v)
        m = VGF(obs_dim=3, action_dim=2, actor_hidden=[8], critic_hidden=[8], matmul="auto")
        assert m.policy.matmul == want and m.critic.net[0].matmul == want and m.target_critic.net[0].matmul == want
        assert m.hparams.matmul == "auto"  # saved as asked: a checkpoint resolves it again on the machine that loads it
