"""A Hugging Face architecture from its published `config.json` alone: no weights, nothing downloaded.

The paper configs (`configs/paper/hf/<model>/config.json`) hold the published config files of models whose weights
this platform cannot fetch. Under `torch.device("meta")` (`cli.py plan`) the model is built with shapes and dtypes
only; a folder that also holds `*.safetensors` / `*.bin` weights is loaded with `from_pretrained` instead.

    model = causal_lm("configs/paper/hf/Llama-3.2-1B")     # LlamaForCausalLM, 1.24 B parameters
"""
from __future__ import annotations

from pathlib import Path

import torch

from .errors import ConfigError, DatasetNotFoundError


def config_folder(path: str | Path) -> Path:
    """The folder of `path` (a folder holding config.json, or the config.json file itself)."""
    path = Path(path).expanduser()
    folder = path.parent if path.name == "config.json" else path
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder}: no config.json; point the model at a folder holding a Hugging Face config.json "
                          f"(e.g. configs/paper/hf/<model>/)")
    return folder


def has_weights(folder: str | Path) -> bool:
    folder = Path(folder)
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def default_device() -> torch.device:
    """The device new tensors land on (meta inside `with torch.device("meta")`)."""
    return torch.empty(0).device


def load_config(path: str | Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(config_folder(path)))


def build(path: str | Path, auto_class: str = "AutoModelForCausalLM", dtype: torch.dtype | None = None,
          require_weights_off_meta: bool = True) -> torch.nn.Module:
    """The model of `path`: weights from the folder when it has them, else the architecture alone.

    Off the meta device an architecture without weights is refused (random weights are never what a run wants), unless
    `require_weights_off_meta` is false (tests building a real-size random model on the CPU)."""
    import transformers

    folder = config_folder(path)
    cls = getattr(transformers, auto_class)
    if has_weights(folder):
        return cls.from_pretrained(str(folder), dtype=dtype) if dtype else cls.from_pretrained(str(folder))
    if require_weights_off_meta and default_device().type != "meta":
        raise DatasetNotFoundError(folder, "config.json only, no weights (*.safetensors)",
                                   "download the checkpoint into this folder, or run `cli.py plan` (meta device)")
    cfg = load_config(folder)
    return cls.from_config(cfg, dtype=dtype) if dtype else cls.from_config(cfg)


def causal_lm(path: str | Path, **kw) -> torch.nn.Module:
    return build(path, "AutoModelForCausalLM", **kw)
