"""Variable-width routed experts with a grouped, sync-free forward.

`VariableWidthExperts(hidden_size, widths, act)` is a drop-in for transformers' fused experts (same
`forward(hidden_states, top_k_index, top_k_weights)`), one `ExpertMLP` per expert whose state-dict keys
(`<e>.gate_proj.weight` ...) are exactly those of Hugging Face checkpoints on disk, so pruned experts are physically
smaller.

Forward (no Python loop over experts that depends on the data, no host synchronisation):

1. the (token, slot) assignments are sorted by expert (one `argsort`), the tokens gathered once;
2. experts are grouped into a few *width classes* (widths rounded up to `align`, at most `max_groups` classes, a static
   property of the module); for each class one `grouped_mm` computes [gate | up] for the rows of its experts (ragged
   rows given by device offsets, rows of other classes are skipped by the kernel), the SwiGLU, and one `grouped_mm` the
   down projection, so compute is sum_e n_e * width(e): it falls with the pruned atoms;
3. one `index_add_` scatters the router-weighted outputs back to the tokens.

An optional `observer(e, token_idx, h, y)` sees every expert call (calibration statistics); when it is set the forward
runs the per-expert reference loop instead, which hands the observer each expert's own activations.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class ExpertMLP(nn.Module):
    """One SwiGLU expert with its own width (named like Hugging Face's per-expert checkpoint tensors)."""

    def __init__(self, hidden_size: int, width: int, dtype=None, device=None):
        super().__init__()
        kw = {"dtype": dtype, "device": device, "bias": False}
        self.gate_proj = nn.Linear(hidden_size, width, **kw)
        self.up_proj = nn.Linear(hidden_size, width, **kw)
        self.down_proj = nn.Linear(width, hidden_size, **kw)


def width_classes(widths: list[int], align: int = 8, max_groups: int = 4) -> list[tuple[int, list[int]]]:
    """Group experts by width: [(class width, expert ids)], class width = a multiple of `align` covering its experts.

    Widths are rounded up to `align` (the grouped kernels need 16-byte strides); when that leaves more than `max_groups`
    distinct widths, experts sorted by width are split into `max_groups` classes of equal count (each padded to its
    widest member), so padding waste stays small while the number of kernel launches is bounded. Empty experts (width
    0) get no class.
    """
    live = sorted((w, e) for e, w in enumerate(widths) if w > 0)
    if not live:
        return []
    rounded = sorted({-(-w // align) * align for w, _ in live})
    if len(rounded) <= max_groups:
        return [(r, [e for w, e in live if -(-w // align) * align == r]) for r in rounded]
    chunks = [live[i * len(live) // max_groups:(i + 1) * len(live) // max_groups] for i in range(max_groups)]
    return [(-(-c[-1][0] // align) * align, [e for _, e in c]) for c in chunks if c]


class VariableWidthExperts(nn.ModuleList):
    """Routed experts, expert e with width I_e; same forward signature as transformers' fused experts modules."""

    def __init__(self, hidden_size: int, widths: list[int], act: str | Callable = "silu", dtype=None, device=None,
                 align: int = 8, max_groups: int = 4):
        super().__init__(ExpertMLP(hidden_size, int(w), dtype, device) for w in widths)
        from transformers.activations import ACT2FN

        self.hidden_dim = hidden_size
        self.num_experts = len(widths)
        self.align, self.max_groups = align, max_groups
        fn = ACT2FN[act] if isinstance(act, str) else act
        object.__setattr__(self, "act_fn", fn)  # a plain attribute: not a child of the ModuleList
        # observer(e, token_idx, h, y) is called for each expert call when set (calibration); never saved.
        self.observer: Callable | None = None
        # None: row boundaries read on the host for CPU tensors, kept on the device (sync-free) otherwise; True/False
        # force the device-side or host-side form (both are tested on the CPU).
        self.sync_free: bool | None = None

    def widths(self) -> list[int]:
        return [m.gate_proj.out_features for m in self]

    def expert_forward(self, e: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, y) of expert e: h = act(gate x) * up x (the atoms' activations h_k), y = down h."""
        m = self[e]
        h = self.act_fn(m.gate_proj(x)) * m.up_proj(x)
        return h, m.down_proj(h)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        aligned = hidden_states.shape[-1] * hidden_states.element_size() % 16 == 0  # grouped kernels: 16-byte rows
        if self.observer is not None or not aligned:
            return self.loop_forward(hidden_states, top_k_index, top_k_weights)
        return self.grouped_forward(hidden_states, top_k_index, top_k_weights)

    def _class_weights(self, experts: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """([gate | up] as [n, d, 2W], down as [n, W, d]) of these experts, zero-padded to the class width W.

        Both are transposed *views* of row-contiguous stacks ([n, 2W, d] and [n, d, W]): the grouped kernel reads
        them in place (a contiguous transposed copy would cost more than the matmuls on CPU)."""
        gu, dn = [], []
        for e in experts:
            m = self[e]
            pad = width - m.gate_proj.out_features
            g, u, d = m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight
            if pad:
                g, u, d = F.pad(g, (0, 0, 0, pad)), F.pad(u, (0, 0, 0, pad)), F.pad(d, (0, pad))
            gu.append(torch.cat([g, u]))
            dn.append(d)
        return torch.stack(gu).transpose(1, 2), torch.stack(dn).transpose(1, 2)

    def grouped_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        """Sorted-token grouped computation (module docstring); equal to `loop_forward` up to float rounding.

        The (token, slot) rows are sorted once, class-major then by expert, and gathered once. On the CPU each width
        class then works on its own contiguous rows only (reading the row counts is free there: the tensors already
        live on the host), so the gather, SwiGLU and scatter shrink with the pruned experts as the matmuls do. On an
        accelerator the row boundaries stay on the device: each class runs over all rows with device offsets and masks
        the rows of the other classes (no host synchronisation; the kernel skips the rows beyond its offsets).
        """
        classes = width_classes(self.widths(), self.align, self.max_groups)
        if not classes:
            return torch.zeros_like(hidden_states)
        T, d = hidden_states.shape
        k = top_k_index.shape[-1]
        dev = top_k_index.device
        flat_e = top_k_index.reshape(-1)
        token = torch.arange(T, device=dev).repeat_interleave(k)
        counts = torch.bincount(flat_e, minlength=self.num_experts)  # stays on the device: no .tolist() here
        class_major = [e for _, experts in classes for e in experts]
        rank = torch.full((self.num_experts,), len(class_major), device=dev, dtype=torch.long)
        rank[torch.tensor(class_major, device=dev)] = torch.arange(len(class_major), device=dev)
        order = torch.argsort(rank[flat_e], stable=True)       # class-major, then expert; empty experts last
        token, weight = token[order], top_k_weights.reshape(-1)[order, None]
        x = hidden_states[token]                                # the one gather
        ends = counts[torch.tensor(class_major, device=dev)].cumsum(0)
        host = dev.type == "cpu" if self.sync_free is None else not self.sync_free
        bounds = [0, *ends.tolist()] if host else None          # row boundaries per expert (free on the host)
        ys, start = [], 0
        out = torch.zeros_like(hidden_states)
        for width, experts in classes:
            n = len(experts)
            gu_w, dn_w = self._class_weights(experts, width)
            if host:
                lo, hi = bounds[start], bounds[start + n]
                offs = (ends[start:start + n] - lo).to(torch.int32)
                y = self._swiglu_grouped(x[lo:hi], gu_w, dn_w, offs, width)
                ys.append(y * weight[lo:hi].to(y.dtype))
            else:
                # this class's rows first: the rows of earlier classes are rotated to the end, beyond the offsets
                first = ends[start - 1] if start else torch.zeros((), dtype=ends.dtype, device=dev)
                idx = (torch.arange(len(order), device=dev) + first) % len(order)
                offs = (ends[start:start + n] - first).to(torch.int32)
                valid = (torch.arange(len(order), device=dev) < offs[-1])[:, None]
                # `where` (not a product): the kernel leaves rows past offs[-1] unwritten, in the outputs and in the
                # input gradient alike; selecting drops whatever they hold (possibly inf/NaN) both ways
                y = self._swiglu_grouped(torch.where(valid, x[idx], 0.0), gu_w, dn_w, offs, width)
                y = torch.where(valid, y * weight[idx].to(y.dtype), 0.0)
                out = out.index_add(0, token[idx], y.to(out.dtype))
            start += n
        if not host:
            return out
        y = torch.cat(ys)
        return out.index_add(0, token[:len(y)], y.to(out.dtype))  # one scatter; rows of empty experts are not in y

    def _swiglu_grouped(self, x: torch.Tensor, gu_w: torch.Tensor, dn_w: torch.Tensor, offs: torch.Tensor, width: int):
        """SwiGLU of ragged expert groups: [gate | up] by one grouped_mm, h = act(g x) * (u x), then down by another."""
        gu = F.grouped_mm(x, gu_w.to(x.dtype), offs=offs)                  # [N, 2W]
        h = self.act_fn(gu[:, :width]) * gu[:, width:]                      # h_k = act(g_k x) (u_k x)
        return F.grouped_mm(h.contiguous(), dn_w.to(x.dtype), offs=offs)    # [N, d]

    def loop_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        """Reference: one matmul per expert hit (host sync per layer); feeds the observer."""
        out = torch.zeros_like(hidden_states)
        # expert_mask[e, slot, token]: which (token, slot) pairs chose expert e (one pass, no loop over tokens).
        expert_mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        hit = (expert_mask.sum(dim=(1, 2)) > 0).nonzero().flatten().tolist()
        for e in hit:
            slot, token_idx = torch.where(expert_mask[e])
            if self[e].gate_proj.out_features == 0:
                continue
            h, y = self.expert_forward(e, hidden_states[token_idx])
            if self.observer is not None:
                y = self.observer(e, token_idx, h, y)
            y = y * top_k_weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out
