"""DeepSeek-MoE (`model_type: deepseek`, e.g. deepseek-moe-16b-base, HEAPr's main model) as a native module.

Its Hugging Face modeling code is remote (`trust_remote_code`), which this platform never runs; the architecture is
small enough to state here (Dai et al., 2024, "DeepSeekMoE"):

- a Llama decoder (RMSNorm, rotary multi-head attention with q/k/v/o projections without bias), from transformers;
- MLP of layer l: a dense SwiGLU of width `intermediate_size` for l < `first_k_dense_replace` (and layers not on the
  `moe_layer_freq` grid), else a DeepSeekMoE block:
      s = softmax(W_gate x)                 router over `n_routed_experts` fine-grained experts (scoring_func softmax)
      (w, idx) = top-k(s, num_experts_per_tok), w normalised only when `norm_topk_prob`
      y = sum_j w_j E_idx_j(x) + S(x)       E_e: SwiGLU of width `moe_intermediate_size`;
                                            S: the shared experts, one SwiGLU of width moe_intermediate_size * n_shared
- state-dict keys exactly those of the released checkpoints (`model.layers.1.mlp.gate.weight`,
  `...mlp.experts.7.up_proj.weight`, `...mlp.shared_experts.down_proj.weight`, `model.layers.0.mlp.gate_proj.weight`),
  so `AutoModelForCausalLM.from_pretrained` (after `register_deepseek()`) loads the safetensors as they are.

The routed experts are `VariableWidthExperts` (grouped forward; HEAPr prunes them to their own widths). The training
auxiliary balance loss of the original code is not added (fine-tuning here uses the task loss only).
"""
from __future__ import annotations

import math

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.activations import ACT2FN

from .experts import VariableWidthExperts


@strict
class DeepseekMoEConfig(LlamaConfig):
    """The config.json fields of DeepSeek-MoE on top of Llama's."""

    model_type = "deepseek"

    n_routed_experts: int = 64
    n_shared_experts: int | None = 2
    moe_intermediate_size: int = 1408
    num_experts_per_tok: int = 6
    first_k_dense_replace: int = 1
    moe_layer_freq: int = 1
    norm_topk_prob: bool = False
    scoring_func: str = "softmax"
    aux_loss_alpha: float = 0.001
    seq_aux: bool = True

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0


class DeepseekMLP(nn.Module):
    """SwiGLU MLP of a given width (the dense layers and the shared experts)."""

    def __init__(self, hidden_size: int, width: int, act: str = "silu"):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, width, bias=False)
        self.up_proj = nn.Linear(hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, hidden_size, bias=False)
        self.act_fn = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DeepseekGate(nn.Module):
    """The softmax top-k router; returns (logits, top-k weights, top-k indices) like transformers 5's routers."""

    def __init__(self, config: DeepseekMoEConfig):
        super().__init__()
        if config.scoring_func != "softmax":
            raise ValueError(f"DeepSeek-MoE scores with softmax; got scoring_func={config.scoring_func!r}")
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: torch.Tensor):
        logits = nn.functional.linear(x.reshape(-1, x.shape[-1]), self.weight)
        scores = logits.float().softmax(-1)
        w, idx = scores.topk(self.top_k, dim=-1)
        if self.top_k > 1 and self.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return logits, w.to(x.dtype), idx


class DeepseekMoE(nn.Module):
    """Routed fine-grained experts + shared experts (module docstring)."""

    def __init__(self, config: DeepseekMoEConfig):
        super().__init__()
        d = config.hidden_size
        self.gate = DeepseekGate(config)
        self.experts = VariableWidthExperts(d, [config.moe_intermediate_size] * config.n_routed_experts,
                                            config.hidden_act)
        self.shared_experts = (DeepseekMLP(d, config.moe_intermediate_size * config.n_shared_experts, config.hidden_act)
                               if config.n_shared_experts else None)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        _, w, idx = self.gate(flat)
        y = self.experts(flat, idx, w)
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat)
        return y.view(shape)


class DeepseekMoEForCausalLM(LlamaForCausalLM):
    """Llama's causal LM with DeepSeekMoE blocks in the MoE layers."""

    config_class = DeepseekMoEConfig

    def __init__(self, config: DeepseekMoEConfig):
        super().__init__(config)
        for i, layer in enumerate(self.model.layers):
            layer.mlp = DeepseekMoE(config) if config.is_moe_layer(i) else DeepseekMLP(
                config.hidden_size, config.intermediate_size, config.hidden_act)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, DeepseekGate):
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))


_REGISTERED = False


def register_deepseek() -> None:
    """Make `AutoConfig` / `AutoModelForCausalLM` understand `model_type: deepseek` (idempotent, no remote code)."""
    global _REGISTERED
    if _REGISTERED:
        return
    AutoConfig.register("deepseek", DeepseekMoEConfig, exist_ok=True)
    AutoModelForCausalLM.register(DeepseekMoEConfig, DeepseekMoEForCausalLM, exist_ok=True)
    _REGISTERED = True
