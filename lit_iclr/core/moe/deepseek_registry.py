"""`register_deepseek()` without importing transformers' Llama modules until a DeepSeek-MoE model is needed."""
from __future__ import annotations


def register_deepseek() -> None:
    """Make `AutoConfig` / `AutoModelForCausalLM` understand `model_type: deepseek` (our native module, no remote code)."""
    from .deepseek import register_deepseek as register

    register()
