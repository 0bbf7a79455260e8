"""Calibration statistics of every routed expert, gathered by observers on `VariableWidthExperts` (no model copy).

For expert e of an MoE block, over the tokens routed to it (HEAPr, Sec. 3):
- `n[e]`: number of routed (token, expert) pairs;
- `h2[e][k] = sum_t h_k(x_t)^2`: the atoms' squared activations, h = act(W_gate x) * (W_up x);
- `M[e] = sum_t g_t g_t^T` (d x d, fisher_state="full", the paper's O(d^2) state) with g_t = dL/dy_t the gradient of the
  loss at the expert's output y_t = W_down h (before the router weight r_t, so g_t = r_t * dL/d(block output) already
  includes the router weight), or equivalently
- `gh2[e][k] = sum_t (dL/dh_{k,t})^2 = sum_t (w_k^T g_t)^2 = w_k^T M[e] w_k` (fisher_state="atom", O(I) state, the same
  numbers without the d x d matrix: dL/dh = W_down^T g).

The loss L is the *summed* next-token cross-entropy of each calibration sequence (so g_t is the gradient of the whole
sequence's loss; a mean would only rescale every score by one constant). Parameter gradients are never formed: the
weights are frozen and only the activation graph is differentiated. Both activation and gradient statistics come out of
one forward + backward pass: the paper's second forward pass recomputes exactly the same h (weights unchanged), and
E[h^2] * w^T M w factorises, so the extra pass is skipped.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from lit_iclr.core.moe import MoEBlock, check_moe, unfuse_experts
from lit_iclr.core.moe.sharding import checkpointed_layers


@dataclass
class ExpertStats:
    """Sums over the routed tokens of one MoE block (lists indexed by expert)."""

    name: str
    n: torch.Tensor  # [E] routed token count (float64)
    h2: list[torch.Tensor]  # [I_e] sum of h_k^2
    M: list[torch.Tensor] | None = None  # [d, d] sum of g g^T (fisher_state="full")
    gh2: list[torch.Tensor] | None = None  # [I_e] sum of (dL/dh_k)^2 (fisher_state="atom")
    inputs: list[torch.Tensor] = field(default_factory=list)  # block inputs [T, d] (only when collected)


@dataclass
class Calibration:
    blocks: list[ExpertStats]
    tokens: int  # calibration tokens N (positions of the stream, routed or not)
    loss: float  # mean next-token loss on the calibration data
    seconds: float
    fisher_state: str

    def state_bytes(self) -> int:
        """Memory held by the Fisher state (the d x d matrices, or the per-atom sums)."""
        total = 0
        for b in self.blocks:
            for t in (b.M or []) + (b.gh2 or []) + b.h2:
                total += t.numel() * t.element_size()
        return total


def lm_loss_sum(logits: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None):
    """Summed next-token cross-entropy (labels are shifted here, Hugging Face convention) and the token count, a 0-dim
    tensor on the logits' device (a training step divides by it without a host sync)."""
    target = labels[:, 1:].clone()
    if attention_mask is not None:
        target[attention_mask[:, 1:] == 0] = -100
    loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), target.flatten(), ignore_index=-100,
                                       reduction="sum")
    return loss, (target != -100).sum()


def _require_grad_hook(module, args, output):
    return output.requires_grad_(True)


@torch.no_grad()
def _accumulate_outer(m: torch.Tensor, g: torch.Tensor) -> None:
    m.addmm_(g.T, g)  # M += sum_t g_t g_t^T (one GEMM for all routed tokens of the batch)


@torch.no_grad()
def _accumulate_square(acc: torch.Tensor, gh: torch.Tensor) -> None:
    acc.add_(gh.pow(2).sum(0))  # sum_t (dL/dh_k)^2 = w_k^T (sum_t g_t g_t^T) w_k


def make_observer(s: ExpertStats, with_gradients: bool, device: torch.device | str) -> Callable:
    """The `VariableWidthExperts` observer that accumulates `s`, safe under activation checkpointing.

    With gradients, an expert call's statistics (its count, sum h^2 and the Fisher term) are added by one backward hook
    on that call's output, i.e. exactly once per call that the backward reaches: a non-reentrant replay builds tensors
    the backward never visits (their hooks never fire), and a reentrant checkpoint's first pass runs without gradients
    (skipped here; its replay, whose graph the backward does traverse, is counted). Without gradients the forward adds
    them directly (no replay happens without a backward).
    """
    def observe(e: int, token_idx: torch.Tensor, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h2 = h.detach().float().pow(2).sum(0).to(device)  # sum_t h_k^2 of this call
        if not with_gradients:
            s.n[e] += len(token_idx)
            s.h2[e] += h2
            return y
        if not y.requires_grad:  # the no-grad first pass of a reentrant checkpoint
            return y

        def on_grad(grad: torch.Tensor, fisher: Callable) -> None:  # runs once, when the backward reaches this call
            s.n[e] += len(token_idx)
            s.h2[e] += h2
            fisher(grad.detach().float().to(device))

        if s.M is not None:  # g = dL/dy (the router weight multiplies y afterwards, so it is inside g)
            y.register_hook(lambda g: on_grad(g, lambda g: _accumulate_outer(s.M[e], g)))
        else:  # dL/dh_k = w_k^T g, whose square summed over t is w_k^T M w_k
            h.register_hook(lambda gh: on_grad(gh, lambda gh: _accumulate_square(s.gh2[e], gh)))
        return y
    return observe


def calibrate(model: nn.Module, batches: Iterable[dict], fisher_state: str = "full", with_gradients: bool = True,
              collect_inputs: bool = False, device: torch.device | str | None = None,
              recompute: str | None = None) -> Calibration:
    """One pass over `batches` (LM batches: input_ids, labels, attention_mask) gathering `ExpertStats` per block.

    Args:
        model: A Hugging Face MoE causal LM (its experts are converted to `VariableWidthExperts` in place).
        batches: Calibration batches.
        fisher_state: "full" (the paper's d x d M per expert) or "atom" (per-atom sums of (dL/dh_k)^2; same scores).
        with_gradients: Run the backward pass (HEAPr); false gathers forward statistics only (baselines).
        collect_inputs: Also keep every block's input hidden states (NAEE's reconstruction needs them).
        device: Where the statistics live (default: the model's device).
        recompute: Activation checkpointing of the decoder layers during the pass ("reentrant" or "non_reentrant"):
            activations are recomputed in the backward (memory of one layer instead of all); statistics are unchanged.
    """
    if recompute not in (None, "reentrant", "non_reentrant"):
        raise ValueError(f"recompute must be null, 'reentrant' or 'non_reentrant', got {recompute!r}")
    if fisher_state not in ("full", "atom"):
        raise ValueError(f"fisher_state must be 'full' or 'atom', got {fisher_state!r}")
    unfuse_experts(model)
    blocks: list[MoEBlock] = check_moe(model)
    p = next(model.parameters())
    device = torch.device(device) if device is not None else p.device
    d = blocks[0].hidden_size
    stats = []
    for b in blocks:
        widths = b.widths()
        s = ExpertStats(b.name, torch.zeros(b.num_experts, dtype=torch.float64),
                        [torch.zeros(w, device=device) for w in widths])
        if with_gradients and fisher_state == "full":
            s.M = [torch.zeros(d, d, device=device) for _ in widths]
        if with_gradients and fisher_state == "atom":
            s.gh2 = [torch.zeros(w, device=device) for w in widths]
        stats.append(s)

    handles = []
    for b, s in zip(blocks, stats, strict=True):
        b.experts.observer = make_observer(s, with_gradients, device)
        if collect_inputs:
            handles.append(b.module.register_forward_hook(
                lambda m, args, out, s=s: s.inputs.append(args[0].detach().reshape(-1, args[0].shape[-1]).cpu())))
    if with_gradients:  # gradients reach the activations without forming any parameter gradient
        handles.append(model.get_input_embeddings().register_forward_hook(_require_grad_hook))
    was_training = model.training
    flags = [q.requires_grad for q in model.parameters()]
    model.eval()
    for q in model.parameters():
        q.requires_grad_(False)
    t0, tokens, loss_sum, counted = time.perf_counter(), 0, 0.0, 0
    # Also callable from hooks that Lightning runs under inference mode (e.g. on_test_start): gradients must flow.
    context = torch.inference_mode(False)
    context.__enter__()
    layers = checkpointed_layers(model, recompute == "reentrant") if recompute else nullcontext()
    layers.__enter__()
    try:
        for batch in batches:
            ids = batch["input_ids"].to(p.device)
            mask = batch.get("attention_mask")
            mask = mask.to(p.device) if mask is not None else None
            labels = batch.get("labels", batch["input_ids"]).to(p.device)
            with torch.set_grad_enabled(with_gradients):
                logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
                loss, n = lm_loss_sum(logits, labels, mask)
                if with_gradients:
                    loss.backward()
            tokens += int(mask.sum()) if mask is not None else ids.numel()
            loss_sum += float(loss.detach())
            counted += int(n)
    finally:
        layers.__exit__(None, None, None)
        context.__exit__(None, None, None)
        for h in handles:
            h.remove()
        for b in blocks:
            b.experts.observer = None
        for q, f in zip(model.parameters(), flags, strict=True):
            q.requires_grad_(f)
        model.train(was_training)
    if tokens == 0:
        raise ValueError("the calibration data is empty")
    return Calibration(stats, tokens, loss_sum / max(counted, 1), time.perf_counter() - t0, fisher_state)
