"""A tiny causal transformer LM (plain torch): one per entity; `hidden` gives the representation used for similarity."""
from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, max_positions: int = 64, d_model: int = 64, num_layers: int = 2,
                 num_heads: int = 4, dropout: float = 0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_positions, d_model)
        layer = nn.TransformerEncoderLayer(d_model, num_heads, 4 * d_model, dropout, batch_first=True, norm_first=True,
                                           activation="gelu")
        self.blocks = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied embeddings
        nn.init.normal_(self.tok.weight, std=0.02)  # small init: initial loss ~ log(vocab)
        nn.init.normal_(self.pos.weight, std=0.02)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Final-layer states (B, T, d) under a causal mask."""
        T = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=ids.device)
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        return self.norm(self.blocks(x, mask=mask, is_causal=True))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, T, V)."""
        return self.head(self.hidden(ids))

    @torch.no_grad()
    def sample(self, n: int, length: int, bos_id: int, temperature: float = 1.0,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """n sequences of `length` tokens after a BOS token, ancestral sampling (the loop over positions is inherent)."""
        device = self.head.weight.device
        ids = torch.full((n, 1), bos_id, dtype=torch.long, device=device)
        for _ in range(length):
            logits = self(ids[:, -self.pos.num_embeddings:])[:, -1] / temperature
            nxt = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator)
            ids = torch.cat([ids, nxt], 1)
        return ids[:, 1:]


class HFEntityLM(nn.Module):
    """An entity LM that is a Hugging Face causal LM (the paper's OPT-350M / Llama-3.2-1B), with TinyLM's interface.

    `path` is a model folder: its weights when it has them, else (on the meta device, for `cli.py plan`) the architecture
    of its published config.json (`lit_iclr/core/hf_arch.py`)."""

    def __init__(self, path: str, require_weights: bool = True):
        super().__init__()
        from lit_iclr.core.hf_arch import causal_lm

        self.lm = causal_lm(path, require_weights_off_meta=require_weights)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Final states (B, T, d) as the LM head reads them (OPT-350M: after its 1024 -> 512 projection)."""
        return self.lm.base_model(input_ids=ids).last_hidden_state

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm.get_output_embeddings()(h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids).logits

    @torch.no_grad()
    def sample(self, n: int, length: int, bos_id: int, temperature: float = 1.0,
               generator: torch.Generator | None = None) -> torch.Tensor:
        device = self.lm.get_output_embeddings().weight.device
        ids = torch.full((n, 1), bos_id, dtype=torch.long, device=device)
        for _ in range(length):
            logits = self(ids)[:, -1] / temperature
            nxt = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator)
            ids = torch.cat([ids, nxt], 1)
        return ids[:, 1:]
