"""The compiled VGF update (`compile_update`) equals the eager one: losses, gradients and the updated weights."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.core import onednn_linear
from lit_iclr.vgf.module import VGF, polyak


def _model(**kw) -> VGF:
    torch.manual_seed(0)
    return VGF(obs_dim=3, action_dim=2, actor_hidden=[8], critic_hidden=[8], num_particles=3, bc_flow_steps=2,
               train_flow_steps=2, value_q_agg="mean", **kw)


def _batch(b: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"observations": torch.randn(b, 3, generator=g), "actions": torch.rand(b, 2, generator=g) * 2 - 1,
            "next_observations": torch.randn(b, 3, generator=g), "rewards": torch.randn(b, generator=g),
            "masks": torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0])}


def _updates(model: VGF, losses, steps: int = 2) -> list[dict[str, torch.Tensor]]:
    """`steps` full updates (as VGF.training_step, without a Trainer); returns each step's losses."""
    opt_a = torch.optim.Adam(model.policy.parameters(), lr=1e-2)
    opt_c = torch.optim.Adam(model.critic.parameters(), lr=1e-2)
    batch, outs = _batch(), []
    for k in range(steps):
        out = losses(batch, model.step_noise(5, torch.Generator().manual_seed(k)))
        opt_a.zero_grad()
        opt_c.zero_grad()
        (out["critic_loss"] + out["bc_loss"]).backward()
        opt_c.step()
        polyak(model.target_critic, model.critic, 0.5)
        opt_a.step()
        outs.append({k: v.detach() for k, v in out.items()})
    return outs


@pytest.mark.parametrize("amortized,matmul", [(False, "aten"), (True, "aten"), (False, "onednn"), (True, "onednn")])
def test_compiled_update_equals_eager(amortized, matmul, monkeypatch):
    """Traced by dynamo and AOTAutograd (forward and backward graphs) without a C++ build, so the test stays fast.
    `onednn`: every product of the compiled update through oneDNN, against the eager update with PyTorch's own."""
    if matmul == "onednn" and not onednn_linear.onednn_available():
        pytest.skip("this PyTorch build has no oneDNN")
    monkeypatch.setattr(onednn_linear, "MIN_MACS", 0)  # the test's networks are far below the size oneDNN takes
    eager, compiled = _model(amortized=amortized), _model(amortized=amortized, matmul=matmul)
    fn = torch.compile(compiled.update_losses, backend="aot_eager", fullgraph=True)  # fullgraph: no graph breaks
    for a, b in zip(_updates(eager, eager.update_losses), _updates(compiled, fn), strict=True):
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    for (name, a), b in zip(eager.state_dict().items(), compiled.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    moved = (eager.critic.net[0].weight - _model(amortized=amortized).critic.net[0].weight).abs().max()
    assert moved > 1e-4  # the updates did something, so the comparison can fail


def test_update_losses_equal_the_separately_drawn_eager_losses():
    """Noise drawn up front (step_noise) reproduces the TD target and the flow-matching loss drawn in place."""
    m, batch = _model(), _batch()
    out = m.update_losses(batch, m.step_noise(5, torch.Generator().manual_seed(7)))
    g = torch.Generator().manual_seed(7)
    target = m.td_target(batch, g)  # draws the particles' noise first, as step_noise does
    g = torch.Generator().manual_seed(7)
    torch.randn(5, 3, 2, generator=g)  # skip the particles' noise
    bc = m.policy.flow_matching_loss(batch["observations"], batch["actions"], g)
    qs = m.critic(batch["observations"], batch["actions"])
    torch.testing.assert_close(out["critic_loss"], (qs - target).pow(2).sum(0).mean())
    torch.testing.assert_close(out["bc_loss"], bc)


@pytest.mark.slow
@pytest.mark.parametrize("matmul", ["aten", "onednn"])
def test_inductor_compiled_update_equals_eager(matmul, monkeypatch):
    """The real C++ build of the update (tens of seconds to minutes on CPU); `onednn`: every product through oneDNN
    (an opaque custom op to inductor) against the eager update with PyTorch's own."""
    if matmul == "onednn" and not onednn_linear.onednn_available():
        pytest.skip("this PyTorch build has no oneDNN")
    monkeypatch.setattr(onednn_linear, "MIN_MACS", 0)
    eager, compiled = _model(), _model(matmul=matmul)
    a = _updates(eager, eager.update_losses)
    b = _updates(compiled, torch.compile(compiled.update_losses))
    for x, y in zip(a, b, strict=True):
        for k in x:
            torch.testing.assert_close(x[k], y[k], rtol=1e-4, atol=1e-5, msg=k)


def test_fit_with_compiled_update_and_optimizer_steps_equals_eager_fit(tmp_path, monkeypatch):
    """Through the Trainer: `compile_update` also compiles both Adam steps and the Polyak update as one function
    (the Trainer's optimizer steps are plain PyTorch calls here); weights and step counters equal the eager fit's."""
    from tests.vgf.test_module import fit

    base = ["--trainer.limit_val_batches", "0", "--data.init_args.steps_per_epoch", "3",
            "--model.init_args.amortized", "false"]
    eager = fit("tests/configs/vgf.yaml", tmp_path / "eager", *base)
    ordinary_steps = []  # updates that took `opt.step()` (not the compiled functional Adam)
    plain = VGF.apply_updates
    monkeypatch.setattr(VGF, "apply_updates", lambda self, *opts: (ordinary_steps.append(1), plain(self, *opts))[1])
    compiled = fit("tests/configs/vgf.yaml", tmp_path / "compiled", *base, "--model.init_args.compile_update", "true",
                   "--model.init_args.compile_options", '{"backend": "aot_eager"}')
    assert compiled.model._apply_fn is not None and eager.model._apply_fn is None
    assert len(ordinary_steps) == 1  # the first update makes Adam's state; the other 5 ran the compiled graph
    assert compiled.trainer.global_step == eager.trainer.global_step == 2 * int(eager.model.updates) == 12  # 2 per update
    for (name, a), b in zip(eager.model.state_dict().items(), compiled.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    for a, b in zip(eager.trainer.optimizers, compiled.trainer.optimizers, strict=True):  # Adam's moments too
        for sa, sb in zip(a.state.values(), b.state.values(), strict=True):
            for key in ("exp_avg", "exp_avg_sq", "step"):
                torch.testing.assert_close(sa[key], sb[key], rtol=1e-5, atol=1e-8, msg=key)
    initial = fit("tests/configs/vgf.yaml", tmp_path / "none", *base, "--trainer.max_steps", "0").model
    assert (initial.critic.net[0].weight - compiled.model.critic.net[0].weight).abs().max() > 1e-5  # it trained
