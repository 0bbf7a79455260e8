"""ReIMTS under DDP: every parameter is in the loss's graph, and 2 CPU processes x batch/2 take the same optimiser
steps as 1 process x batch."""
import pytest
import torch
from torch import nn

from lit_iclr.reimts import model as reimts_model
from lit_iclr.reimts.model import ReIMTS, Resampling
from lit_iclr.reimts.module import masked_errors
from tests.ddp_steps import fit_steps, max_abs_diff

from .test_model import queries
from .test_split import random_batch


def whole_levels(name, n_vars, n_levels, fusion, **kw):
    """Every level's backbone whole, as before: the coarse levels' forecast parts get no gradient."""
    return nn.ModuleList(reimts_model.make_backbone(name, n_vars, fusion and lvl > 0, **kw) for lvl in range(n_levels))


@pytest.mark.parametrize("backbone", ["grafiti", "mtan"])
@pytest.mark.parametrize("kind", ["reimts", "reimts_nofusion", "resampling"])
def test_every_parameter_gets_a_gradient_and_the_forecast_is_unchanged(backbone, kind, monkeypatch):
    """DDP refuses parameters outside the loss's graph; the coarse levels keep only what feeds the finest forecast,
    and forecast and gradients equal those of the model whose levels are whole (same seed, same kept weights)."""
    x, mask, t = random_batch(B=4, V=3)
    q_time, q_mask = queries(4, 3)
    kw = {"d_model": 8, "n_layers": 2, "n_heads": 2} if backbone == "grafiti" else {"d_model": 8, "n_ref": 4}

    def build():
        torch.manual_seed(0)
        if kind == "resampling":
            return Resampling(backbone, 3, [12.0, 4.0], 39.0, 48.0, backbone_kwargs=kw)
        return ReIMTS(backbone, 3, [39.0, 24.0, 12.0], 36.0, 48.0, fusion=kind == "reimts", backbone_kwargs=kw,
                      align="end")

    def loss_and_grads(m):
        for horizon_only in (True, False):
            out = m(x, mask, t, q_time, q_mask, horizon_only=horizon_only)
            se, _, n = masked_errors(out["pred_all"], y.unsqueeze(1), q_mask.unsqueeze(1).expand_as(out["pred_all"]))
            (se / n).backward()
        return out["pred"].detach(), {k: p.grad for k, p in m.named_parameters()}

    y = torch.randn(4, 3, 3)
    pred, grads = loss_and_grads(build())
    missing = [k for k, g in grads.items() if g is None]
    assert not missing, missing
    monkeypatch.setattr(reimts_model, "make_levels", whole_levels)
    whole_pred, whole_grads = loss_and_grads(build())
    assert set(grads) < set(whole_grads)  # the whole model has parameters the loss never reaches
    assert any(g is None for g in whole_grads.values())
    torch.testing.assert_close(pred, whole_pred, rtol=0, atol=0)
    for k, g in grads.items():
        torch.testing.assert_close(g, whole_grads[k], rtol=0, atol=0)


SGD = ["--model.init_args.optimizer", "torch.optim.SGD", "--model.init_args.optimizer.init_args.lr", "0.1"]


@pytest.mark.slow  # 3 CLI runs, one of them with 2 processes: about 2 minutes on 2 cores
def test_two_processes_step_as_one_with_the_global_batch(tmp_path):
    # 2 steps: DDP finds parameters outside the loss's graph only when the second step starts (the coarse levels'
    # forecast heads did that before); SGD: parameter differences are lr x gradient differences
    ddp = fit_steps(tmp_path / "ddp", "reimts", 2, 8, *SGD, steps=2)
    one = fit_steps(tmp_path / "one", "reimts", 1, 16, *SGD, steps=2)
    half = fit_steps(tmp_path / "half", "reimts", 1, 8, *SGD, steps=2)  # rank 0's batches alone
    diff, where = max_abs_diff(ddp, one)
    assert diff < 1e-6, (diff, where)
    # the all-reduce mattered: rank 0's share alone moves the parameters elsewhere
    assert max_abs_diff(ddp, half)[0] > 1e-3
