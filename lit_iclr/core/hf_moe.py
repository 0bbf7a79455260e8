"""A uniform view of the Mixture-of-Experts blocks of Hugging Face causal LMs (transformers 5.x), whatever their layout.

Supported (tested on tiny random configs): Qwen2-MoE (Qwen1.5-MoE-A2.7B: routed + one gated shared expert), Mixtral
(routed only), DeepSeek-V2/V3 (routed + shared experts, dense first layers), and any model whose MoE block has a router
`gate` (or `router`) and an `experts` module in one of these layouts:

- `"fused"`: transformers 5's 3-D parameters `experts.gate_up_proj [E, 2I, d]` (gate rows first, then up rows) and
  `experts.down_proj [E, d, I]` (or their transposes when `experts.is_transposed`);
- `"module_list"`: an `nn.ModuleList` of SwiGLU MLPs with `gate_proj/up_proj/down_proj` (or Mixtral-v4 `w1/w3/w2`)
  `nn.Linear`s (transformers 4.x, DeepSeek-MoE remote code, ...);
- `"variable"`: our `VariableWidthExperts` (below), where each expert has its own intermediate width.

Anything else raises `UnsupportedMoEError` (a `ConfigError`) naming the model class and the layouts that are understood.
Never uses `trust_remote_code`.

API
---
- `moe_blocks(model) -> list[MoEBlock]`, in layer order. An `MoEBlock` has `name`, `layer` (decoder index), `module`
  (the HF block), `router` (module; `.weight` is [E, d]), `experts` (module), `layout`, `num_experts`, `hidden_size`,
  `shared` (list of shared-expert MLP modules, possibly empty), `shared_gate` (Qwen2-MoE's sigmoid gate or None), and:
    - `widths() -> list[int]`: intermediate width of each routed expert;
    - `get_expert(e) -> ExpertWeights(gate [I, d], up [I, d], down [d, I])` (views into the model's storage);
    - `set_expert(e, weights)`: write an expert (any width for "variable"/"module_list"; same width for "fused");
    - `stacked() -> ExpertWeights` with a leading expert dim (needs equal widths);
    - `route(x [T, d]) -> (logits [T, E], top_k_weights [T, k], top_k_index [T, k])` through the model's own router;
    - `expert_forward(e, x [T, d]) -> [T, d]`: one expert's SwiGLU output, before the router weight.
- `detect_layout(model) -> str`; `check_moe(model)` raises `UnsupportedMoEError` when no MoE block is found.
- `VariableWidthExperts(hidden_size, widths, act)`: drop-in for transformers' fused experts (same
  `forward(hidden_states, top_k_index, top_k_weights)`), one `ExpertMLP` per expert whose state-dict keys
  (`experts.<e>.gate_proj.weight` ...) are exactly those of Hugging Face checkpoints on disk; its optional `observer`
  sees `(e, token_idx, h, y)` of every expert call (h: intermediate activations, y: expert output before the router
  weight), which is how calibration statistics are gathered without copying the model.
- `unfuse_experts(model)`: replace every expert module by `VariableWidthExperts` (outputs unchanged, in place).
- `fuse_experts(model)`: back to transformers' fused class, each expert zero-padded to one common width (the exact zeros
  make padded atoms contribute `silu(0) * 0 = 0`, so outputs are identical); updates the config's width attribute.
- `save_hf(model, out_dir, tokenizer=None)`: `fuse_experts` + `save_pretrained`: `AutoModelForCausalLM.from_pretrained`
  loads it back with no custom code.
- `save_compact(model, out_dir)` / `load_compact(dir)`: per-expert widths kept (physically smaller), safetensors.
- `tiny_config(arch, **overrides)`, `tiny_model(arch, seed)`: small random configs of "qwen2_moe", "mixtral",
  "deepseek_v2", "deepseek_v3" for tests.
- `load_pretrained(path, dtype)`: a local HF checkpoint folder with clear errors; `Checkpoint(path)`: lazy safetensors
  access (`keys()`, `get(key)`, `load_into(module, prefix)` understanding per-expert, Mixtral `w1/w2/w3` and fused keys),
  `meta_model(path_or_config)`: the architecture on the meta device (nothing allocated), for layer-by-layer streaming.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .errors import ConfigError, DatasetFormatError, DatasetNotFoundError

ARCHS = ("qwen2_moe", "mixtral", "deepseek_v2", "deepseek_v3")
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


# ------------------------------------------------------------------------------------------- variable-width experts
class ExpertMLP(nn.Module):
    """One SwiGLU expert with its own width (named like Hugging Face's per-expert checkpoint tensors)."""

    def __init__(self, hidden_size: int, width: int, dtype=None, device=None):
        super().__init__()
        kw = {"dtype": dtype, "device": device, "bias": False}
        self.gate_proj = nn.Linear(hidden_size, width, **kw)
        self.up_proj = nn.Linear(hidden_size, width, **kw)
        self.down_proj = nn.Linear(width, hidden_size, **kw)


class VariableWidthExperts(nn.ModuleList):
    """Routed experts, expert e with width I_e; same forward signature as transformers' fused experts modules.

    A `ModuleList` of `ExpertMLP`, so its state-dict keys are `<e>.gate_proj.weight` ..., i.e. the per-expert names of
    Hugging Face checkpoints on disk (`mlp.experts.3.down_proj.weight`).
    """

    def __init__(self, hidden_size: int, widths: list[int], act: str | Callable = "silu", dtype=None, device=None):
        super().__init__(ExpertMLP(hidden_size, int(w), dtype, device) for w in widths)
        from transformers.activations import ACT2FN

        self.hidden_dim = hidden_size
        self.num_experts = len(widths)
        fn = ACT2FN[act] if isinstance(act, str) else act
        object.__setattr__(self, "act_fn", fn)  # a plain attribute: not a child of the ModuleList
        # observer(e, token_idx, h, y) is called for each expert call when set (calibration); never saved.
        self.observer: Callable | None = None

    def widths(self) -> list[int]:
        return [m.gate_proj.out_features for m in self]

    def expert_forward(self, e: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, y) of expert e: h = act(gate x) * up x (the atoms' activations h_k), y = down h."""
        m = self[e]
        h = self.act_fn(m.gate_proj(x)) * m.up_proj(x)
        return h, m.down_proj(h)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
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


# ----------------------------------------------------------------------------------------------------- block view
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
        """(router logits, top-k weights, top-k expert indices) from the model's own router."""
        out = self.router(x.reshape(-1, self.hidden_size))
        if isinstance(out, tuple) and len(out) == 3:
            return out
        logits = out[0] if isinstance(out, tuple) else out  # a plain nn.Linear router (transformers 4.x layouts)
        k = int(getattr(self.module, "top_k", getattr(self.module, "num_experts_per_tok", 2)))
        probs = logits.float().softmax(-1)
        w, idx = probs.topk(k, dim=-1)
        if getattr(self.module, "norm_topk_prob", False):
            w = w / w.sum(-1, keepdim=True)
        return logits, w.to(x.dtype), idx

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


def _read_config(path: Path):
    from transformers import AutoConfig

    if not (path / "config.json").exists():
        raise DatasetNotFoundError(path / "config.json", "no config.json: not a Hugging Face checkpoint folder",
                                   "point at a folder written by save_pretrained / downloaded from the hub")
    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, KeyError, OSError) as e:
        raise UnsupportedMoEError(f"{path}: transformers cannot read this config without remote code ({e}); "
                                  f"supported MoE architectures: {', '.join(ARCHS)}") from e


def meta_model(path_or_config, dtype: torch.dtype | None = None) -> nn.Module:
    """The causal-LM architecture of a checkpoint folder (or config) on the meta device: no memory allocated."""
    from transformers import AutoModelForCausalLM

    config = _read_config(Path(path_or_config)) if isinstance(path_or_config, str | Path) else path_or_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False,
                                                 **({"dtype": dtype} if dtype else {}))
    return model


def load_compact(path: str | Path, dtype: torch.dtype | None = None) -> nn.Module:
    """Load a `save_compact` folder: the HF architecture with `VariableWidthExperts` of the saved widths."""
    path = Path(path)
    wfile = path / "expert_widths.json"
    if not wfile.exists():
        raise DatasetNotFoundError(wfile, "no expert_widths.json: not a compact pruned checkpoint",
                                   "use load_pretrained for standard Hugging Face folders")
    widths = json.loads(wfile.read_text())
    model = meta_model(path, dtype)
    blocks = {b.name: b for b in check_moe(model)}
    for name, ws in widths.items():
        if name not in blocks:
            raise DatasetFormatError(wfile, f"block {name} does not exist in this architecture",
                                     "the widths file belongs to another model")
        b = blocks[name]
        b.module.experts = VariableWidthExperts(b.hidden_size, ws, _act_of(b.experts, model.config), device="meta")
    ckpt = Checkpoint(path)
    materialize(model)
    ckpt.load_into(model, "")
    if dtype is not None:
        model.to(dtype)
    model.eval()
    return model


def load_pretrained(path: str | Path, dtype: torch.dtype | None = None) -> nn.Module:
    """A local HF checkpoint folder (safetensors) as a causal LM, or a compact pruned one; checks it is an MoE."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if (path / "expert_widths.json").exists():
        return load_compact(path, dtype)
    _read_config(path)
    if not any(path.glob("*.safetensors")):
        raise DatasetNotFoundError(path, "no *.safetensors weights in the checkpoint folder",
                                   "convert the weights to safetensors (pickled .bin files are not loaded)")
    model = AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=False, use_safetensors=True,
                                                 **({"dtype": dtype} if dtype else {}))
    check_moe(model)
    return model.eval()


def materialize(module: nn.Module, device: str | torch.device = "cpu") -> nn.Module:
    """Allocate a meta-device module on `device` (uninitialised) and recompute its non-persistent rotary buffers."""
    module.to_empty(device=device)
    for sub in module.modules():
        if isinstance(getattr(sub, "inv_freq", None), torch.Tensor) and hasattr(sub, "config"):
            fresh = type(sub)(sub.config)  # rotary embeddings: buffers computed at init, never stored in checkpoints
            for name, buf in fresh.named_buffers(recurse=False):
                setattr(sub, name, buf.to(device))
    return module


class Checkpoint:
    """Lazy access to the safetensors of a checkpoint folder (single file or sharded with an index)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            try:
                self.where = {k: self.path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
            except (json.JSONDecodeError, KeyError) as e:
                raise DatasetFormatError(index, f"malformed safetensors index ({e})", "re-download the index") from e
        else:
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise DatasetNotFoundError(self.path, "no *.safetensors files", "point at a safetensors checkpoint")
            from safetensors import safe_open

            self.where = {}
            for f in files:
                with safe_open(str(f), "pt") as h:
                    self.where.update({k: f for k in h.keys()})
        self._handles: dict[Path, object] = {}

    def keys(self) -> list[str]:
        return list(self.where)

    def _handle(self, f: Path):
        from safetensors import safe_open

        if f not in self._handles:
            self._handles[f] = safe_open(str(f), "pt")
        return self._handles[f]

    def get(self, key: str) -> torch.Tensor:
        return self._handle(self.where[key]).get_tensor(key)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle(self.where[key]).get_slice(key).get_shape())

    def _lookup(self, key: str) -> torch.Tensor:
        """The tensor for our module key `key`, trying the known on-disk spellings of expert tensors."""
        if key in self.where:
            return self.get(key)
        m = re.match(r"(.*)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", key)
        if m:
            pre, e, proj = m.group(1), int(m.group(2)), m.group(3)
            for cand in (f"{pre}.experts.{e}.{proj}.weight",
                         f"{pre.replace('.mlp', '.block_sparse_moe')}.experts.{e}."
                         f"{ {'gate_proj': 'w1', 'up_proj': 'w3', 'down_proj': 'w2'}[proj]}.weight"):
                if cand in self.where:
                    return self.get(cand)
            if f"{pre}.experts.gate_up_proj" in self.where:  # fused on disk: slice expert e
                if proj == "down_proj":
                    return self.get(f"{pre}.experts.down_proj")[e]
                gu = self.get(f"{pre}.experts.gate_up_proj")[e]
                i = gu.shape[0] // 2
                return gu[:i] if proj == "gate_proj" else gu[i:]
        alias = key.replace(".mlp.gate.", ".block_sparse_moe.gate.")
        if alias in self.where:
            return self.get(alias)
        raise DatasetFormatError(self.path, f"tensor {key!r} is not in the checkpoint",
                                 "the checkpoint does not match its config.json")

    def load_into(self, module: nn.Module, prefix: str) -> None:
        """Fill `module` (materialised, e.g. after `to_empty`) with the tensors under `prefix` (e.g. 'model.layers.3.')."""
        own = module.state_dict()
        tied = prefix == "" and "lm_head.weight" in own and "lm_head.weight" not in self.where
        with torch.no_grad():
            for name, t in own.items():
                key = prefix + name
                if tied and name == "lm_head.weight":
                    src = self._lookup("model.embed_tokens.weight")
                else:
                    src = self._lookup(key)
                if tuple(src.shape) != tuple(t.shape):
                    raise DatasetFormatError(self.where.get(key, self.path), f"{key}: shape {tuple(src.shape)} in the "
                                             f"checkpoint, {tuple(t.shape)} in the model",
                                             "the checkpoint does not match its config.json / expert_widths.json")
                t.copy_(src.to(t.dtype))


# --------------------------------------------------------------------------------------------------- tiny configs
def tiny_config(arch: str, **overrides):
    """A small random-init config of `arch` (hidden 32, 2-4 experts of width 16, 2 layers) for tests."""
    from transformers import DeepseekV2Config, DeepseekV3Config, MixtralConfig, Qwen2MoeConfig

    common = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, num_experts_per_tok=2, tie_word_embeddings=False)
    if arch == "qwen2_moe":
        kw = dict(common, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                  num_experts=4, norm_topk_prob=False)
        cls = Qwen2MoeConfig
    elif arch == "mixtral":
        kw = dict(common, intermediate_size=16, num_local_experts=4)
        cls = MixtralConfig
    elif arch in ("deepseek_v2", "deepseek_v3"):
        kw = dict(common, num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=2,
                  n_routed_experts=4, first_k_dense_replace=1, num_hidden_layers=3, q_lora_rank=None, kv_lora_rank=16,
                  qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=8, n_group=1, topk_group=1,
                  norm_topk_prob=True, routed_scaling_factor=1.0)
        if arch == "deepseek_v2":
            kw["topk_method"] = "greedy"
        cls = DeepseekV2Config if arch == "deepseek_v2" else DeepseekV3Config
    else:
        raise UnsupportedMoEError(f"unknown tiny architecture {arch!r}; choose from {', '.join(ARCHS)}")
    kw.update(overrides)
    return cls(**kw)


def tiny_model(arch: str, seed: int = 0, **overrides) -> nn.Module:
    """A random tiny causal LM of `arch` (weights scaled up so routing and experts matter), in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides))
    with torch.no_grad():
        for b in moe_blocks(model):  # the default init (std 0.02) makes routers nearly uniform; spread them out
            b.router.weight.normal_(0.0, 0.5)
    return model.eval()
