"""A published MoE architecture from its `config.json` alone: full size, random weights, no checkpoint needed.

Paper-scale configs (configs/paper/) name a folder holding a model's published config.json (configs/paper/hf/...):
`published_model(folder)` builds that architecture on whatever device is current (the meta device for `cli.py plan`:
nothing allocated), with transformers' own modules or the native DeepSeek-MoE, never remote code.
"""
from __future__ import annotations

from pathlib import Path

from torch import nn

from ..errors import DatasetNotFoundError
from .deepseek_registry import register_deepseek
from .layout import check_moe


def published_config(path: str | Path):
    """The transformers config in `path` (a folder holding config.json, or the file itself)."""
    from transformers import AutoConfig

    folder = Path(path)
    folder = folder.parent if folder.name == "config.json" else folder
    if not (folder / "config.json").is_file():
        raise DatasetNotFoundError(folder / "config.json", "no config.json of the published model",
                                   "point at a folder holding one, e.g. configs/paper/hf/deepseek-moe-16b-base")
    register_deepseek()  # model_type "deepseek": the native module, never remote code
    return AutoConfig.from_pretrained(str(folder), trust_remote_code=False)


def published_model(path: str | Path, experts_implementation: str | None = None) -> nn.Module:
    """The causal LM of the config.json in `path` with random weights, on the current device; checks it is an MoE.
    `experts_implementation` picks transformers' fused-experts kernel (the native DeepSeek-MoE has its own)."""
    from transformers import AutoModelForCausalLM

    config = published_config(path)
    kernel = {"experts_implementation": experts_implementation} \
        if experts_implementation and config.model_type != "deepseek" else {}
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False, **kernel)
    check_moe(model)
    return model
