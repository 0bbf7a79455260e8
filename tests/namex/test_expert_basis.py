"""The expert-basis chain state (`chain_state: coefficients`) gives the weights-basis gradients with bounded memory."""
import ctypes
import gc

import pytest
import torch

from lit_iclr.core.moe import check_moe, tiny_model
from lit_iclr.namex.ffn import MergeOptions
from lit_iclr.namex.hf import _extend_metric, apply_merging
from lit_iclr.namex.merging import DomainVectors

from .test_checkpointing import grads

PROPAGATING = [dict(mode="ep_camex"), dict(mode="namex"), dict(mode="namex", alpha_mode="propagation"),
               dict(mode="namex", nash_every=2), dict(mode="namex", beta_abs=0.6),
               dict(mode="namex", beta_abs=0.9, beta_phase=0.4)]
CASES = [(v, None) for v in PROPAGATING] + [(v, False) for v in PROPAGATING] + [(PROPAGATING[-1], True)]


@pytest.mark.parametrize(("variant", "reentrant"), CASES,
                         ids=lambda v: "-".join(str(x) for x in v.values()) if isinstance(v, dict) else f"reentrant={v}")
def test_expert_basis_gradients_equal_the_weights_basis(variant, reentrant):
    """Every propagating variant, plain and under activation checkpointing, chunked, against the (U, P) state path."""
    ref, _ = grads(MergeOptions(segment=4, chain_state="weights", **variant), None)
    ckpt = None if reentrant is None else {"use_reentrant": reentrant}
    got, model = grads(MergeOptions(segment=4, chain_state="coefficients", chunk=3, **variant), ckpt)
    assert all(vars(b.module)["_namex_patch"].coefficients for b in check_moe(model))
    assert ref.keys() == got.keys()
    scale = max(g.abs().max() for g in ref.values())
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-5 * scale, msg=k)


def test_masks_need_the_weights_basis():
    model = tiny_model("qwen2_moe", num_hidden_layers=2)
    with pytest.raises(ValueError, match="ties"):
        apply_merging(model, MergeOptions(mode="namex", mask="ties", chain_state="coefficients"))
    blocks = apply_merging(tiny_model("qwen2_moe", num_hidden_layers=2), MergeOptions(mode="namex", mask="ties"))
    assert not vars(blocks[0].module)["_namex_patch"].coefficients  # auto picks the weights for a mask


def test_gram_in_the_expert_basis_equals_the_explicit_one():
    """tau_i . tau_j from coefficients and the basis metric vs the materialised vectors, in float64."""
    g = torch.Generator().manual_seed(0)
    banks = (torch.randn(3, 50, generator=g, dtype=torch.float64), torch.randn(4, 50, generator=g, dtype=torch.float64))
    metric = _extend_metric(_extend_metric(None, banks[:1]), banks)
    basis = torch.cat(banks)
    torch.testing.assert_close(metric, basis @ basis.T)
    coef = torch.randn(5, 7, generator=g, dtype=torch.float64)            # 5 units' bases over the 7 basis rows
    experts = torch.zeros(4, 7, dtype=torch.float64)
    experts[:, 3:] = torch.eye(4, dtype=torch.float64)                     # this layer's experts = the last 4 rows
    got = DomainVectors(experts, coef, metric=metric).gram()
    tau = banks[1].unsqueeze(0) - (coef @ basis).unsqueeze(1)              # (U, n, P)
    torch.testing.assert_close(got, tau @ tau.transpose(1, 2))


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]


def _heap_bytes() -> int:
    """Bytes in use in the C heap (glibc mallinfo2: small blocks + mmapped blocks), where CPU tensors live."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


def _kept_bytes(options: MergeOptions, seqs: tuple[int, ...]) -> list[int]:
    """Heap bytes that one training forward leaves alive for its backward (every kind of holder, checkpoints too)."""
    torch.manual_seed(0)
    model = tiny_model("qwen2_moe", num_hidden_layers=3).train()
    apply_merging(model, options)
    out = []
    for seq in seqs:
        ids = torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(1))
        model(ids, use_cache=False).logits.square().mean().backward()  # gradients and caches allocated once
        gc.collect()
        before = _heap_bytes()
        loss = model(ids, use_cache=False).logits.square().mean()
        out.append(_heap_bytes() - before)
        loss.backward()
    return out


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc's mallinfo2")
def test_expert_basis_memory_does_not_grow_with_merge_units():
    """From 8 to 32 units per sequence the weights basis keeps two (P,) states more per unit (the states of MoE layers
    0 and 1, read by 1 and 2); the expert basis keeps only coefficients more. Both grow by the same activations."""
    opts = dict(mode="namex", segment=2, chunk=4)
    w_small, w_big = _kept_bytes(MergeOptions(chain_state="weights", **opts), (16, 64))
    c_small, c_big = _kept_bytes(MergeOptions(chain_state="coefficients", **opts), (16, 64))
    P = 3 * 16 * 32  # tiny model: d 32, expert width 16
    states = 2 * (2 * 24) * P * 4  # 2 read states x (2 sequences x 24 more units) x P fp32
    assert (w_big - w_small) - (c_big - c_small) > 0.8 * states


@pytest.mark.parametrize("reentrant", [False, True])
def test_replayed_states_are_released_after_the_backward(reentrant):
    """Replays under activation checkpointing write the chain again; nothing of it may outlive the backward (it would
    hold every layer's state until the next forward, twice the merge state at the next step)."""
    _, model = grads(MergeOptions(mode="namex", segment=4, chain_state="weights"), {"use_reentrant": reentrant},
                     steps=1)
    chain = vars(check_moe(model)[0].module)["_namex_patch"].chain
    assert chain.states == {}
