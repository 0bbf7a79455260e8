"""LoRA hooks equal the merged layer; BiasNet's loss equals a per-position loop; BiasNet learns a rank rule."""
from __future__ import annotations

import torch
from torch import nn

from lit_iclr.juli.model import BiasNet, LoRAAdapters
from lit_iclr.juli.steering import biasnet_loss, steer_chooser


def _attached(model: nn.Module) -> LoRAAdapters:
    """Rank-2 adapters on `model`'s q_proj with a non-zero B (so the update shows), attached."""
    ad = LoRAAdapters(model, ("q_proj",), rank=2, alpha=4.0)
    nn.init.normal_(ad.adapters["q_proj"].B)
    ad.attach()
    return ad


def _merged(model: nn.Module, ad: LoRAAdapters, x: torch.Tensor) -> torch.Tensor:
    """q_proj(x) with the adapters' update merged into its weight: W + (alpha / r) B A, computed without the hooks."""
    return x @ ad.adapters["q_proj"].merged_weight(model["q_proj"].weight).T + model["q_proj"].bias


def test_lora_hook_equals_merged_weight_and_detaches_cleanly():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4))
    model = nn.ModuleDict({"q_proj": base[0], "out": base[2]})
    x = torch.randn(7, 6)
    before = model["q_proj"](x)
    ad = _attached(model)
    torch.testing.assert_close(model["q_proj"](x), _merged(model, ad, x))
    ad.enabled = False
    torch.testing.assert_close(model["q_proj"](x), before)
    ad.enabled = True
    ad.detach()
    torch.testing.assert_close(model["q_proj"](x), before)
    assert set(ad.state_dict()) == {"adapters.q_proj.A", "adapters.q_proj.B"}  # no base weights in checkpoints


def test_adapters_left_on_a_shared_model_by_a_fit_that_never_tore_down_are_replaced_not_added():
    # the process-wide cached base model: a fit that raised never detached its hooks; the next fit's adapters must be
    # the only update on the model (a resumed fit had both: its first step's loss 5.509 instead of 5.511)
    torch.manual_seed(0)
    model = nn.ModuleDict({"q_proj": nn.Linear(6, 5)})
    x = torch.randn(7, 6)
    before = model["q_proj"](x)
    _attached(model)  # never detached
    fresh = _attached(model)
    torch.testing.assert_close(model["q_proj"](x), _merged(model, fresh, x))
    assert len(model["q_proj"]._forward_hooks) == 1
    fresh.detach()
    torch.testing.assert_close(model["q_proj"](x), before)


def test_biasnet_loss_equals_a_loop_over_positions():
    torch.manual_seed(0)
    net = BiasNet(max_k=5, hidden=8, token_buckets=16, max_steps=8)
    for p in net.parameters():
        nn.init.normal_(p, std=0.3)
    ids = torch.rand(3, 4, 40).argsort(-1)[..., :5]  # distinct candidates, as an API returns
    lp = -torch.rand(3, 4, 5).sort(-1).values * 5
    target = torch.where(torch.rand(3, 4) < 0.7, ids[..., 2], torch.full((3, 4), 99))  # 99 never returned
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[2, 3] = False
    loss, cov = biasnet_loss(net, ids, lp, target, mask)
    terms, valid = [], 0
    for i in range(3):
        for t in range(4):
            if not mask[i, t]:
                continue
            hits = (ids[i, t] == target[i, t]).nonzero()
            if len(hits) == 0:
                continue
            valid += 1
            b = net(ids[i, t][None], lp[i, t][None], t)[0]
            terms.append(-torch.log_softmax(lp[i, t] + b, -1)[hits[0, 0]])
    torch.testing.assert_close(loss, torch.stack(terms).mean())
    torch.testing.assert_close(cov, torch.tensor(valid / int(mask.sum())))


def test_untrained_biasnet_is_greedy_and_training_learns_to_leave_the_top_candidate():
    torch.manual_seed(0)
    net = BiasNet(max_k=5, hidden=32, token_buckets=0, max_steps=4)
    ids = torch.randint(0, 100, (64, 3, 5))
    lp = -torch.rand(64, 3, 5).sort(-1).values * 3
    choose = steer_chooser(net)
    assert torch.equal(choose(0, ids[:, 0], lp[:, 0], None), ids[:, 0, 0])  # b = 0 at init: argmax lp
    target = ids[:, :, 2]  # the reply the client wants: always the third candidate
    mask = torch.ones(64, 3, dtype=torch.bool)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(150):
        loss, _ = biasnet_loss(net, ids, lp, target, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    picked = torch.stack([choose(t, ids[:, t], lp[:, t], None) for t in range(3)], 1)
    assert (picked == target).float().mean() > 0.95
