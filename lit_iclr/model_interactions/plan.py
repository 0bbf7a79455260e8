"""`cli.py plan` hooks of data-mediated model interactions (see `lit_iclr/core/plan.py`).

A step trains every entity's LM on its own block of that generation's mix: the batch is input_ids (B, K, T) and the
loss is the sum over entities of their mean next-token NLL (`InteractionLM.training_step`). Sampling the published
corpus between generations adds `synthetic_sequences` x seq_len forward passes per model per generation.
"""
from __future__ import annotations

import torch


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(batch_size, datamodule.num_entities, datamodule.seq_len, dtype=torch.long,
                                     device=device)}


def step_loss(module, batch) -> torch.Tensor:
    ids = batch["input_ids"]
    return torch.stack([module.token_nll(m, ids[:, k])[0].mean() for k, m in enumerate(module.models)]).sum()


DATASET = {"name": "Wikipedia topic documents (jsonl), 2 private + 1 public topic", "bytes": 2.0e9, "samples": 20_000 * 5,
           "source": "reconstructed: 20k blocks of 512 tokens per entity per generation, 5 generations"}
PAPER = {"params": 0.35e9 + 1.23e9,
         "params_source": "the two LMs the paper trains: OPT-350M (OPT paper, Table 1: 350M) + Llama-3.2-1B (Meta's model "
                          "card: 1.23B)",
         "steps": None, "accelerator": "H100",
         "note": "architectures from configs/paper/hf/{opt-350m,Llama-3.2-1B}/config.json; schedule reconstructed"}
