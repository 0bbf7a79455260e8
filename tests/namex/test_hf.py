"""Merging inside Hugging Face MoE blocks (tiny random Qwen2-MoE and Mixtral), checked against by-hand SwiGLU merges."""
import pytest
import torch
import torch.nn.functional as F

from lit_iclr.core.moe import moe_blocks, tiny_model
from lit_iclr.namex.ffn import MergeOptions
from lit_iclr.namex.hf import apply_merging, remove_merging

ARCHS = ["qwen2_moe", "mixtral"]


def swiglu(x, gate, up, down):
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def shared_part(block, x):
    if not block.shared:
        return torch.zeros_like(x)
    out = sum(m(x) for m in block.shared)
    return torch.sigmoid(block.shared_gate(x)) * out if block.shared_gate is not None else out


@pytest.mark.parametrize("arch", ARCHS)
def test_gamma_zero_gives_the_mean_expert_plus_shared(arch):
    model = tiny_model(arch)
    apply_merging(model, MergeOptions(mode="namex", gamma=0.0, segment=4, beta_abs=0.9, beta_phase=0.4))
    b = moe_blocks(model)[0]
    x = torch.randn(2, 8, b.hidden_size)
    w = b.stacked()
    ref = swiglu(x, w.gate.mean(0), w.up.mean(0), w.down.mean(0)) + shared_part(b, x)
    torch.testing.assert_close(b.module(x), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_smear_segment_merge_by_hand(arch):
    model = tiny_model(arch)
    apply_merging(model, MergeOptions(mode="smear", segment=4))
    b = moe_blocks(model)[0]
    x = torch.randn(2, 8, b.hidden_size)
    out = b.module(x)
    w = b.stacked()
    for i in range(2):
        for j, prev in ((0, torch.zeros(b.hidden_size)), (1, x[i, :4].mean(0))):  # segment j routed on segment j-1
            s = torch.softmax(prev @ b.router.weight.T, -1)
            merged = [torch.einsum("e,e...->...", s, t) for t in (w.gate, w.up, w.down)]
            seg = x[i, 4 * j: 4 * j + 4]
            torch.testing.assert_close(out[i, 4 * j: 4 * j + 4], swiglu(seg, *merged) + shared_part(b, seg),
                                       rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_merged_model_stays_causal_with_ragged_lengths(arch):
    model = tiny_model(arch)
    apply_merging(model, MergeOptions(mode="namex", segment=4, beta_abs=0.9, beta_phase=0.4))
    ids = torch.randint(0, 128, (2, 11))  # 11 tokens: not a multiple of the segment (trailing pad path)
    other = ids.clone()
    other[:, 8:] = (other[:, 8:] + 1) % 128
    with torch.no_grad():
        a, b = model(ids).logits, model(other).logits
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


@pytest.mark.parametrize("arch", ARCHS)
def test_fine_tune_gradients_reach_experts_and_router_and_removal_restores(arch):
    model = tiny_model(arch)
    ids = torch.randint(0, 128, (2, 8))
    with torch.no_grad():
        ref = model(ids).logits
    keys = set(model.state_dict())
    apply_merging(model, MergeOptions(mode="namex", segment=4, beta_abs=0.9, beta_phase=0.4))
    assert set(model.state_dict()) == keys  # checkpoints stay Hugging Face checkpoints
    model(ids).logits.square().mean().backward()
    b = moe_blocks(model)[-1]
    grads = [p.grad for p in b.experts.parameters()] + [b.router.weight.grad]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    remove_merging(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref)


def test_dense_or_smoe_modes_are_refused():
    with pytest.raises(ValueError, match="supports modes"):
        apply_merging(tiny_model("mixtral"), MergeOptions(mode="smoe"))


def test_deepseek_v3_merge_weights_follow_its_sigmoid_router_not_a_softmax():
    from lit_iclr.namex.hf import router_gates

    model = tiny_model("deepseek_v3")
    b = moe_blocks(model)[0]
    with torch.no_grad():
        b.router.e_score_correction_bias.copy_(torch.tensor([0.0, 5.0, 0.0, 0.0]))  # forces expert 1 into the top-k
    u = torch.randn(6, b.hidden_size)
    s = torch.sigmoid(u @ b.router.weight.T.float())
    torch.testing.assert_close(router_gates(b, u, 4), s / s.sum(-1, keepdim=True))
    two = router_gates(b, u, 2)
    chosen = (s + b.router.e_score_correction_bias).topk(2, -1).indices
    want = torch.zeros_like(s).scatter(-1, chosen, s.gather(-1, chosen))
    torch.testing.assert_close(two, want / want.sum(-1, keepdim=True))
    assert (two[:, 1] > 0).all()
    assert not torch.allclose(router_gates(b, u, 4), torch.softmax(u @ b.router.weight.T, -1))
