"""BiasNet (the steering plug-in) and LoRA adapters that align the target; plain torch, no Lightning."""
from __future__ import annotations

import math

import torch
from torch import nn


class BiasNet(nn.Module):
    """Reads what a top-k log-probability API returns at one step and adds a bias b_j to each of the k candidates.

    Features of candidate j at step t: its log-probability lp_j, the gap lp_j - lp_1 to the top candidate, its
    probability renormalised over the k returned (softmax of lp), its rank j, the step t and, with `token_buckets > 0`,
    the candidate's token id hashed into that many buckets (an API returns the token text, so its identity is visible).
    The emitted token is argmax_j (lp_j + b_j) over the k candidates (the steering rule).

    Args:
        max_k: Largest k the API may return (size of the rank embedding).
        hidden: Width of the per-candidate MLP.
        token_buckets: Hashed token-id embedding size (0: read log-probabilities and ranks only).
        max_steps: Steps beyond this share the last step embedding.
        embed_dim: Size of the rank, step and token embeddings.
    """

    def __init__(self, max_k: int = 20, hidden: int = 64, token_buckets: int = 0, max_steps: int = 32,
                 embed_dim: int = 16):
        super().__init__()
        self.max_k, self.token_buckets, self.max_steps = max_k, token_buckets, max_steps
        self.rank = nn.Embedding(max_k, embed_dim)
        self.step = nn.Embedding(max_steps, embed_dim)
        self.token = nn.Embedding(token_buckets, embed_dim) if token_buckets > 0 else None
        width = 3 + embed_dim * (3 if token_buckets > 0 else 2)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, 1))
        nn.init.zeros_(self.mlp[-1].weight)  # b = 0 at start: the plug-in begins as greedy decoding
        nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, token_ids: torch.Tensor, logprobs: torch.Tensor, step: torch.Tensor | int) -> torch.Tensor:
        """Bias `[..., k]` for candidates `token_ids [..., k]` with returned `logprobs [..., k]` at `step` (int or [...])."""
        k = token_ids.shape[-1]
        lead = token_ids.shape[:-1]
        step = torch.as_tensor(step, device=token_ids.device).clamp(max=self.max_steps - 1).expand(lead)
        feats = [logprobs.unsqueeze(-1), (logprobs - logprobs[..., :1]).unsqueeze(-1),
                 torch.softmax(logprobs, -1).unsqueeze(-1),
                 self.rank(torch.arange(k, device=token_ids.device)).expand(*lead, k, -1),
                 self.step(step).unsqueeze(-2).expand(*lead, k, -1)]
        if self.token is not None:
            feats.append(self.token(token_ids % self.token_buckets))
        return self.mlp(torch.cat(feats, -1)).squeeze(-1)


class LoRA(nn.Module):
    """Low-rank update of one linear layer: y = W x + (alpha / r) B A x (Hu et al. 2022), B = 0 at start."""

    def __init__(self, in_features: int, out_features: int, rank: int = 8, alpha: float = 16.0):
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        self.scale = alpha / rank

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.A.T @ self.B.T) * self.scale

    def merged_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """W + (alpha / r) B A: the merged layer the hook is equivalent to."""
        return weight + self.scale * self.B @ self.A


class LoRAAdapters(nn.Module):
    """LoRA on the named linear layers of a causal LM, attached with forward hooks.

    The base model is left untouched (it may be a process-wide cached copy shared with other code): the hooks add the
    low-rank update only while `enabled` is true, and `detach()` removes them. Only A and B are parameters of this
    module, so a checkpoint holds the adapters, not the base weights.

    Args:
        targets: Suffixes of the linear layers to adapt (e.g. `q_proj`, `v_proj`).
        rank: r.
        alpha: The LoRA scale numerator (update scaled by alpha / r).
    """

    def __init__(self, model: nn.Module, targets: tuple[str, ...] = ("q_proj", "v_proj"), rank: int = 8,
                 alpha: float = 16.0):
        super().__init__()
        self.names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.split(".")[-1] in targets]
        if not self.names:
            raise ValueError(f"no linear layer of the target model is named {targets}")
        mods = dict(model.named_modules())
        self.adapters = nn.ModuleDict({n.replace(".", "__"): LoRA(mods[n].in_features, mods[n].out_features, rank, alpha)
                                       for n in self.names})
        self.enabled = True
        self._handles: list = []
        self._model = [model]  # a list keeps the base model out of this module's parameters and state dict

    def attach(self) -> None:
        """Hook the adapters into the base model. One set of adapters is live on a base model at a time: hooks that
        another `LoRAAdapters` left on it (a fit that ended in an exception never reaches its `teardown`, and the
        process-wide cached model kept that fit's low-rank updates) are removed first, or this fit would add both."""
        if self._handles:
            return
        model = self._model[0]
        for stale in getattr(model, "_lora_handles", ()):
            stale.remove()
        mods = dict(model.named_modules())
        for n in self.names:
            lora = self.adapters[n.replace(".", "__")]
            self._handles.append(mods[n].register_forward_hook(self._hook(lora)))
        model._lora_handles = list(self._handles)

    def _hook(self, lora: LoRA):
        def hook(_module, inputs, output):
            return output + lora.delta(inputs[0]) if self.enabled else output
        return hook

    def detach(self) -> None:
        model = self._model[0]
        if getattr(model, "_lora_handles", None) == self._handles:
            model._lora_handles = []
        for h in self._handles:
            h.remove()
        self._handles.clear()
