"""A tiny randomly initialised Llama with the generator's BPE chat tokenizer (no download, built in a second)."""
from __future__ import annotations

import functools

import torch

from lit_iclr.juli import chats
from lit_iclr.juli.base_lm import build_model, build_tokenizer


@functools.lru_cache(maxsize=1)
def tiny_target():
    records = chats.make_split(64, 0, "reveal")
    tok = build_tokenizer(records, vocab_size=300)
    torch.manual_seed(0)
    model = build_model(len(tok), hidden=32, layers=2, heads=4, max_positions=128, pad_id=tok.pad_token_id,
                        eos_id=tok.eos_token_id).eval()
    model.requires_grad_(False)
    return model, tok


def eval_records(n: int = 6, seed: int = 1) -> list[dict]:
    import random

    rng = random.Random(seed)
    return [chats.make_record(rng, "guarded" if i % 2 == 0 else "open", "none") for i in range(n)]


class TableLM(torch.nn.Module):
    """A bigram target for `TopKLogprobAPI`: the next-token log-probabilities given the last token are a row of
    `logits [V, V]` (log-softmaxed), so every rank and value a client sees is set by hand."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.table = torch.log_softmax(logits, -1)
        self.dummy = torch.nn.Parameter(torch.zeros(1))  # the API reads the device from a parameter

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.table[input_ids], past_key_values=None)


class WordTokenizer:
    """`batch_decode` of a TableLM's tokens: one word per id (ids without a word, e.g. eos, print nothing)."""

    def __init__(self, words: dict[int, str]):
        self.words = words

    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(self.words[t] for t in row if self.words.get(t)) for row in rows]
