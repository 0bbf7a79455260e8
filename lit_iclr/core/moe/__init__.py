"""Mixture-of-Experts support for Hugging Face causal LMs (transformers 5.x), one concern per module.

- `layout`: a uniform view of MoE blocks whatever their expert layout (`moe_blocks`, `MoEBlock`, `check_moe`).
- `experts`: `VariableWidthExperts` (each expert its own width) with a grouped, sync-free forward.
- `export`: unfuse / fuse expert layouts, save in the HF layout (zero-padded) or compact (own widths).
- `loading`: local safetensors checkpoints (`load_pretrained`, `Checkpoint`, `meta_model`), never remote code.
- `deepseek`: a native DeepSeek-MoE (`model_type: deepseek`) whose Hugging Face modeling code is remote.
- `sharding`: FSDP2 (`fully_shard`) per decoder block and recomputation-safe activation checkpointing.
- `memory`: the memory plan of a (merging) fine-tune for a model and a device count.
- `consolidate`: a distributed (sharded) checkpoint into one consolidated safetensors file.
- `tiny`: tiny random configs/models for tests.

Supported (tested on tiny random configs): Qwen2-MoE (Qwen1.5-MoE-A2.7B), Mixtral, DeepSeek-V2/V3 (transformers' own
modules) and DeepSeek-MoE (native). Never uses `trust_remote_code`.
"""
from .experts import ExpertMLP, VariableWidthExperts, width_classes
from .export import common_width, fuse_experts, padded_width, save_compact, save_hf, unfuse_experts
from .layout import ARCHS, WIDTH_ATTR, ExpertWeights, MoEBlock, UnsupportedMoEError, check_moe, detect_layout, moe_blocks
from .loading import Checkpoint, load_compact, load_pretrained, materialize, meta_model
from .tiny import tiny_config, tiny_model

__all__ = ["ARCHS", "WIDTH_ATTR", "Checkpoint", "ExpertMLP", "ExpertWeights", "MoEBlock", "UnsupportedMoEError",
           "VariableWidthExperts", "check_moe", "common_width", "detect_layout", "fuse_experts", "load_compact",
           "load_pretrained", "materialize", "meta_model", "moe_blocks", "padded_width", "save_compact", "save_hf",
           "tiny_config", "tiny_model", "unfuse_experts", "width_classes"]
