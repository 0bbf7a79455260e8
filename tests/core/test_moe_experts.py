"""Grouped (sorted-token) variable-width experts equal the per-expert reference loop, values and gradients."""
import pytest
import torch

from lit_iclr.core.moe import VariableWidthExperts, tiny_model, unfuse_experts, width_classes


def _experts(widths, d=16, seed=0):
    torch.manual_seed(seed)
    ex = VariableWidthExperts(d, widths, "silu")
    for p in ex.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return ex


def _routing(T, E, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    return idx, torch.rand(T, k, generator=g)


@pytest.mark.parametrize("sync_free", [False, True], ids=["host-bounds", "device-offsets"])
@pytest.mark.parametrize("widths", [[16] * 4, [8, 24, 3, 0, 16, 40], [5, 9, 13, 17, 21, 25, 29, 33]])
def test_grouped_forward_equals_loop_values_and_gradients(widths, sync_free):
    ex = _experts(widths)
    ex.sync_free = sync_free  # both forms: host-side row slices (CPU default) and device-side offsets (accelerators)
    idx, w = _routing(37, len(widths), 2)
    x = torch.randn(37, 16, requires_grad=True)
    ref = ex.loop_forward(x, idx, w)
    gx_ref, *gp_ref = torch.autograd.grad(ref.square().sum(), [x, *ex.parameters()], allow_unused=True)
    out = ex.grouped_forward(x, idx, w)
    gx, *gp = torch.autograd.grad(out.square().sum(), [x, *ex.parameters()], allow_unused=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(gp, gp_ref, strict=True):
        if b is None:
            assert a is None or a.abs().sum() == 0
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_width_classes_cover_every_live_expert_once_and_bound_the_padding():
    widths = [5, 9, 13, 17, 0, 21, 25, 29, 33, 1408, 700]
    classes = width_classes(widths, align=8, max_groups=4)
    assert len(classes) <= 4
    seen = sorted(e for _, es in classes for e in es)
    assert seen == [e for e, w in enumerate(widths) if w > 0]
    for width, es in classes:
        assert width % 8 == 0 and all(widths[e] <= width for e in es)


def test_unfused_model_keeps_its_outputs_with_the_grouped_forward():
    model = tiny_model("qwen2_moe")
    ids = torch.randint(0, 128, (2, 10))
    with torch.no_grad():
        ref = model(ids).logits
        unfuse_experts(model)
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-5, atol=1e-5)
