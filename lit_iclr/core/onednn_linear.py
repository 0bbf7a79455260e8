"""Linear layers whose fp32 CPU products run through oneDNN (PyTorch's bundled `mkldnn`) instead of MKL's sgemm.

PyTorch sends an fp32 `F.linear` / `mm` / `bmm` on the CPU to MKL. On AMD EPYC processors MKL's sgemm runs at about
half the speed of oneDNN's, which ships in the same PyTorch build (one core, 1024 x 128 x 128: MKL 330-355 us, oneDNN
160-170 us, XLA 160 us; 2560 x 512 x 512: 13.6 ms against 6.1 ms; the three products of a layer's forward and
backward alike). `linear(x, w, b, backend="onednn")` computes the same y = x W^T + b (the same products, summed in
oneDNN's order) with all three products in oneDNN:

    forward   y   = x W^T + b           oneDNN linear(x, W)
    backward  g_x = g W                 oneDNN linear(g, W^T)      (a transposed view, no copy)
              g_W = g^T x               oneDNN linear(g^T, x^T)    (views)
              g_b = sum g

A oneDNN call has a fixed cost of about 17 us (primitive lookup; MKL's: 1 us), so products below `MIN_MACS`
multiply-adds (M x K x N) stay on `F.linear`: only the large ones gain (1024 x 128 x 128: 16.8 M).

`auto` picks by processor: `aten` on Intel CPUs, where MKL is Intel's own library (on an Intel Xeon with AVX-512 the
compiled VGF update at its default size took 0.81x [0.78, 0.84] of its CPU time with oneDNN: seeds/vgf.md), `onednn`
elsewhere when the build has it (AMD EPYC: about 2x MKL, above).

Under `torch.compile` the product is an opaque custom op (inductor lowers `mkldnn._linear_pointwise` only for frozen,
constant weights) and the autograd.Function traces into the compiled forward and backward, `torch.func.grad`
included. `backend="aten"` (and any input that is not fp32 on the CPU) is plain `F.linear`.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

__all__ = ["BACKENDS", "check_backend", "cpu_vendor", "ensemble_linear", "linear", "onednn_available", "resolve_backend"]

BACKENDS = ("aten", "onednn", "auto")
MIN_MACS = 4_000_000  # below this M x K x N, oneDNN's fixed cost eats its speed (128 x 128 x 128: MKL 44 us, oneDNN 36)


def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's linear (x86 and aarch64 CPU builds do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def check_backend(backend: str) -> str:
    """The backend name, or a ValueError naming the choices (and why oneDNN is not there)."""
    if backend not in BACKENDS:
        raise ValueError(f"matmul backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "onednn" and not onednn_available():
        raise ValueError("matmul backend 'onednn' needs a PyTorch build with oneDNN (mkldnn); this one has none: "
                         "use 'aten'")
    return backend


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The processor's vendor id ("GenuineIntel", "AuthenticAMD", ...); "" where it cannot be read (not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def resolve_backend(backend: str) -> str:
    """`aten` or `onednn` for `backend` (checked): `auto` is `aten` on Intel CPUs (MKL's own), `onednn` elsewhere where
    the build has it, else `aten`."""
    backend = check_backend(backend)
    if backend != "auto":
        return backend
    return "onednn" if cpu_vendor() != "GenuineIntel" and onednn_available() else "aten"


@torch.library.custom_op("lit_iclr::onednn_linear", mutates_args=())
def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x `[M, K]` W^T (+ b) with W `[N, K]`, by oneDNN; an opaque op to inductor. Row-major and transposed operands
    are used in place; any other layout (a column slice of a weight) is copied first: oneDNN runs those 50-100x
    slower (18 ms instead of 0.03 ms for a 1024 x 6 x 128 product with the weight a slice of a wider one)."""
    return torch.ops.mkldnn._linear_pointwise(_dense(x), _dense(weight), bias, "none", [], "")


def _dense(m: torch.Tensor) -> torch.Tensor:
    return m if m.is_contiguous() or m.t().is_contiguous() else m.contiguous()


@_product.register_fake
def _product_shape(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return _product(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # a separate setup_context: torch.func transforms need it
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        # while tracing, dynamo can report needs_input_grad False for an input that `torch.func.grad` differentiates
        # (silently zero gradients), so a compiled graph computes every gradient and inductor drops the unused ones
        need = (True, True, True) if torch.compiler.is_compiling() else ctx.needs_input_grad
        with torch.no_grad():  # the custom op's own (absent) autograd must not be entered by torch.func
            gx = _product(g, weight.t(), None).reshape(x.shape) if need[0] else None  # g W
            gw = _product(g.t(), x2.t(), None) if need[1] else None  # g^T x
        gb = g.sum(0) if ctx.has_bias and need[2] else None
        return gx, gw, gb


def _eligible(x: torch.Tensor, weight: torch.Tensor, out_features: int) -> bool:
    """fp32 on the CPU outside CPU autocast (which would run `F.linear` in bf16) and large enough: M x K x N >=
    MIN_MACS (shapes are static under compile)."""
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and x.numel() * out_features >= MIN_MACS)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, backend: str = "aten"
           ) -> torch.Tensor:
    """`F.linear(x, weight, bias)`; with `backend="onednn"` the products of fp32 CPU inputs run through oneDNN."""
    if backend == "onednn" and _eligible(x, weight, weight.shape[0]):
        return _OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


def ensemble_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: str = "aten"
                    ) -> torch.Tensor:
    """y_k = x_k W_k + b_k for every member k: x `[num, M, in]`, weight `[num, in, out]`, bias `[num, 1, out]`.

    `aten`: one `baddbmm`. `onednn`: one oneDNN product per member (oneDNN's linear takes 2-D weights), stacked; a
    member's weight is used as the transposed view it is. With two members (twin critics) the two products at oneDNN's
    speed take less than MKL's one batched product."""
    if backend != "onednn" or not _eligible(x[0], weight, weight.shape[-1]):
        return torch.bmm(x, weight) if bias is None else torch.baddbmm(bias, x, weight)
    return torch.stack([linear(x[k], weight[k].t(), None if bias is None else bias[k, 0], backend)
                        for k in range(weight.shape[0])])
