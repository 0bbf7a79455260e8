"""VGF's baselines against independent computations: TD3+BC's state normalisation, FQL's losses, IQL's expectile and
advantage weights, and the D4RL reward normalisation of the official code."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from lit_iclr.core.offline_rl import episode_return_range
from lit_iclr.vgf.baselines import FQL, IQL, TD3BC
from lit_iclr.vgf.data import D4RLData
from lit_iclr.vgf.model import FlowPolicy


def test_episode_return_range_splits_at_terminals_timeouts_and_the_step_cap():
    r = np.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=np.float32)
    term = np.array([0, 1, 0, 0, 0, 0, 0, 0])
    tout = np.array([0, 0, 0, 1, 0, 0, 0, 0])
    # episodes: [1,2] (terminal), [3,4] (timeout), [5,6,7] (cap 3), [8] unfinished and left out
    assert episode_return_range(r, term, tout, max_episode_steps=3) == (3.0, 18.0)
    assert episode_return_range(r, term, None, max_episode_steps=1000) == (3.0, 3.0)


def _write_d4rl(path, rewards, timeouts):
    n = len(rewards)
    with h5py.File(path, "w") as f:
        f["observations"] = np.random.default_rng(0).normal(size=(n, 10)).astype(np.float32)
        f["actions"] = np.zeros((n, 2), np.float32)
        f["rewards"] = np.asarray(rewards, np.float32)
        f["terminals"] = np.zeros(n, bool)
        f["timeouts"] = np.asarray(timeouts, bool)


def test_d4rl_reward_normalisation_scales_by_1000_over_the_return_range(tmp_path):
    _write_d4rl(tmp_path / "x.hdf5", [-1, -1, -1, -4, -2, -3], [0, 0, 1, 0, 0, 1])  # returns -3 and -9
    dm = D4RLData(root=str(tmp_path / "x.hdf5"), ref_min_score=-10, ref_max_score=0, normalize_rewards=True)
    dm.setup("fit")
    assert dm.reward_normalizer == pytest.approx(1000 / 6)
    # rows kept: all but the last of each timed-out episode
    np.testing.assert_allclose(dm.transitions["rewards"].numpy(), np.array([-1, -1, -4, -2]) * 1000 / 6, rtol=1e-6)
    plain = D4RLData(root=str(tmp_path / "x.hdf5"), ref_min_score=-10, ref_max_score=0)
    plain.setup("fit")
    np.testing.assert_allclose(plain.transitions["rewards"].numpy(), [-1, -1, -4, -2])


def test_td3bc_normalises_states_with_the_dataset_statistics_when_acting():
    class DM:
        transitions = {"observations": torch.tensor([[0.0, 10.0], [2.0, 30.0], [4.0, 20.0]])}

    class T:
        datamodule = DM()

    m = TD3BC(obs_dim=2, action_dim=1, actor_hidden=[8], critic_hidden=[8])
    m._trainer = T()
    m.on_fit_start()
    obs = DM.transitions["observations"]
    torch.testing.assert_close(m.obs_mean, torch.tensor([2.0, 20.0]))
    torch.testing.assert_close(m.obs_std, torch.tensor([2.0 + 1e-3, 10.0 + 1e-3]))  # sample std, TD3+BC's eps
    a, _ = m.act_groups(obs, np.zeros(3, int), None)
    torch.testing.assert_close(a, m.actor((obs - obs.mean(0)) / (obs.std(0) + 1e-3)))


def test_fql_shares_vgf_flow_policy_and_distils_from_the_same_noise():
    torch.manual_seed(0)
    m = FQL(obs_dim=3, action_dim=2, actor_hidden=[8], critic_hidden=[8], bc_flow_steps=3)
    assert type(m.policy) is FlowPolicy
    obs, z = torch.randn(5, 3), torch.randn(5, 2)
    # the distillation target is the Euler-integrated flow from z: check against an explicit integration
    x = z.clone()
    for i in range(3):
        x = x + m.policy.velocity(obs, x, torch.full((5, 1), i / 3)) / 3
    torch.testing.assert_close(m.policy.sample(obs, 3, noise=z), x.clamp(-1, 1))
    a = m.one_step(obs, z)
    assert a.abs().max() <= 1.0


def test_iql_expectile_loss_minimiser_is_the_expectile():
    """Minimising E|tau - 1(u<0)| u^2 over a constant v gives the tau-expectile of the samples (closed-form check)."""
    q = torch.tensor([0.0, 1.0, 2.0, 10.0])
    tau = 0.7
    v = torch.zeros((), requires_grad=True)
    opt = torch.optim.LBFGS([v], max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-14)

    def closure():
        opt.zero_grad()
        u = q - v
        loss = ((tau - (u < 0).float()).abs() * u.pow(2)).mean()
        loss.backward()
        return loss

    opt.step(closure)
    # expectile e solves tau sum_{q>e} (q - e) = (1 - tau) sum_{q<e} (e - q)
    e = float(v)
    lhs = tau * float((q[q > e] - e).sum())
    rhs = (1 - tau) * float((e - q[q < e]).sum())
    assert lhs == pytest.approx(rhs, abs=1e-4)
    m = IQL(obs_dim=2, action_dim=1, actor_hidden=[8], critic_hidden=[8])
    obs, act = torch.randn(4, 2), torch.rand(4, 1) * 2 - 1
    mean, std = m.actor.mean(obs), m.actor.log_std.exp()
    ref = -0.5 * ((act - mean) / std) ** 2 - std.log() - 0.5 * np.log(2 * np.pi)
    torch.testing.assert_close(m.actor.log_prob(obs, act), ref.sum(-1))
