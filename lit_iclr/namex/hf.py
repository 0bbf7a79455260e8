"""Expert merging inside the MoE blocks of Hugging Face models (Qwen2-MoE / Qwen1.5-MoE, Mixtral, DeepSeek-MoE).

`apply_merging(model, options)` replaces, in place, the routed-expert computation of every MoE block found by
`lit_iclr.core.moe.moe_blocks` with one merged SwiGLU expert per merge unit (a segment of `options.segment` tokens,
routed on the mean hidden state of the previous segment through the model's own router, so the LM stays causal):

    E_base = mean_i E_i (no trained base exists in a pretrained SMoE; the mean is the natural centre of the domain vectors)
    tau_i  = E_i - E_base,  s = the block's own router scores (softmax top-k; DeepSeek-V3: sigmoid, normalised)
    E_hat via `ExpertMerger` (SMEAR / CAMEx / EP-CAMEx / NAMEx with Nash weights and complex momentum across the layers)
    y      = SwiGLU(x; E_hat) + shared experts (Qwen2-MoE's gated shared expert, DeepSeek's shared experts: unchanged)

Zero-shot: apply to a pretrained model and evaluate. Fine-tune: apply, then train as usual; gradients flow through the
merge into the original expert and router weights (state-dict keys unchanged, so `save_pretrained` still works and
FSDP shards the same parameters). Curvature matrices are not used here (M_i = I): a pretrained model has none.
`remove_merging(model)` restores the original blocks.

Recomputation safety. The propagated state (E_base, mu) of layer l is read by layer l+1. Under activation checkpointing
a decoder layer is replayed during the backward; its state therefore crosses every checkpointed decoder layer as an
explicit input and output of the checkpointed function (`_ChainCarrier`), and the merger's step counter is frozen
while replaying, so gradients equal the non-checkpointed ones for every merging variant, reentrant or not.

Memory. With `options.chunk` set, merge units are processed `chunk` at a time and each chunk's merged SwiGLU weights are
recomputed in the backward instead of being kept (only the propagated state, the layer's output, survives).

Expert basis (`chain_state: coefficients`, the default for EP-CAMEx / NAMEx without masks). Every propagated base is a
linear combination of the experts merged so far (layer 0 starts from their mean, and each update is linear in the
incoming base and the layer's experts), so the chain carries per-unit coefficients C (U, K) over the flat experts of
every earlier MoE layer (the banks, K rows) instead of per-unit weights (U, P):

    C_base^0 = 1/n over E^0,  delta^l = w^l e_l - (sum_i w^l_i) C_base^l,  C_base^{l+1} = C_base^l + gamma Re(mu^{l+1})
    merged weights of unit u = C_u [E^0; ...; E^l], built `chunk` units at a time inside the SwiGLU and rebuilt in the
    backward; the Nash Gram G = (e - C) M (e - C)^T with M the float64 Gram matrix of the banks, extended per layer.

What stays for the backward is then the banks (one (n, P) copy per MoE layer, independent of the number of units) and
tiny coefficients, instead of (U, P) per layer and state; the cost is a merge over all earlier layers' experts (O(L^2)
in the depth). `chain_state: weights` keeps the (U, P) states (faster when memory allows); curvature, TIES and
training-time DARE act entry by entry on the weights and need it (`auto` picks it for them).
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lit_iclr.core.moe import MoEBlock, check_moe

from .ffn import MergeOptions, merge_units
from .merging import MERGE_MODES, ExpertMerger, replaying
from .propagation import EMPTY_STATE, Chain, PropagationState
from .routing import top_k_gates

CHAIN_STATES = ("auto", "coefficients", "weights")


@dataclass
class _Patch:
    block: MoEBlock
    merger: ExpertMerger
    chain: Chain
    index: int
    segment: int | None
    top_k: int
    chunk: int | None
    coefficients: bool = False  # the chain state is kept in the expert basis


def flat_experts(block: MoEBlock) -> Tensor:
    """The block's routed experts as one (E, 3 I d) tensor [gate | up | down], differentiable w.r.t. the model."""
    w = block.stacked()
    return torch.cat([w.gate.flatten(1), w.up.flatten(1), w.down.flatten(1)], dim=1)


def router_gates(block: MoEBlock, u: Tensor, k: int) -> Tensor:
    """Dense (U, E) merge weights from the block's own router on unit inputs u (U, d), following its scoring rule.

    Softmax routers (Qwen2-MoE, Mixtral, DeepSeek-V2): softmax over the k largest logits. Sigmoid routers with a
    selection bias (DeepSeek-V3): experts chosen by sigmoid(logit) + bias, weighted by sigmoid(logit) normalised over
    the chosen ones (the model's own rule; its routed scaling factor multiplies every expert alike and is left out,
    since merging weights must stay a convex combination for E_base + gamma * Delta to remain an expert).
    """
    logits = block.route(u)[0].float()
    bias = getattr(block.router, "e_score_correction_bias", None)
    if bias is None:
        return top_k_gates(logits, k)
    scores = logits.sigmoid()
    if k < scores.shape[-1]:
        idx = (scores + bias.float()).topk(k, dim=-1).indices
        scores = torch.zeros_like(scores).scatter(-1, idx, scores.gather(-1, idx))
    return scores / scores.sum(-1, keepdim=True).clamp_min(1e-20)


def _swiglu_units(xu: Tensor, merged: Tensor, inner: int, act) -> Tensor:
    """SwiGLU of each unit's tokens xu (U, S, d) with its own merged flat expert (U, P) = [gate | up | down]."""
    d = xu.shape[-1]
    gate_w, up_w, down_w = merged.split((inner * d, inner * d, d * inner), dim=-1)
    gate_w, up_w, down_w = gate_w.view(-1, inner, d), up_w.view(-1, inner, d), down_w.view(-1, d, inner)
    h = act(torch.bmm(xu, gate_w.transpose(1, 2))) * torch.bmm(xu, up_w.transpose(1, 2))
    return torch.bmm(h, down_w.transpose(1, 2))


def _merge_apply(p: _Patch, act, bank: Tensor, xu: Tensor, gates: Tensor, *state: Tensor | None):
    """Merge and apply for a set of units; returns (y (U, S, d), next state tensors or Nones)."""
    local = Chain()
    prev = PropagationState(*state) if state and state[0] is not None else None
    if prev is not None:
        local.write(p.index - 1, prev)
    merged = p.merger(bank, gates, local if p.merger.propagates else None, p.index, tick=not p.chunk)
    y = _swiglu_units(xu, merged.expand(xu.shape[0], -1), p.block.widths()[0], act)
    nxt = local.states.get(p.index)
    return y, *((nxt.base, nxt.mu_re, nxt.mu_im) if nxt is not None else (None, None, None))


@torch.no_grad()
def _extend_metric(metric: Tensor | None, banks: tuple[Tensor, ...], chunk: int = 1 << 14) -> Tensor:
    """The float64 Gram matrix of the rows of `banks` from that of all but the last bank (column blocks of `chunk`)."""
    new = banks[-1]
    n, P = new.shape
    if any(b.shape[1] != P for b in banks):
        raise ValueError("the expert basis needs experts of the same shape in every MoE layer; use chain_state: weights")
    K0 = 0 if metric is None else metric.shape[0]
    cross = torch.zeros(n, K0 + n, dtype=torch.float64, device=new.device)
    for a in range(0, P, chunk):
        cross += new[:, a:a + chunk].double() @ torch.cat([b[:, a:a + chunk] for b in banks]).double().T
    out = torch.empty(K0 + n, K0 + n, dtype=torch.float64, device=new.device)
    if metric is not None:
        out[:K0, :K0] = metric
    out[K0:] = cross
    out[:, K0:] = cross.T
    return out


def _coefficient_units(xu: Tensor, coef: Tensor, inner: int, act, *banks: Tensor) -> Tensor:
    """SwiGLU of units xu (U, S, d) with merged experts C [E^0; ...; E^l], built one bank at a time (no (K, P) copy)."""
    merged, off = None, 0
    for b in banks:
        c = coef[:, off:off + b.shape[0]].to(b.dtype)
        off += b.shape[0]
        merged = c @ b if merged is None else torch.addmm(merged, c, b)
    return _swiglu_units(xu, merged, inner, act)


def _coefficient_merge(p: _Patch, act, experts: Tensor, xu: Tensor, gates: Tensor) -> Tensor:
    """Merge in the expert basis (module docstring): coefficients through the merger, weights only chunk-wise."""
    prev = p.chain.read(p.index)
    n = experts.shape[0]
    banks = (prev.banks if prev is not None else ()) + (experts,)
    K0 = sum(b.shape[0] for b in banks[:-1])
    dt = torch.promote_types(gates.dtype, torch.float32)
    bank = torch.zeros(n + 1, K0 + n, dtype=dt, device=experts.device)
    bank[0, K0:] = 1.0 / n                                             # slot 0: the mean expert (layer 0's base)
    bank[1:, K0:] = torch.eye(n, dtype=dt, device=experts.device)     # E_i of this layer
    metric = _extend_metric(prev.metric if prev is not None else None, banks) if p.merger.mode == "namex" else None
    local = Chain()
    if prev is not None:  # the incoming coefficients, with zeros for this layer's experts
        pad = [None if t is None else F.pad(t.to(dt), (0, n)) for t in (prev.base, prev.mu_re, prev.mu_im)]
        local.write(p.index - 1, PropagationState(*pad))
    coef = p.merger(bank, gates.to(dt), local, p.index, metric=metric)
    nxt = local.states[p.index]
    p.chain.write(p.index, PropagationState(nxt.base, nxt.mu_re, nxt.mu_im, metric, banks))
    U = xu.shape[0]
    coef = coef.expand(U, -1)
    step = p.chunk or U
    inner = p.block.widths()[0]
    if not torch.is_grad_enabled():
        return torch.cat([_coefficient_units(xu[a:a + step], coef[a:a + step], inner, act, *banks)
                          for a in range(0, U, step)])
    # the merged weights of each chunk are rebuilt in the backward: only coefficients and banks are kept
    return torch.cat([checkpoint(_coefficient_units, xu[a:a + step], coef[a:a + step], inner, act, *banks,
                                 use_reentrant=False) for a in range(0, U, step)])


def _merged_forward(module: nn.Module, hidden_states: Tensor) -> Tensor:
    p: _Patch = module._namex_patch
    B, T, d = hidden_states.shape
    S = p.segment
    pad = (-T) % S if S is not None and S < T else 0
    x = F.pad(hidden_states, (0, 0, 0, pad)) if pad else hidden_states   # trailing pad: only the last unit sees it
    u, xu = merge_units(x, S)
    gates = router_gates(p.block, u, p.top_k).to(x.dtype)              # the model's own router on the unit means
    experts = flat_experts(p.block)
    act = getattr(p.block.experts, "act_fn", None) or F.silu
    if p.coefficients:
        y = _coefficient_merge(p, act, experts, xu, gates)
        return _finish(p, y, hidden_states, pad)
    bank = experts if p.merger.mode == "smear" else torch.cat([experts.mean(0, keepdim=True), experts])
    prev = p.chain.read(p.index) if p.merger.propagates else None
    state = (prev.base, prev.mu_re, prev.mu_im) if prev is not None else (None, None, None)
    U = xu.shape[0]
    if not p.chunk or p.chunk >= U or not torch.is_grad_enabled():
        y, *nxt = _merge_apply(p, act, bank, xu, gates, *state)
    else:  # chunks of units; each chunk's merged weights are recomputed in the backward, not stored
        ys, outs = [], []
        for a in range(0, U, p.chunk):
            sl = slice(a, min(a + p.chunk, U))
            part = [s[sl] if s is not None and s.shape[0] == U else s for s in state]
            y_c, *n_c = checkpoint(_merge_apply, p, act, bank, xu[sl], gates[sl], *part, use_reentrant=False)
            ys.append(y_c)
            outs.append(n_c)
        y = torch.cat(ys)
        # a state per unit is concatenated; a unit-independent (1, P) state is the same in every chunk
        nxt = [None if parts[0] is None else torch.cat(parts) if parts[0].shape[0] == ys[0].shape[0] else parts[0]
               for parts in zip(*outs, strict=True)]
        p.merger.tick()
    if p.merger.propagates and nxt[0] is not None:
        p.chain.write(p.index, PropagationState(*nxt))
    return _finish(p, y, hidden_states, pad)


def _finish(p: _Patch, y: Tensor, hidden_states: Tensor, pad: int) -> Tensor:
    """Units back to (B, T, d), plus the block's shared experts."""
    B, T, d = hidden_states.shape
    y = y.reshape(B, T + pad, d)[:, :T]
    if p.block.shared:
        flat = hidden_states.reshape(-1, d)
        shared = sum(m(flat) for m in p.block.shared)
        if p.block.shared_gate is not None:
            shared = torch.sigmoid(p.block.shared_gate(flat)) * shared
        y = y + shared.view(B, T, d)
    return y


# ------------------------------------------------------------------------------------ recomputation-safe chain state
class _ChainCarrier:
    """Mixed into a decoder layer's class: its checkpoint function carries the chain state as inputs and outputs.

    Hugging Face's `GradientCheckpointingLayer` checkpoints `self._gradient_checkpointing_func(forward, *args)`; the
    property below hands it a function that appends the previous layer's state (base, mu_re, mu_im) to the
    checkpointed inputs, restores it into the chain inside the replay, and returns this layer's state as extra outputs,
    so the replayed layer reads its own predecessor's state and the state's gradient flows through the checkpoint.
    """

    @property
    def _gradient_checkpointing_func(self):
        raw = self.__dict__.get("_namex_raw_ckpt_func")
        return None if raw is None else partial(_carry_state, self, raw)

    @_gradient_checkpointing_func.setter
    def _gradient_checkpointing_func(self, func) -> None:
        self.__dict__["_namex_raw_ckpt_func"] = func


def _carry_state(layer: nn.Module, raw, fn, *args):
    chain, index = layer._namex_chain, layer._namex_index
    prev = chain.read(index)
    state = prev.flat() if prev is not None else EMPTY_STATE
    n = len(args)
    sizes = []  # how many of the outputs are this layer's state (4 + its banks in the expert basis)

    def run(*flat):
        if replaying():  # a replay's states serve its own recomputation only: drop them when the backward ends
            torch.autograd.Variable._execution_engine.queue_callback(chain.clear)
        if flat[n] is not None:
            chain.write(index - 1, PropagationState.from_flat(flat[n:]))
        out = fn(*flat[:n])
        mine = chain.states[index].flat()
        outs = out if isinstance(out, tuple) else (out,)
        sizes.append(len(mine))
        return (*outs, *mine)

    res = raw(run, *args, *state)
    k = sizes[0]
    chain.write(index, PropagationState.from_flat(res[-k:]))
    out = res[:-k]
    return out[0] if len(out) == 1 else tuple(out)


def _decoder_layer(model: nn.Module, block: MoEBlock) -> nn.Module | None:
    """The decoder layer holding `block` (the block's parent whose class can checkpoint), if any."""
    parts = block.name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        mod = model.get_submodule(".".join(parts[:cut]))
        if hasattr(type(mod), "gradient_checkpointing"):
            return mod
    return None


def _carry_chain(layer: nn.Module, chain: Chain, index: int) -> None:
    cls = type(layer)
    if not issubclass(cls, _ChainCarrier):
        raw = layer.__dict__.pop("_gradient_checkpointing_func", None)
        layer.__class__ = type(f"Merging{cls.__name__}", (_ChainCarrier, cls), {})
        if raw is not None:
            layer._gradient_checkpointing_func = raw
    layer._namex_chain, layer._namex_index = chain, index


def _uncarry_chain(layer: nn.Module) -> None:
    if isinstance(layer, _ChainCarrier):
        raw = layer.__dict__.pop("_namex_raw_ckpt_func", None)
        layer.__class__ = next(c for c in type(layer).__mro__[1:] if not issubclass(c, _ChainCarrier))
        if raw is not None:
            layer._gradient_checkpointing_func = raw


# ------------------------------------------------------------------------------------------------------- apply/remove
def apply_merging(model: nn.Module, options: MergeOptions) -> list[MoEBlock]:
    """Patch every MoE block of `model` to merge its experts (see the module docstring); returns the blocks."""
    if options.mode not in MERGE_MODES:
        raise ValueError(f"Hugging Face merging supports modes {MERGE_MODES}; {options.mode!r} is the model itself")
    if options.chain_state not in CHAIN_STATES:
        raise ValueError(f"chain_state must be one of {CHAIN_STATES}, got {options.chain_state!r}")
    blocks = check_moe(model)
    chain = Chain()
    for b in blocks:
        E = b.num_experts
        merger = ExpertMerger(options.mode, E, options.gamma, options.beta_abs, options.beta_phase,
                              options.alpha_mode, options.mask, options.dare_p, options.nash_every)
        merger.train(model.training)
        index = chain.register() if merger.propagates else 0
        entrywise = options.mask != "none"  # TIES / DARE masks act on the weights entry by entry
        if options.chain_state == "coefficients" and entrywise:
            raise ValueError(f"chain_state: coefficients cannot apply the {options.mask} mask; use weights or auto")
        coefficients = merger.propagates and not entrywise and options.chain_state != "weights"
        # Kept out of the module tree (object.__setattr__): the checkpoint keeps the model's own keys only.
        object.__setattr__(b.module, "_namex_patch", _Patch(b, merger, chain, index, options.segment,
                                                             options.top_k or E, options.chunk, coefficients))
        b.module.forward = types.MethodType(_merged_forward, b.module)
        layer = _decoder_layer(model, b) if merger.propagates else None
        if layer is not None:
            _carry_chain(layer, chain, index)
    if chain.length:  # the states belong to one forward pass: drop them when it ends
        handle = model.register_forward_hook(lambda *_: chain.clear())
        object.__setattr__(model, "_namex_chain_hook", handle)
    return blocks


def remove_merging(model: nn.Module) -> None:
    """Undo `apply_merging`: the blocks run their original sparse routing again."""
    for b in check_moe(model):
        if "_namex_patch" in vars(b.module):
            del b.module.forward
            object.__delattr__(b.module, "_namex_patch")
    for m in model.modules():
        _uncarry_chain(m)
    handle = vars(model).get("_namex_chain_hook")
    if handle is not None:
        handle.remove()
        object.__delattr__(model, "_namex_chain_hook")


def set_merging_train(model: nn.Module, mode: bool) -> None:
    """Propagate train/eval to the (out-of-tree) mergers: DARE masks and the Nash refresh schedule depend on it."""
    for b in check_moe(model):
        patch = vars(b.module).get("_namex_patch")
        if patch is not None:
            patch.merger.train(mode)
