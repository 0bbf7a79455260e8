"""Tiny random configs and models of the supported MoE architectures, for tests and smoke runs (no weights needed)."""
from __future__ import annotations

import torch
from torch import nn

from .layout import ARCHS, UnsupportedMoEError, moe_blocks


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
    elif arch == "deepseek":
        from .deepseek import DeepseekMoEConfig

        kw = dict(common, num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=2,
                  n_routed_experts=4, first_k_dense_replace=1, num_hidden_layers=3, norm_topk_prob=False)
        cls = DeepseekMoEConfig
    else:
        raise UnsupportedMoEError(f"unknown tiny architecture {arch!r}; choose from {', '.join(ARCHS)}")
    kw.update(overrides)
    return cls(**kw)


def tiny_model(arch: str, seed: int = 0, **overrides) -> nn.Module:
    """A random tiny causal LM of `arch` (weights scaled up so routing and experts matter), in eval mode."""
    from transformers import AutoModelForCausalLM

    from .deepseek_registry import register_deepseek

    register_deepseek()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides))
    with torch.no_grad():
        for b in moe_blocks(model):  # the default init (std 0.02) makes routers nearly uniform; spread them out
            b.router.weight.normal_(0.0, 0.5)
    return model.eval()
