"""Paper-scale plan hooks of NAMEx (`cli.py plan`, see `lit_iclr/core/plan.py`).

The paper-scale config (configs/paper/namex.yaml) fine-tunes Qwen1.5-MoE-A2.7B with merging MoE blocks
(`NAMExHFCausalLM`): one step is the next-token loss of a batch of corpus sequences, forward and backward. On the meta
device routing cannot run (data-dependent dispatch), so there the model's unmerged blocks, if any, dispatch evenly
(`core/moe/balanced.py`); NAMEx's merged blocks are dense (one merged expert per segment) and run as they are.
Memory: the closed form of `core/moe/memory.py` (FSDP2 shards, gathered layers, activations with checkpointing, the
merge bank and chain state), which knows what the merging keeps; the measured saved tensors would miss the FSDP terms.
"""
from __future__ import annotations

import torch

DATASET = {
    "name": "WikiText-103 raw (wikitext-103-raw-v1), reconstructed: the paper's fine-tuning data was not retrievable",
    "bytes": 541e6,  # wiki.train.raw 516 MB + valid 1.1 MB + test 1.3 MB (+ the tokenised cache)
    "samples": 58_600,  # about 120M Qwen tokens / 2048 per sequence
    "source": "wikitext-103-raw-v1 release (Merity et al. 2016): 103M words, 516 MB of training text",
}

PAPER = {
    "params": 14.3e9,
    "params_source": "Qwen1.5-MoE-A2.7B model card (14.3B total, 2.7B activated); the paper's 'Qwen1.5-MoE (14B)'",
    "steps": None,  # not given: trainer.max_steps (reconstructed)
    "accelerator": "H100",
    "note": "fine-tuning recipe reconstructed (not retrievable); model from its published config.json",
}


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    """`batch_size` corpus sequences of `seq_len` token ids, every token real (as the corpus' LM blocks)."""
    T, V = datamodule.seq_len, datamodule.vocab_size
    ids = torch.zeros(batch_size, T, dtype=torch.long, device=device) if str(device) == "meta" else \
        torch.randint(0, V, (batch_size, T), device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def step_loss(module, batch) -> torch.Tensor:
    """The mean next-token NLL `training_step` backpropagates (`PerplexityModule`), without logging."""
    from contextlib import nullcontext

    from lit_iclr.core.moe.balanced import balanced_dispatch

    ids = batch["input_ids"]
    T = ids.shape[1]
    # a ready-made 4-D causal mask: transformers would inspect a 2-D one on the host, which meta tensors cannot do
    mask = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()[None, None].expand(ids.shape[0], 1, T, T)
    with balanced_dispatch(module.net) if ids.device.type == "meta" else nullcontext():
        logits = module.net(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch["labels"][:, 1:].reshape(-1))
    return nll


def memory(module, batch, strategy, devices: int, precision: str) -> dict[str, float]:
    """Bytes per device from `core/moe/memory.py`'s formula for this model, batch, merge options and device count."""
    from lit_iclr.core.moe.memory import plan

    m, hp = module.merge, module.hparams
    B, T = batch["input_ids"].shape
    compute = 2 if (hp.get("param_dtype") in ("bfloat16", "float16") or "16" in str(precision)) else 4
    shards = devices if strategy.kind == "fsdp" else 1
    terms = plan(module.net.config, shards, batch=B, seq_len=T, segment=m.segment, mode=m.mode, beta_abs=m.beta_abs,
                 beta_phase=m.beta_phase, chunk=m.chunk, activation_checkpointing=bool(hp.activation_checkpointing),
                 compute_bytes=compute, chain_state="coefficients" if m.chain_state == "auto" else m.chain_state)
    return {k: float(v) for k, v in terms.items() if k != "total"}
