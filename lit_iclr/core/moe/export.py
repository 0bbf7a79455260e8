"""Converting expert layouts and saving: unfuse to `VariableWidthExperts`, fuse back zero-padded, save (HF or compact).

- `unfuse_experts(model)`: every block's experts become `VariableWidthExperts` (outputs unchanged, in place).
- `fuse_experts(model)`: back to transformers' fused class, each expert zero-padded to one common width (padded atoms
  contribute `act(0) * 0 = 0`, so outputs are identical); updates the config's width attribute.
- `padded_width` / `common_width`: the one width an HF config can express for pruned experts.
- `save_hf(model, out_dir)`: fuse + `save_pretrained` (loads back with no custom code); `save_compact(model, out_dir)`:
  each expert's own width kept (safetensors + `expert_widths.json`, read by `loading.load_compact`).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .experts import VariableWidthExperts
from .layout import WIDTH_ATTR, MoEBlock, UnsupportedMoEError, check_moe


def _act_of(experts: nn.Module, config) -> str | Callable:
    act = getattr(config, "hidden_act", None) if config is not None else None
    return act if isinstance(act, str) else getattr(experts, "act_fn", nn.functional.silu)


def unfuse_experts(model: nn.Module) -> nn.Module:
    """Replace each block's experts by `VariableWidthExperts` holding the same weights (in place; outputs unchanged)."""
    config = getattr(model, "config", None)
    for b in check_moe(model):
        if b.layout == "variable":
            continue
        ref = b.get_expert(0).gate
        new = VariableWidthExperts(b.hidden_size, b.widths(), _act_of(b.experts, config), dtype=ref.dtype,
                                   device=ref.device)
        for e in range(b.num_experts):
            w = b.get_expert(e)
            with torch.no_grad():
                m = new[e]
                m.gate_proj.weight.copy_(w.gate)
                m.up_proj.weight.copy_(w.up)
                m.down_proj.weight.copy_(w.down)
        new.train(b.experts.training)
        b.module.experts = new
    return model


def _fused_class(model: nn.Module, block: MoEBlock):
    """transformers' experts class of this architecture (from the modeling module of the block's class)."""
    import importlib

    mod = importlib.import_module(type(block.module).__module__)
    for obj in vars(mod).values():
        if isinstance(obj, type) and obj.__name__.endswith("Experts") and issubclass(obj, nn.Module):
            return obj
    raise UnsupportedMoEError(f"{type(model).__name__}: no fused experts class in {mod.__name__}")


def padded_width(config, kept: int, align: int = 8) -> int:
    """The one width an HF config can express for experts whose largest kept width is `kept`: rounded up to a multiple
    of `align` (transformers' grouped-GEMM kernels need 16-byte strides) and, for DeepSeek, to a divisor of the shared
    experts' width (`moe_intermediate_size * n_shared_experts` must keep its value)."""
    width = -(-kept // align) * align
    if getattr(config, "n_shared_experts", None) and config.model_type.startswith("deepseek"):
        total = config.moe_intermediate_size * config.n_shared_experts
        fits = [w for w in range(width, total + 1) if total % w == 0 and w % align == 0]
        fits = fits or [w for w in range(kept, total + 1) if total % w == 0]
        width = fits[0] if fits else width
    return width


def common_width(model: nn.Module, align: int = 8) -> int:
    """`padded_width` for the largest kept expert width of an in-memory model."""
    blocks = check_moe(model)
    return padded_width(model.config, max(max(b.widths()) for b in blocks), align)


# Architectures whose Hugging Face checkpoints hold one tensor per expert (our native DeepSeek-MoE): "fused" = equal widths.
NATIVE_PER_EXPERT = ("deepseek",)


def fuse_experts(model: nn.Module, width: int | None = None) -> nn.Module:
    """Back to transformers' fused experts (zero-padded to `width`, default `common_width`); updates the config."""
    blocks = check_moe(model)
    width = width or common_width(model)
    cfg = model.config
    shared_total = (cfg.moe_intermediate_size * cfg.n_shared_experts
                    if getattr(cfg, "n_shared_experts", None) and cfg.model_type.startswith("deepseek") else None)
    setattr(cfg, WIDTH_ATTR.get(cfg.model_type, "moe_intermediate_size"), width)
    if shared_total is not None:
        if shared_total % width:
            raise ValueError(f"width {width} does not divide the shared experts' width {shared_total}")
        cfg.n_shared_experts = shared_total // width
    for b in blocks:
        if b.layout == "module_list":
            raise UnsupportedMoEError(f"{b.name}: ModuleList experts are the model's native layout; save it as is")
        ref = b.get_expert(0).gate
        if cfg.model_type in NATIVE_PER_EXPERT:  # checkpoints store one tensor per expert: pad them to one width
            new = VariableWidthExperts(b.hidden_size, [width] * b.num_experts, _act_of(b.experts, cfg),
                                       dtype=ref.dtype, device=ref.device)
            with torch.no_grad():
                for e in range(b.num_experts):
                    new[e].gate_proj.weight.zero_()
                    new[e].up_proj.weight.zero_()
                    new[e].down_proj.weight.zero_()
                    w, i = b.get_expert(e), b.get_expert(e).width
                    new[e].gate_proj.weight[:i], new[e].up_proj.weight[:i] = w.gate, w.up
                    new[e].down_proj.weight[:, :i] = w.down
            new.train(b.experts.training)
            b.module.experts = new
            continue
        cls = _fused_class(model, b)
        with torch.device("meta"):
            new = cls(cfg)
        gu = torch.zeros(b.num_experts, 2 * width, b.hidden_size, dtype=ref.dtype, device=ref.device)
        dn = torch.zeros(b.num_experts, b.hidden_size, width, dtype=ref.dtype, device=ref.device)
        for e in range(b.num_experts):
            w = b.get_expert(e)
            i = w.width
            if i > width:
                raise ValueError(f"{b.name} expert {e} has width {i} > {width}")
            gu[e, :i], gu[e, width: width + i], dn[e, :, :i] = w.gate, w.up, w.down
        if getattr(new, "is_transposed", False):
            gu, dn = gu.transpose(1, 2).contiguous(), dn.transpose(1, 2).contiguous()
        new.gate_up_proj = nn.Parameter(gu)
        new.down_proj = nn.Parameter(dn)
        new.train(b.experts.training)
        b.module.experts = new
    return model


# ------------------------------------------------------------------------------------------------------ save / load
def save_hf(model: nn.Module, out_dir: str | Path, tokenizer=None) -> Path:
    """Save in the standard Hugging Face layout (fused, zero-padded to one width); modifies `model` in place."""
    out_dir = Path(out_dir)
    fuse_experts(model)
    model.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


def save_compact(model: nn.Module, out_dir: str | Path, tokenizer=None) -> Path:
    """Save with each expert's own width: `config.json` + `expert_widths.json` + `model.safetensors`."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks = check_moe(model)
    model.config.save_pretrained(out_dir)
    widths = {b.name: b.widths() for b in blocks}
    (out_dir / "expert_widths.json").write_text(json.dumps(widths, indent=1))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}  # HF per-expert names already
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied:
        state.pop("lm_head.weight", None)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt", "layout": "variable-width"})
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
