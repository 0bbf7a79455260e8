"""The MoE language models HEAPr prunes: Hugging Face architectures built from a few sizes, or a local checkpoint.

Plain PyTorch/transformers, no Lightning. `build_moe_lm("qwen2_moe", ...)` is the Qwen1.5-MoE-A2.7B architecture
(routed experts + one sigmoid-gated shared expert in every layer) at a size that trains on a CPU in minutes.
"""
from __future__ import annotations

from torch import nn

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.moe import ARCHS, check_moe, load_pretrained


def moe_config(arch: str = "qwen2_moe", vocab_size: int = 4096, hidden_size: int = 128, num_layers: int = 4,
               num_heads: int = 4, num_kv_heads: int = 2, num_experts: int = 8, top_k: int = 2,
               expert_width: int = 64, shared_width: int = 128, max_positions: int = 512, rope_theta: float = 10000.0):
    """A transformers config of `arch` with these sizes (shared_width: the shared expert's width; 0 = none)."""
    from transformers import DeepseekV2Config, MixtralConfig, Qwen2MoeConfig

    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, num_experts_per_tok=top_k,
                  max_position_embeddings=max_positions, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                  pad_token_id=1)
    if arch == "qwen2_moe":
        if shared_width <= 0:
            raise ConfigError("the Qwen2-MoE architecture has a shared expert: set shared_width > 0")
        return Qwen2MoeConfig(**common, num_experts=num_experts, moe_intermediate_size=expert_width,
                              shared_expert_intermediate_size=shared_width, intermediate_size=shared_width,
                              norm_topk_prob=False, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    if arch == "mixtral":
        return MixtralConfig(**common, num_local_experts=num_experts, intermediate_size=expert_width,
                             rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    if arch == "deepseek_v2":
        if shared_width % expert_width:
            raise ConfigError("DeepSeek's shared experts are n_shared_experts * expert_width wide: make shared_width "
                              "a multiple of expert_width")
        head = hidden_size // num_heads
        return DeepseekV2Config(**{**common, "num_key_value_heads": num_heads}, n_routed_experts=num_experts,
                                n_shared_experts=max(shared_width // expert_width, 1), moe_intermediate_size=expert_width,
                                intermediate_size=2 * shared_width, first_k_dense_replace=1, q_lora_rank=None,
                                kv_lora_rank=max(hidden_size // 4, 8), qk_rope_head_dim=head // 2,
                                qk_nope_head_dim=head // 2, v_head_dim=head, head_dim=head // 2, topk_method="greedy",
                                n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0)
    raise ConfigError(f"unknown architecture {arch!r}; choose from {', '.join(a for a in ARCHS if a != 'deepseek_v3')}")


def build_moe_lm(pretrained: str | None = None, experts_implementation: str = "eager", hf_config: str | None = None,
                 **sizes) -> nn.Module:
    """A randomly initialised causal LM of `moe_config(**sizes)`, or of the published `config.json` in the folder
    `hf_config` (e.g. DeepSeek-MoE-16B at full size, built on whatever device is current, meta included), or the
    local HF checkpoint folder `pretrained`.

    `experts_implementation` picks transformers' kernel for fused experts ("eager" loops over the experts hit, the
    fastest on CPU; "grouped_mm" / "batched_mm" suit GPUs).
    """
    from transformers import AutoModelForCausalLM

    if pretrained:
        return load_pretrained(pretrained)
    if hf_config:
        from lit_iclr.core.moe.published import published_model

        return published_model(hf_config, experts_implementation)
    model = AutoModelForCausalLM.from_config(moe_config(**sizes), experts_implementation=experts_implementation)
    check_moe(model)
    return model
