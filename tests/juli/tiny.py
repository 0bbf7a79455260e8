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
