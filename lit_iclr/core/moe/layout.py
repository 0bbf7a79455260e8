"""A uniform view of the Mixture-of-Experts blocks of Hugging Face causal LMs, whatever their expert layout.

Layouts understood (each block's `experts` module):

- `"fused"`: transformers 5's 3-D parameters `experts.gate_up_proj [E, 2I, d]` (gate rows first, then up rows) and
  `experts.down_proj [E, d, I]` (or their transposes when `experts.is_transposed`);
- `"module_list"`: an `nn.ModuleList` of SwiGLU MLPs with `gate_proj/up_proj/down_proj` (or Mixtral-v4 `w1/w3/w2`)
  `nn.Linear`s (transformers 4.x, our native DeepSeek-MoE, ...);
- `"variable"`: `VariableWidthExperts`, where each expert has its own intermediate width.

`moe_blocks(model) -> list[MoEBlock]` (layer order); an `MoEBlock` has `name`, `layer`, `module`, `router` (`.weight`
[E, d]), `experts`, `layout`, `num_experts`, `hidden_size`, `shared` (shared-expert MLPs), `shared_gate` (Qwen2-MoE's
sigmoid gate or None), `widths()`, `get_expert(e)` / `set_expert(e, w)` (`ExpertWeights` views), `stacked()`,
`route(x)` (the model's own router: softmax top-k, or DeepSeek-V3's sigmoid grouped router through the model's own
module) and `expert_forward(e, x)`. `check_moe` raises `UnsupportedMoEError` naming the model when there is no block.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError
from .experts import VariableWidthExperts

ARCHS = ("qwen2_moe", "mixtral", "deepseek_v2", "deepseek_v3", "deepseek")
# Config attribute holding the routed experts' intermediate width (Mixtral reuses `intermediate_size`).
WIDTH_ATTR = {"mixtral": "intermediate_size"}


class UnsupportedMoEError(ConfigError):
    """The model has no MoE block in a layout this module understands."""


@dataclass
class ExpertWeights:
    """One SwiGLU expert y = down (act(gate x) * (up x)); atomic expert k = (gate[k], up[k], down[:, k])."""

    gate: torch.Tensor  # [I, d]
    up: torch.Tensor  # [I, d]
    down: torch.Tensor  # [d, I]

    @property
    def width(self) -> int:
        return int(self.gate.shape[-2])

    def select(self, keep: torch.Tensor) -> ExpertWeights:
        """The expert restricted to atoms `keep` (indices or bool mask over I)."""
        return ExpertWeights(self.gate[..., keep, :], self.up[..., keep, :], self.down[..., keep])



def _linear_names(expert: nn.Module) -> tuple[str, str, str] | None:
    for names in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")):
        if all(isinstance(getattr(expert, n, None), nn.Linear) for n in names):
            return names
    return None


def _layout(experts: nn.Module) -> str | None:
    if isinstance(experts, VariableWidthExperts):
        return "variable"
    gu, dn = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and gu.dim() == 3 and dn.dim() == 3:
        if getattr(experts, "is_concatenated", True) and getattr(experts, "has_gate", True) \
                and not getattr(experts, "has_bias", False):
            return "fused"
        return None
    if isinstance(experts, nn.ModuleList) and len(experts) and all(_linear_names(m) for m in experts):
        return "module_list"
    return None


class MoEBlock:
    """See the module docstring."""

    def __init__(self, name: str, layer: int, module: nn.Module):
        self.name, self.layer, self.module = name, layer, module
        self.router = getattr(module, "gate", None) if hasattr(module, "gate") else getattr(module, "router", None)
        self.layout = _layout(module.experts)
        shared = getattr(module, "shared_expert", None) or getattr(module, "shared_experts", None)
        self.shared = list(shared) if isinstance(shared, nn.ModuleList) else ([shared] if shared is not None else [])
        self.shared_gate = getattr(module, "shared_expert_gate", None)

    def __repr__(self) -> str:
        return f"MoEBlock({self.name}, {self.layout}, experts={self.num_experts}, widths={self.widths()})"

    @property
    def experts(self) -> nn.Module:
        return self.module.experts

    @property
    def transposed(self) -> bool:
        return bool(getattr(self.experts, "is_transposed", False))

    @property
    def num_experts(self) -> int:
        if self.layout == "fused":
            return int(self.experts.gate_up_proj.shape[0])
        return len(self.experts)

    @property
    def hidden_size(self) -> int:
        return int(self.router.weight.shape[-1])

    def _modules(self, e: int) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        m = self.experts[e]
        names = _linear_names(m)
        return tuple(getattr(m, n) for n in names)  # type: ignore[return-value]

    def widths(self) -> list[int]:
        if self.layout == "fused":
            gu = self.experts.gate_up_proj
            return [int(gu.shape[-1 if self.transposed else 1]) // 2] * self.num_experts
        return [self._modules(e)[0].out_features for e in range(self.num_experts)]

    def get_expert(self, e: int) -> ExpertWeights:
        if self.layout == "fused":
            gu, dn = self.experts.gate_up_proj[e], self.experts.down_proj[e]
            if self.transposed:  # [d, 2I] and [I, d]
                gu, dn = gu.t(), dn.t()
            i = gu.shape[0] // 2
            return ExpertWeights(gu[:i], gu[i:], dn)
        g, u, d = self._modules(e)
        return ExpertWeights(g.weight, u.weight, d.weight)

    def set_expert(self, e: int, w: ExpertWeights) -> None:
        with torch.no_grad():
            if self.layout == "fused":
                cur = self.get_expert(e)
                if w.width != cur.width:
                    raise ValueError(f"{self.name}: fused experts share one width ({cur.width}); got {w.width}. "
                                     "Call unfuse_experts(model) first to give experts their own widths.")
                cur.gate.copy_(w.gate)
                cur.up.copy_(w.up)
                cur.down.copy_(w.down)
                return
            for lin, t in zip(self._modules(e), (w.gate, w.up, w.down), strict=True):
                if lin.weight.shape == t.shape:
                    lin.weight.copy_(t)
                else:
                    lin.weight = nn.Parameter(t.detach().clone().to(lin.weight.dtype), lin.weight.requires_grad)
                    lin.out_features, lin.in_features = t.shape

    def stacked(self) -> ExpertWeights:
        ws = [self.get_expert(e) for e in range(self.num_experts)]
        if len(set(w.width for w in ws)) != 1:
            raise ValueError(f"{self.name}: experts have different widths {self.widths()}; cannot stack")
        return ExpertWeights(*(torch.stack([getattr(w, f) for w in ws]) for f in ("gate", "up", "down")))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(router logits, top-k weights, top-k expert indices) from the model's own router.

        Routers that return the triple themselves (Qwen2-MoE, Mixtral in transformers 5) are used as they are; blocks
        with their own selection rule (`route_tokens_to_experts`: DeepSeek-V3's sigmoid scores with a per-expert bias,
        group-limited top-k and a scaling factor) route through it; a plain linear router gets softmax top-k.
        """
        x = x.reshape(-1, self.hidden_size)
        out = self.router(x)
        if isinstance(out, tuple) and len(out) == 3:
            return out
        logits = out[0] if isinstance(out, tuple) else out
        own_rule = getattr(self.module, "route_tokens_to_experts", None)
        if own_rule is not None:
            idx, w = own_rule(logits)
            return logits, w.to(x.dtype), idx
        k = int(getattr(self.module, "top_k", getattr(self.module, "num_experts_per_tok", 2)))
        probs = logits.float().softmax(-1)
        w, idx = probs.topk(k, dim=-1)
        if getattr(self.module, "norm_topk_prob", False):
            w = w / w.sum(-1, keepdim=True)
        return logits, w.to(x.dtype), idx

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Per-expert router scores of the whole distribution (for merging): sigmoid for DeepSeek-V3-style routers
        (`scoring_func`/`route_tokens_to_experts` with a correction bias), softmax otherwise."""
        if getattr(self.router, "e_score_correction_bias", None) is not None \
                or getattr(self.module, "scoring_func", "softmax") == "sigmoid":
            return logits.float().sigmoid()
        return logits.float().softmax(-1)

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        w = self.get_expert(e)
        act = getattr(self.experts, "act_fn", None) or nn.functional.silu
        if self.layout == "module_list":
            act = getattr(self.experts[e], "act_fn", None) or act
        return nn.functional.linear(act(nn.functional.linear(x, w.gate)) * nn.functional.linear(x, w.up), w.down)


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def moe_blocks(model: nn.Module) -> list[MoEBlock]:
    """Every MoE block of `model` (modules with a router and a recognised `experts` module), in layer order."""
    blocks = []
    for name, module in model.named_modules():
        experts = getattr(module, "experts", None)
        router = getattr(module, "gate", None) if hasattr(module, "gate") else getattr(module, "router", None)
        if not isinstance(experts, nn.Module) or not isinstance(router, nn.Module):
            continue
        if not isinstance(getattr(router, "weight", None), torch.Tensor) or _layout(experts) is None:
            continue
        m = _LAYER.search(f".{name}.")
        blocks.append(MoEBlock(name, int(m.group(1)) if m else len(blocks), module))
    return blocks


def check_moe(model: nn.Module) -> list[MoEBlock]:
    """`moe_blocks(model)`, or `UnsupportedMoEError` naming the architecture when there is none."""
    blocks = moe_blocks(model)
    if not blocks:
        cfg = getattr(model, "config", None)
        kind = getattr(cfg, "model_type", None) or "?"
        raise UnsupportedMoEError(
            f"{type(model).__name__} (model_type {kind!r}) has no Mixture-of-Experts block in a known layout: expected a "
            "module with a router `gate`/`router` (weight [E, d]) and `experts` as transformers-5 fused SwiGLU tensors "
            "(gate_up_proj [E, 2I, d], down_proj [E, d, I]) or a ModuleList of gate_proj/up_proj/down_proj MLPs. "
            f"Tested architectures: {', '.join(ARCHS)}.")
    return blocks


def detect_layout(model: nn.Module) -> str:
    """The experts layout of `model` ("fused", "module_list", "variable", or "mixed")."""
    layouts = {b.layout for b in check_moe(model)}
    return layouts.pop() if len(layouts) == 1 else "mixed"

