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
