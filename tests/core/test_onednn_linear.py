"""oneDNN linear layers against `F.linear` (MKL): values, the three gradients, torch.func.grad, and both traced by dynamo."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from lit_iclr.core import onednn_linear as od

pytestmark = pytest.mark.skipif(not od.onednn_available(), reason="this PyTorch build has no oneDNN")


@pytest.fixture
def every_size(monkeypatch):
    """oneDNN for every product, however small (the tests' matrices are below MIN_MACS)."""
    monkeypatch.setattr(od, "MIN_MACS", 0)


def _operands():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 7, generator=g, requires_grad=True)
    wide = torch.randn(4, 10, generator=g)
    w = wide[:, 2:9].clone().requires_grad_(True)  # a leaf; the product also gets column-slice views of it below
    b = torch.randn(4, generator=g, requires_grad=True)
    return x, w, b


def test_linear_values_and_all_three_gradients_equal_f_linear(every_size):
    x, w, b = _operands()
    for weight in (w, torch.cat([w, w], 1)[:, :7], w.t().contiguous().t()):  # row-major, a column slice, transposed
        y = od.linear(x, weight, b, "onednn")
        ref = F.linear(x, weight, b)
        torch.testing.assert_close(y, ref)
        g = torch.randn_like(ref)
        torch.testing.assert_close(torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(ref, (x, w, b), g))


def test_onednn_is_used_only_for_large_fp32_products(monkeypatch):
    calls = []
    apply = od._OneDNNLinear.apply
    monkeypatch.setattr(od._OneDNNLinear, "apply", lambda *a: calls.append(a[0].shape) or apply(*a))
    small, large = torch.randn(8, 16), torch.randn(256, 128)
    od.linear(small, torch.randn(16, 16), None, "onednn")
    od.linear(large, torch.randn(128, 128), None, "onednn")  # 256 x 128 x 128 = 4.2 M >= MIN_MACS
    od.linear(large.double(), torch.randn(128, 128, dtype=torch.float64), None, "onednn")
    od.linear(large, torch.randn(128, 128), None, "aten")
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the user's mixed precision wins: F.linear in bf16
        assert od.linear(large, torch.randn(128, 128), None, "onednn").dtype == torch.bfloat16
    assert calls == [(256, 128)]


def test_func_grad_through_onednn_equals_aten(every_size):
    x, w, b = _operands()

    def score(backend):
        return torch.func.grad(lambda a: torch.tanh(od.linear(a, w, b, backend)).pow(2).sum())(x.detach())

    torch.testing.assert_close(score("onednn"), score("aten"))


def test_traced_by_dynamo_forward_backward_and_func_grad(every_size):
    """fullgraph under `aot_eager`: the custom op and the autograd.Function trace without graph breaks, and the input
    gradient inside torch.func.grad is not dropped (dynamo reports needs_input_grad False for it while tracing)."""
    x, w, b = _operands()

    def loss(a, backend):
        return od.linear(torch.relu(od.linear(a, w, b, backend)), w[:, :4].t(), None, backend).pow(2).sum()

    compiled = torch.compile(lambda a: loss(a, "onednn"), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(torch.autograd.grad(compiled(x), (x, w, b)), torch.autograd.grad(loss(x, "aten"), (x, w, b)))
    grad = torch.compile(lambda a: torch.func.grad(lambda z: loss(z, "onednn"))(a), backend="aot_eager", fullgraph=True)
    want = torch.func.grad(lambda z: loss(z, "aten"))(x.detach())
    assert want.abs().max() > 0
    torch.testing.assert_close(grad(x.detach()), want)


def test_ensemble_linear_equals_each_member(every_size):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(2, 6, 5, generator=g), torch.randn(2, 5, 3, generator=g), torch.randn(2, 1, 3, generator=g)
    y = od.ensemble_linear(x, w, b, "onednn")
    for k in range(2):
        torch.testing.assert_close(y[k], x[k] @ w[k] + b[k])
    torch.testing.assert_close(od.ensemble_linear(x, w, None, "onednn"), torch.bmm(x, w))


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="one of .*'aten', 'onednn'"):
        od.check_backend("blas")


def test_auto_backend_is_mkl_on_intel_and_onednn_elsewhere(tmp_path, monkeypatch):
    intel, amd = tmp_path / "intel", tmp_path / "amd"
    intel.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n")
    amd.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert od.cpu_vendor(str(intel)) == "GenuineIntel" and od.cpu_vendor(str(amd)) == "AuthenticAMD"
    assert od.cpu_vendor(str(tmp_path / "absent")) == ""  # not Linux: no vendor, oneDNN as before
    for path, want in ((intel, "aten"), (amd, "onednn"), (tmp_path / "absent", "onednn")):
        monkeypatch.setattr(od, "cpu_vendor", lambda p=str(path), read=od.cpu_vendor: read(p))
        assert od.resolve_backend("auto") == want
        assert od.resolve_backend("aten") == "aten" and od.resolve_backend("onednn") == "onednn"  # forced: as given
    monkeypatch.setattr(od, "onednn_available", lambda: False)
    assert od.resolve_backend("auto") == "aten"  # a build without oneDNN: MKL wherever
    with pytest.raises(ValueError, match="'auto'"):
        od.resolve_backend("mkl")
