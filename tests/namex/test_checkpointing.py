"""Activation checkpointing and chunked merges leave NAMEx's Hugging Face gradients unchanged (every merging variant)."""
import pytest
import torch

from lit_iclr.core.moe import tiny_model
from lit_iclr.namex.ffn import MergeOptions
from lit_iclr.namex.hf import apply_merging, remove_merging
from lit_iclr.namex.merging import MERGE_MODES

VARIANTS = [dict(mode=m) for m in MERGE_MODES] + [
    dict(mode="namex", alpha_mode="propagation"), dict(mode="namex", mask="ties"), dict(mode="namex", mask="dare"),
    dict(mode="namex", nash_every=2)]


def grads(options: MergeOptions, checkpointing: dict | None, arch: str = "qwen2_moe", steps: int = 2):
    torch.manual_seed(0)
    model = tiny_model(arch, num_hidden_layers=3).train()
    apply_merging(model, options)
    if checkpointing is not None:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpointing)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):  # two steps: the Nash refresh schedule (nash_every=2) must not drift under replays
        model.zero_grad()
        torch.manual_seed(2)  # DARE masks
        model(ids).logits.float().square().mean().backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, model


CASES = [(v, False) for v in VARIANTS] + [(dict(mode=m), True) for m in ("ep_camex", "namex")]


@pytest.mark.parametrize(("variant", "reentrant"), CASES,
                         ids=lambda v: "-".join(str(x) for x in v.values()) if isinstance(v, dict) else f"reentrant={v}")
def test_checkpointed_gradients_equal_plain_ones(variant, reentrant):
    opts = MergeOptions(segment=4, beta_abs=0.9, beta_phase=0.4, **variant)
    ref, _ = grads(opts, None)
    got, _ = grads(opts, {"use_reentrant": reentrant})
    assert ref.keys() == got.keys()
    scale = max(g.abs().max() for g in ref.values())
    assert scale > 0
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6 * scale, msg=k)


def test_gradients_reach_earlier_layers_through_the_propagated_state():
    """The momentum carries layer 0's merged expert into layer 2: a loss on layer 2's output moves layer 0's experts
    only through the chain when attention and residual paths are cut. Here: gradients with and without the chain
    differ, so the chain's gradient is not silently dropped by the checkpoint."""
    opts = MergeOptions(mode="namex", segment=4, beta_abs=0.9, beta_phase=0.4)
    with_chain, _ = grads(opts, {"use_reentrant": True})
    no_prop, _ = grads(MergeOptions(mode="camex", segment=4), {"use_reentrant": True})
    key = next(k for k in with_chain if "layers.0.mlp.experts" in k)
    assert not torch.allclose(with_chain[key], no_prop[key])


@pytest.mark.parametrize("mode", ["camex", "namex"])
def test_chunked_merge_equals_whole_merge(mode):
    opts = dict(mode=mode, segment=4, beta_abs=0.9, beta_phase=0.4)
    ref, model = grads(MergeOptions(**opts), None, steps=1)
    got, _ = grads(MergeOptions(chunk=3, **opts), None, steps=1)  # 8 units in chunks of 3, 3, 2
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-7, msg=k)
    remove_merging(model)
    assert type(model.model.layers[0]).__name__ == "Qwen2MoeDecoderLayer"  # the layer class is restored
