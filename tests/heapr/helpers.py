"""Small real-format inputs for the HEAPr tests: a JSONL topic corpus and a tiny trained Qwen2-MoE."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

TOPICS = {"Animals": "cat dog horse fur tail bark paw", "Music": "song guitar piano melody rhythm chord band",
          "Space": "star planet orbit comet galaxy rocket moon"}


def write_corpus(root: Path, n_train: int = 90, seed: int = 0) -> Path:
    """{train,validation,test}.jsonl with three topics whose documents use topic-specific words."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    names = list(TOPICS)
    for split, n in (("train", n_train), ("validation", 12), ("test", 12)):
        with (root / f"{split}.jsonl").open("w") as f:
            for i in range(n):
                topic = names[i % 3]
                words = TOPICS[topic].split() + ["the", "a", "and", "of"]
                text = " ".join(rng.choice(words, size=40)) + "."
                f.write(json.dumps({"title": f"{topic} {split} {i}", "text": text, "topic": topic}) + "\n")
    return root


def markov_batches(n_batches: int = 4, batch: int = 4, seq: int = 24, vocab: int = 64, seed: int = 0):
    """LM batches from a fixed random first-order Markov chain (a learnable distribution)."""
    g = torch.Generator().manual_seed(1234)
    trans = torch.softmax(3.0 * torch.randn(vocab, vocab, generator=g), -1)
    g.manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.zeros(batch, seq, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for t in range(1, seq):
            x[:, t] = torch.multinomial(trans[x[:, t - 1]], 1, generator=g).squeeze(-1)
        out.append({"input_ids": x, "labels": x, "attention_mask": torch.ones_like(x)})
    return out
