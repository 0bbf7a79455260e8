"""HEAPr on a dense SwiGLU language model (Llama, SmolLM2): every MLP is one expert made of atomic experts.

A dense MLP y = W_down (act(W_gate x) * (W_up x)) is an MoE block with one expert that every token reaches with router
weight 1, so HEAPr applies unchanged. Atom k of layer l is (row k of W_gate, row k of W_up, column k = w_k of W_down);
removing it changes the MLP output by delta_y = -h_k w_k, and with M = E[g g^T] (g = dL/dy at the MLP output):

    S_k = E[h_k^2] * w_k^T M w_k          (HEAPr's score; equal to E_t[delta_y_t^T M delta_y_t], M held fixed)

Scores are ranked globally across layers, as for routed experts. Baselines: activation-only E[h_k^2] ||w_k||^2,
magnitude ||w_k|| ||[g_k; u_k]||, random. Pruning zeroes the atoms' rows and column (the same function as removing them).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from lit_iclr.core.errors import ConfigError

from .calibrate import lm_loss_sum
from .scores import ATOM_METHODS, global_keep, quad_forms


@dataclass
class DenseStats:
    """Sums over all calibration tokens, one entry per MLP."""

    h2: list[torch.Tensor]  # [I] sum_t h_k^2
    M: list[torch.Tensor]  # [d, d] sum_t g_t g_t^T
    tokens: int


def swiglu_mlps(model: nn.Module) -> list[nn.Module]:
    """The gated MLPs (modules with gate_proj, up_proj and down_proj) of `model`, in layer order."""
    mlps = [m for m in model.modules() if all(isinstance(getattr(m, a, None), nn.Linear)
                                              for a in ("gate_proj", "up_proj", "down_proj"))]
    if not mlps:
        raise ConfigError(f"{type(model).__name__} has no SwiGLU MLP (gate_proj / up_proj / down_proj linears)")
    return mlps


def _require_grad(module, args, output):
    return output.requires_grad_(True)  # frozen weights: make the activations differentiable from the embeddings on


def calibrate_dense(model: nn.Module, batches: Iterable[dict]) -> DenseStats:
    """Activation and output-gradient statistics of every MLP in one forward + backward pass per batch.

    The loss is the summed next-token cross-entropy of each sequence (as for routed experts, `calibrate.py`).
    """
    mlps = swiglu_mlps(model)
    dev = next(model.parameters()).device
    h2 = [torch.zeros(m.down_proj.in_features, dtype=torch.float64, device=dev) for m in mlps]
    M = [torch.zeros(m.down_proj.out_features, m.down_proj.out_features, device=dev) for m in mlps]
    tokens = 0

    def observer(i):
        def pre(module, args):
            h = args[0].detach().float()
            h2[i].add_(h.pow(2).flatten(0, -2).sum(0).double())  # sum_t h_k^2

        def post(module, args, out):
            def grad_hook(g):
                g = g.detach().float().flatten(0, -2)
                M[i].addmm_(g.T, g)  # sum_t g_t g_t^T
            out.register_hook(grad_hook)
        return pre, post

    handles = [model.get_input_embeddings().register_forward_hook(_require_grad)]
    for i, m in enumerate(mlps):
        pre, post = observer(i)
        handles += [m.down_proj.register_forward_pre_hook(pre), m.down_proj.register_forward_hook(post)]
    was = model.training
    model.eval()
    try:
        for b in batches:
            ids = b["input_ids"].to(dev)
            loss, _ = lm_loss_sum(model(input_ids=ids).logits, ids)
            loss.backward()
            tokens += ids.numel()
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    return DenseStats(h2=[x.float() for x in h2], M=M, tokens=tokens)


def dense_atom_scores(stats: DenseStats | None, model: nn.Module, method: str = "heapr",
                      seed: int = 0) -> list[torch.Tensor]:
    """Score [I] of every atom of every MLP (higher = more important)."""
    if method not in ATOM_METHODS:
        raise ConfigError(f"unknown atomic scoring method {method!r}; choose from {', '.join(ATOM_METHODS)}")
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, m in enumerate(swiglu_mlps(model)):
        W = m.down_proj.weight.detach().float()  # [d, I]: column k is w_k
        if method == "random":
            out.append(torch.rand(W.shape[1], generator=g))
        elif method == "magnitude":
            gu = torch.cat([m.gate_proj.weight, m.up_proj.weight], 1).detach().float()
            out.append((W.norm(dim=0) * gu.norm(dim=1)).cpu())
        else:
            eh2 = stats.h2[i] / stats.tokens  # E[h_k^2]
            if method == "wanda":
                out.append((eh2 * W.pow(2).sum(0)).cpu())
            else:
                out.append((eh2 * quad_forms(stats.M[i] / stats.tokens, W)).cpu())  # S_k = E[h_k^2] w_k^T M w_k
    return out


def dense_keep(scores: list[torch.Tensor], ratio: float, per_layer: bool = False) -> list[torch.Tensor]:
    """Keep-masks [I] per MLP: the `ratio` fraction of all atoms with the lowest scores (global ranking, HEAPr's) is
    removed; `per_layer`: that fraction of every MLP (for scores whose scale differs from layer to layer)."""
    if per_layer:
        return [global_keep([[s]], ratio)[0][0] for s in scores]
    return [k[0] for k in global_keep([[s] for s in scores], ratio)]


@contextmanager
def atoms_removed(model: nn.Module, keep: list[torch.Tensor]) -> Iterator[nn.Module]:
    """`model` with the atoms outside `keep` zeroed (rows of gate/up, column of down); restored on exit."""
    mlps = swiglu_mlps(model)
    saved = []
    with torch.no_grad():
        for m, k in zip(mlps, keep, strict=True):
            drop = ~k.to(m.down_proj.weight.device)
            saved.append((m.gate_proj.weight[drop].clone(), m.up_proj.weight[drop].clone(),
                          m.down_proj.weight[:, drop].clone(), drop))
            m.gate_proj.weight[drop] = 0
            m.up_proj.weight[drop] = 0
            m.down_proj.weight[:, drop] = 0
    try:
        yield model
    finally:
        with torch.no_grad():
            for m, (gw, uw, dw, drop) in zip(mlps, saved, strict=True):
                m.gate_proj.weight[drop] = gw
                m.up_proj.weight[drop] = uw
                m.down_proj.weight[:, drop] = dw


@torch.no_grad()
def sequence_nll(model: nn.Module, blocks: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """Mean next-token NLL of every sequence of `blocks` [n, T] (per-sequence values, for paired comparisons)."""
    dev = next(model.parameters()).device
    out = []
    for i in range(0, len(blocks), batch_size):
        ids = blocks[i: i + batch_size].to(dev)
        logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1)
        out.append(-logp.gather(-1, ids[:, 1:, None]).squeeze(-1).mean(1).cpu())
    return torch.cat(out)


def text_blocks(tokenizer, texts: Iterable[str], seq_len: int) -> torch.Tensor:
    """The texts tokenised, joined by the end-of-sequence token and cut into [n, seq_len] blocks (tail dropped)."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    stream: list[int] = []
    for t in texts:
        stream += tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]
    n = len(stream) // seq_len
    if n == 0:
        raise ConfigError(f"the texts hold {len(stream)} tokens, fewer than one block of {seq_len}")
    return torch.tensor(stream[: n * seq_len]).view(n, seq_len)
