"""Expert merging inside the MoE blocks of Hugging Face models (Qwen2-MoE / Qwen1.5-MoE, Mixtral, DeepSeek-MoE).

`apply_merging(model, options)` replaces, in place, the routed-expert computation of every MoE block found by
`lit_iclr.core.hf_moe.moe_blocks` with one merged SwiGLU expert per merge unit (a segment of `options.segment` tokens,
routed on the mean hidden state of the previous segment through the model's own router, so the LM stays causal):

    E_base = mean_i E_i (no trained base exists in a pretrained SMoE; the mean is the natural centre of the domain vectors)
    tau_i  = E_i - E_base,  s = top-k softmax of the block's router logits,  E_hat via `ExpertMerger` (SMEAR / CAMEx /
    EP-CAMEx / NAMEx with Nash weights and complex momentum across the model's MoE layers)
    y      = SwiGLU(x; E_hat) + shared experts (Qwen2-MoE's gated shared expert, DeepSeek's shared experts: unchanged)

Zero-shot: apply to a pretrained model and evaluate. Fine-tune: apply, then train as usual; gradients flow through the
merge into the original expert and router weights (state-dict keys unchanged, so `save_pretrained` still works and
FSDP shards the same parameters). Curvature matrices are not used here (M_i = I): a pretrained model has none.
`remove_merging(model)` restores the original blocks.
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_iclr.core.hf_moe import MoEBlock, check_moe

from .ffn import MergeOptions, merge_units
from .merging import MERGE_MODES, ExpertMerger
from .propagation import Chain
from .routing import top_k_gates


@dataclass
class _Patch:
    block: MoEBlock
    merger: ExpertMerger
    chain: Chain
    index: int
    segment: int | None
    top_k: int


def flat_experts(block: MoEBlock) -> Tensor:
    """The block's routed experts as one (E, 3 I d) tensor [gate | up | down], differentiable w.r.t. the model."""
    w = block.stacked()
    return torch.cat([w.gate.flatten(1), w.up.flatten(1), w.down.flatten(1)], dim=1)


def _merged_forward(module: nn.Module, hidden_states: Tensor) -> Tensor:
    p: _Patch = module._namex_patch
    B, T, d = hidden_states.shape
    S = p.segment
    pad = (-T) % S if S is not None and S < T else 0
    x = F.pad(hidden_states, (0, 0, 0, pad)) if pad else hidden_states   # trailing pad: only the last unit sees it
    u, xu = merge_units(x, S)
    logits = p.block.route(u)[0].float()                                 # the model's own router on the unit means
    gates = top_k_gates(logits, p.top_k).to(x.dtype)
    experts = flat_experts(p.block)
    bank = experts if p.merger.mode == "smear" else torch.cat([experts.mean(0, keepdim=True), experts])
    merged = p.merger(bank, gates, p.chain, p.index).expand(xu.shape[0], -1)
    inner = p.block.widths()[0]
    gate_w, up_w, down_w = merged.split((inner * d, inner * d, d * inner), dim=-1)
    act = getattr(p.block.experts, "act_fn", None) or F.silu
    gate_w, up_w, down_w = gate_w.view(-1, inner, d), up_w.view(-1, inner, d), down_w.view(-1, d, inner)
    h = act(torch.bmm(xu, gate_w.transpose(1, 2))) * torch.bmm(xu, up_w.transpose(1, 2))   # SwiGLU, one expert/unit
    y = torch.bmm(h, down_w.transpose(1, 2)).reshape(B, T + pad, d)[:, :T]
    if p.block.shared:
        flat = hidden_states.reshape(-1, d)
        shared = sum(m(flat) for m in p.block.shared)
        if p.block.shared_gate is not None:
            shared = torch.sigmoid(p.block.shared_gate(flat)) * shared
        y = y + shared.view(B, T, d)
    return y


def apply_merging(model: nn.Module, options: MergeOptions) -> list[MoEBlock]:
    """Patch every MoE block of `model` to merge its experts (see the module docstring); returns the blocks."""
    if options.mode not in MERGE_MODES:
        raise ValueError(f"Hugging Face merging supports modes {MERGE_MODES}; {options.mode!r} is the model itself")
    blocks = check_moe(model)
    chain = Chain()
    for b in blocks:
        E = b.num_experts
        merger = ExpertMerger(options.mode, E, options.gamma, options.beta_abs, options.beta_phase,
                              options.alpha_mode, options.mask, options.dare_p, options.nash_every)
        merger.train(model.training)
        index = chain.register() if merger.propagates else 0
        # Kept out of the module tree (object.__setattr__): the checkpoint keeps the model's own keys only.
        object.__setattr__(b.module, "_namex_patch", _Patch(b, merger, chain, index, options.segment,
                                                             options.top_k or E))
        b.module.forward = types.MethodType(_merged_forward, b.module)
    return blocks


def remove_merging(model: nn.Module) -> None:
    """Undo `apply_merging`: the blocks run their original sparse routing again."""
    for b in check_moe(model):
        if "_namex_patch" in vars(b.module):
            del b.module.forward
            object.__delattr__(b.module, "_namex_patch")


def set_merging_train(model: nn.Module, mode: bool) -> None:
    """Propagate train/eval to the (out-of-tree) mergers: DARE masks and the Nash refresh schedule depend on it."""
    for b in check_moe(model):
        patch = vars(b.module).get("_namex_patch")
        if patch is not None:
            patch.merger.train(mode)
