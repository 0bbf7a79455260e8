"""`cli.py plan` hooks of JULI (see `lit_iclr/core/plan.py`).

A BiasNet step: one teacher-forced forward of the frozen target over prompt + reply (no gradient: the API's top-k at
every reply position at once), then BiasNet's steering loss over the k returned candidates, backpropagated into BiasNet
only. The target is not part of the module's state (it stands behind the API), so `memory` adds its frozen weights and
the forward's largest live tensor (the logits) to what the module holds.
"""
from __future__ import annotations

import torch

from .batching import ChatBatch
from .steering import biasnet_loss

PROMPT, REPLY = 256, 64  # reconstructed: tokens of a chat prompt and of the target reply


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> ChatBatch:
    B, n = batch_size, PROMPT + REPLY
    return ChatBatch(torch.zeros(B, n, dtype=torch.long, device=device), torch.ones(B, n, dtype=torch.long, device=device),
                     PROMPT, torch.ones(B, REPLY, dtype=torch.bool, device=device))


def _teacher_forced(module, batch: ChatBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """`TopKLogprobAPI.teacher_forced` for an unpadded batch: the same forward without the attention mask (all ones
    here; transformers' padding and packed-sequence checks read mask or position values, which meta tensors lack)."""
    with torch.no_grad():
        logits = module.target[0](input_ids=batch.ids).logits
        r = batch.ids.shape[1] - batch.prompt_len
        logp = torch.log_softmax(logits[:, batch.prompt_len - 1:batch.prompt_len - 1 + r].float(), -1)
        top = logp.topk(module.api.k, -1)
    return top.indices, top.values


def step_loss(module, batch: ChatBatch) -> torch.Tensor:
    top_ids, top_lp = _teacher_forced(module, batch)
    ids, lp = module.api.expose(top_ids, top_lp)
    clamp = module.hparams.max_bias if module.api.control == "logit_bias" else None
    return biasnet_loss(module.net, ids, lp, batch.reply_ids, batch.reply_mask, clamp)[0]


def memory(module, batch, strategy, devices, precision) -> dict:
    """Bytes per device: the frozen target (bf16 under a bf16 precision, else fp32) and its logits, plus BiasNet with
    AdamW (fp32 weights, gradients, two moments)."""
    target = module.target[0]
    per = 2 if "bf16" in str(precision) or "16" in str(precision) else 4
    n_target = sum(p.numel() for p in target.parameters())
    n_net = sum(p.numel() for p in module.net.parameters())
    B, n = batch.ids.shape
    vocab = target.config.vocab_size
    return {"target weights (frozen)": n_target * per, "target logits": B * n * vocab * 4.0,
            "weights": n_net * 4.0, "gradients": n_net * 4.0, "optimizer": n_net * 8.0}


DATASET = {"name": "red-team chats (policy_train / attack_train / eval jsonl)", "bytes": 5e7, "samples": 5000 * 16,
           "source": "reconstructed: 5,000 BiasNet steps of 16 chats"}
PAPER = {"params": None, "params_source": "not stated (BiasNet's architecture not found; the target is frozen)",
         "steps": None, "accelerator": "H100",
         "note": "target Llama-3.1-8B-Instruct (8.03 B, frozen) from configs/paper/hf; BiasNet and schedule reconstructed"}
