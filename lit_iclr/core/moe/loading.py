"""Loading Hugging Face MoE checkpoints from local safetensors folders, never with remote code.

- `load_pretrained(path, dtype)`: a checkpoint folder as a causal LM (or a compact pruned one), with clear errors;
  DeepSeek-MoE (`model_type: deepseek`, whose Hugging Face code is remote) is built from our native module.
- `load_compact(path)`: a `save_compact` folder (per-expert widths).
- `meta_model(path_or_config)`: the architecture on the meta device (nothing allocated), for layer-by-layer streaming;
  `materialize(module)`: allocate it and recompute the rotary buffers.
- `Checkpoint(path)`: lazy safetensors access (`keys()`, `get(key)`, `load_into(module, prefix)`) understanding
  per-expert, Mixtral `w1/w2/w3` and fused expert keys.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from ..errors import DatasetFormatError, DatasetNotFoundError
from .deepseek_registry import register_deepseek
from .experts import VariableWidthExperts
from .export import _act_of
from .layout import ARCHS, UnsupportedMoEError, check_moe


def _read_config(path: Path):
    from transformers import AutoConfig

    register_deepseek()  # model_type "deepseek": our native module, not the remote code
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

    register_deepseek()
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
    register_deepseek()
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
