"""SOOPER end to end through the CLI (tiny twin), the real configs parse, and the shield on the real system."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lit_iclr.sooper.envs import make_task
from lit_iclr.sooper.module import SOOPER
from tests.twin import fit_twin, metric_rows, print_config


@pytest.mark.parametrize("config", ["configs/sooper.yaml", "configs/sooper_cartpole.yaml"])
def test_real_config_parses(config, capsys):
    assert "lit_iclr.sooper.module.SOOPER" in print_config(config, capsys)


def test_twin_fits_collects_real_episodes_and_evaluates(tmp_path, capsys):
    # one validation pass after the real episodes, as configs/sooper.yaml has it (limit_val_batches: 1)
    cli = fit_twin("sooper", tmp_path, "--trainer.limit_val_batches", "1")
    model = cli.trainer.lightning_module
    assert bool(model.prior_ready) and int(model.real_steps) == 2 * 20
    assert len(model.replay["rewards"]) == 40 and len(model.imagined["reward"]) > 0
    rows = [r for r in metric_rows(tmp_path) if r.get("train/return")]
    assert len(rows) == 2
    for r in rows:
        assert 0.0 <= float(r["train/intervention_rate"]) <= 1.0 and float(r["speed/imagined_per_s"]) > 0
    # the logged return is the real episode's: -sum of goal distances, over 20 steps from about 2 m away
    assert -45 < float(rows[0]["train/return"]) < -20
    assert set(model.final) >= {"return", "cost", "violations", "intervention_rate"}
    val = [r for r in metric_rows(tmp_path) if r.get("val/return")]
    assert len(val) == 1
    v = val[0]
    assert abs(float(v["val/return"]) - model.final["return"]) < 1e-4 and float(v["val/budget"]) == model.hparams.budget
    # the prior baseline: pi_hat alone on the same held-out reset seed, recomputed here
    ep = model.run_episode(seed=10_000, deterministic=True, record=False, prior_only=True)
    assert abs(float(v["val/return_prior"]) - ep["return"]) < 1e-4
    # the trend of the real episodes' intervention rates (first / last min(5, episodes) episodes: here 2 and 2)
    rates = [float(r["train/intervention_rate"]) for r in rows]
    assert abs(float(v["val/intervention_rate_first"]) - np.mean(rates)) < 1e-6
    out = capsys.readouterr().out
    assert "headline: val/return" in out and "return_prior" in out and "val/budget = 5" in out
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert len(state["sooper_replay"]["rewards"]) == 40 and len(state["sooper_interventions"]) == 2
    # learned: the prior pi_hat (behaviour cloning of the safe episodes) fits their actions better than the same
    # config's untrained prior, errors computed here
    torch.manual_seed(0)
    fresh = SOOPER(**{k: v for k, v in model.hparams.items() if not k.startswith("_")})
    t = cli.datamodule.transitions
    safe = t["safe"].bool()
    s, a = t["observations"][safe], t["actions"][safe]
    with torch.no_grad():
        bc = [float(((net(s) - a) ** 2).mean()) for net in (model.prior, fresh.prior)]
    assert bc[0] < 0.9 * bc[1], bc  # 20 prior steps in the twin: 0.50 vs 0.60


def test_shield_hands_control_to_the_prior_when_the_budget_is_spent():
    model = SOOPER(obs_dim=4, action_dim=2, budget=1.0, actor_hidden=[8], critic_hidden=[8])
    obs = torch.zeros(4)
    with torch.no_grad():
        model.prior_cost.net.out.bias.fill_(0.3)  # Q_c = 0.3 everywhere (other weights are small but not zero)
        for layer in model.prior_cost.net.hidden:
            layer.weight.zero_()
        model.prior_cost.net.out.weight.zero_()
    a, intervened = model.act(obs, cum_cost=0.5, discount_t=1.0, deterministic=True)  # 0.5 + 0.3 < 1: pi acts
    assert not intervened and np.allclose(a, model.actor(obs[None], deterministic=True)[0][0].detach().numpy())
    a, intervened = model.act(obs, cum_cost=0.75, discount_t=1.0, deterministic=True)  # 1.05 >= 1: the prior acts
    assert intervened and np.allclose(a, model.prior(obs[None])[0].detach().numpy())
    a, intervened = model.act(obs, cum_cost=0.75, discount_t=0.5, deterministic=True)  # 0.75 + 0.15 < 1
    assert not intervened


def test_prior_alone_never_intervenes_and_follows_pi_hat():
    model = SOOPER(obs_dim=4, action_dim=2, learn=False, actor_hidden=[8], critic_hidden=[8])
    model.env = make_task("point_goal", max_steps=5)
    ep = model.run_episode(seed=0)
    assert ep["intervention_rate"] == 0.0 and ep["steps"] == 5
    torch.testing.assert_close(model.replay["actions"], model.prior(model.replay["observations"]))


def _constant_cost_data(n: int = 256) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    s = torch.rand(n, 4, generator=g)
    return {"observations": s, "actions": torch.rand(n, 2, generator=g) * 2 - 1, "next_observations": s,
            "rewards": torch.zeros(n), "costs": torch.ones(n), "masks": torch.ones(n), "safe": torch.ones(n)}


@pytest.mark.parametrize("target", ["per_head", "pessimistic"])
def test_offline_cost_critic_reaches_the_geometric_series(target):
    """Cost 1 every step forever: Q_c^{pi_hat} = 1 / (1 - gamma_c) = 2 for gamma_c = 0.5 (closed form of the series);
    the pessimistic target may only sit above it."""
    torch.manual_seed(0)
    model = SOOPER(obs_dim=4, action_dim=2, cost_discount=0.5, critic_hidden=[16], actor_hidden=[8], warm_start=False,
                   cost_fqe_target=target, prior_tau=0.2, lr_prior=1e-2, cost_kappa=1.0)
    data = _constant_cost_data()
    model.fit_prior(data, 150, 64)
    with torch.no_grad():
        q = model.prior_cost(data["observations"], model.prior(data["observations"])).mean(0)
    assert abs(float(q.mean()) - 2.0) < 0.2
    if target == "pessimistic":
        assert float(q.mean()) >= 1.95


def test_prior_cache_is_written_once_and_read_back(tmp_path):
    path = tmp_path / "prior.pt"
    kw = dict(obs_dim=4, action_dim=2, critic_hidden=[8], actor_hidden=[8], prior_steps=5, prior_path=str(path))
    torch.manual_seed(0)
    first = SOOPER(**kw)
    first.load_or_fit_prior(_constant_cost_data(), 32)
    assert path.exists() and bool(first.prior_ready)
    torch.manual_seed(1)  # different initial weights: only the file can make them equal
    second = SOOPER(**kw)
    second.load_or_fit_prior(_constant_cost_data(), 32)
    for name in SOOPER.PRIOR_NETS:
        for a, b in zip(getattr(first, name).state_dict().values(), getattr(second, name).state_dict().values(), strict=True):
            torch.testing.assert_close(a, b)
    # the online phase's generator is where it started in both: fitting the prior draws from a stream of its own, so a
    # benchmark's numbers do not depend on which of its runs fitted the shared prior (and which loaded it)
    assert torch.equal(first.gen.get_state(), second.gen.get_state())
    assert torch.equal(first.gen.get_state(), torch.Generator().manual_seed(0).get_state())



class CaptureAtTrainStart(Callback):
    """Keeps the dynamics ensemble's weights and the minibatch generator's state as training starts."""

    seen: dict = {}

    def on_train_start(self, trainer, pl_module):
        CaptureAtTrainStart.seen = {"model": {k: v.clone() for k, v in pl_module.model.state_dict().items()},
                                    "gen": pl_module.gen.get_state().clone()}


def test_a_resumed_fit_does_not_warm_the_dynamics_model_up_again(tmp_path):
    """Lightning calls on_fit_start before it restores the loops, so `global_step` read 0 there on every resume: the
    restored dynamics ensemble was trained another `model_pretrain_steps` on the offline data (and drew from the
    minibatch generator), and the resumed run drifted from one never stopped. A resume must start from the
    checkpoint's weights and generator state."""
    fit_twin("sooper", tmp_path, "--trainer.max_epochs", "1")
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    fit_twin("sooper", tmp_path, "--trainer.max_epochs", "2", "--ckpt_path", "last",
             "--trainer.callbacks+", json.dumps({"class_path": f"{__name__}.CaptureAtTrainStart"}))
    seen = CaptureAtTrainStart.seen
    for k, v in seen["model"].items():
        assert torch.equal(v, saved["state_dict"][f"model.{k}"]), k
    assert torch.equal(seen["gen"], saved["sooper_rng"]["torch"])
