"""SOOPER's learning cycle (`SOOPER.learn`, what each training step runs after its real episode, and what
`benchmarks/sooper_speed.py` times): every learner moves, and the faster update code is bit-equal to the plain
per-tensor PyTorch it replaced (Adam's loop over tensors, Polyak one `lerp_` per tensor, the critic's weight gradients
computed in the actor step)."""
from __future__ import annotations

import copy

import pytest
import torch

import lit_iclr.sooper.module as module
from lit_iclr.sooper.module import SOOPER

OBS, ACT, ROWS = 4, 2, 300


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py: as a fit sets `num_threads: 1`


def replay() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    s = torch.randn(ROWS, OBS, generator=g)
    return {"observations": s, "actions": torch.rand(ROWS, ACT, generator=g) * 2 - 1,
            "rewards": torch.randn(ROWS, generator=g), "costs": (torch.rand(ROWS, generator=g) < 0.2).float(),
            "next_observations": s + 0.1 * torch.randn(ROWS, OBS, generator=g),
            "cum_cost": 3 * torch.rand(ROWS, generator=g), "disc": torch.ones(ROWS)}


def small_model() -> SOOPER:
    torch.manual_seed(0)
    m = SOOPER(OBS, ACT, model_hidden=[16, 16], actor_hidden=[16], critic_hidden=[16, 16], num_rollouts=32, horizon=4,
               model_updates=3, sac_updates=3, prior_cost_updates=3, offline_in_model=False, num_threads=None)
    m.batch_size = 16
    m.__dict__["_direct_manual"] = True  # manual_backward = loss.backward, as in the platform's fit (core/direct.py)
    m.replay = replay()
    return m


def flat(net: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in net.parameters()])


def test_a_cycle_moves_every_learner_and_fills_the_imagined_buffer():
    m = small_model()
    before = {n: flat(getattr(m, n)) for n in ("model", "prior_cost", "actor", "critic")}
    logs = m.learn(m.configure_optimizers())
    for name, p in before.items():
        assert not torch.equal(p, flat(getattr(m, name))), name
    assert torch.equal(flat(m.prior), flat(small_model().prior))  # pi_hat is fitted offline only
    n = len(m.imagined["reward"])  # every rollout's first step, then the live ones
    assert 32 <= n <= 32 * 4
    assert int(m.imagined["done"].sum()) == round(logs["train/imagined_termination_rate"] * n)


def test_the_cycle_is_bit_equal_to_per_tensor_adam_and_polyak(monkeypatch):
    fast = small_model()
    opts = fast.configure_optimizers()
    for _ in range(2):
        fast.learn(opts)

    def per_tensor_polyak(target, source, tau):
        with torch.no_grad():
            for t, s in zip(target.parameters(), source.parameters(), strict=True):
                t.lerp_(s, tau)

    plain = small_model()
    monkeypatch.setattr(module, "polyak", per_tensor_polyak)
    opts = plain.configure_optimizers()
    for opt in opts:  # torch's default on CPU: the per-tensor loop
        for group in opt.param_groups:
            group["foreach"] = False
    for _ in range(2):
        plain.learn(opts)
    for (name, a), b in zip(fast.state_dict().items(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_actor_gradient_without_the_critics_weight_gradients_is_unchanged():
    m = small_model()
    obs = m.replay["observations"][:16]
    grads = []
    for frozen in (False, True):
        torch.manual_seed(3)
        m.actor.zero_grad()
        m.critic.zero_grad()
        a, logp = m.actor(obs)
        m.critic.requires_grad_(not frozen)
        (0.1 * logp - m.critic(obs, a).mean(0)).mean().backward()
        m.critic.requires_grad_(True)
        grads.append(torch.cat([p.grad.flatten() for p in m.actor.parameters()]))
        assert all((p.grad is None) == frozen for p in m.critic.parameters())
    assert torch.equal(grads[0], grads[1])


def test_polyak_is_the_convex_step_towards_the_source():
    torch.manual_seed(0)
    target, source = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    expected = [t.detach() + 0.1 * (s.detach() - t.detach())
                for t, s in zip(target.parameters(), source.parameters(), strict=True)]
    module.polyak(target, copy.deepcopy(source), 0.1)
    for p, e in zip(target.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e)
