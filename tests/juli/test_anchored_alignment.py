"""The anchored alignment loss (`harness.anchored_reply_nll`, the `align_anchor` knob): its value against the
cross-entropy / entropy / KL decomposition computed position by position, and its minimiser on a free distribution."""
from __future__ import annotations

import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from lit_iclr.juli import chats
from lit_iclr.juli.batching import chat_batch, reply_logits
from lit_iclr.juli.harness import anchored_reply_nll, reply_nll
from lit_iclr.juli.model import LoRAAdapters

from .tiny import tiny_target


@pytest.fixture
def adapted():
    model, tok = tiny_target()
    ad = LoRAAdapters(model, ("q_proj", "v_proj"), rank=2, alpha=4.0)
    torch.manual_seed(1)
    for lora in ad.adapters.values():
        torch.nn.init.normal_(lora.B, std=0.5)  # a visible update, so adapted and base distributions differ
    ad.attach()
    records = chats.make_split(4, 2, "policy")
    batch = chat_batch(tok, [r["messages"][:-1] for r in records], [r["messages"][-1]["content"] for r in records])
    yield model, ad, batch
    ad.detach()


@pytest.mark.parametrize("anchor", [0.1, 0.3, 0.9])
def test_value_is_cross_entropy_plus_anchor_times_base_entropy_and_kl(adapted, anchor):
    """-sum_j q_j log p_j with q = (1 - a) onehot + a p_base equals (1 - a) CE + a (H(p_base) + KL(p_base || p))."""
    model, ad, batch = adapted
    got = anchored_reply_nll(model, ad, batch, anchor)
    assert ad.enabled  # restored after the base forward
    with torch.no_grad():
        adapted_logits = reply_logits(model, batch)
        ad.enabled = False
        base_logits = reply_logits(model, batch)
        ad.enabled = True
    want = []
    for b in range(batch.ids.shape[0]):
        terms = []
        for t in range(batch.reply_ids.shape[1]):
            if not batch.reply_mask[b, t]:
                continue
            p, base = Categorical(logits=adapted_logits[b, t]), Categorical(logits=base_logits[b, t])
            ce = -float(p.log_prob(batch.reply_ids[b, t]))
            terms.append((1 - anchor) * ce + anchor * float(base.entropy() + kl_divergence(base, p)))
        want.append(sum(terms) / len(terms))
    assert not torch.allclose(adapted_logits, base_logits, atol=1e-3)
    assert got.tolist() == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert torch.equal(anchored_reply_nll(model, ad, batch, 0.0), reply_nll(model, batch))


def test_gradient_reaches_only_the_adapters(adapted):
    model, ad, batch = adapted
    anchored_reply_nll(model, ad, batch, 0.3).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ad.parameters() if p.requires_grad)
    assert all(p.grad is None for p in model.parameters())


def test_minimiser_keeps_the_base_order_beneath_the_policy_reply():
    """Fit free logits z to the anchored target of one position: softmax(z) -> (1 - a) onehot + a p_base, so the
    base model's alternatives keep their order beneath the policy token; with a = 0 they have no order to keep."""
    base = torch.tensor([0.0, 0.5, 0.3, 0.15, 0.05])  # token 0 (the policy reply) has no base mass, like the decline
    z = torch.zeros(5, requires_grad=True)
    opt = torch.optim.Adam([z], lr=0.05)
    a = 0.3
    q = (1 - a) * torch.nn.functional.one_hot(torch.tensor(0), 5).float() + a * base
    for _ in range(3000):
        loss = -(q * z.log_softmax(-1)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    p = z.softmax(-1).detach()
    assert p.tolist() == pytest.approx(q.tolist(), abs=2e-3)
    assert p.argsort(descending=True).tolist() == [0, 1, 2, 3, 4]


def test_an_anchor_outside_0_1_is_refused():
    from lit_iclr.juli import JULI

    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="align_anchor must be in"):
            JULI(align_anchor=bad)
