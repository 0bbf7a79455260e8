"""Paper-scale plan hooks of HEAPr (`cli.py plan`, see `lit_iclr/core/plan.py`).

HEAPr trains nothing: its one costly pass is the calibration forward + backward (`calibrate.py`) over 128 WikiText-2
sequences of 2048 tokens in batches of 8, with the weights frozen and the summed next-token NLL differentiated with
respect to the activations only (the expert outputs' gradients g give M = E[g g^T]); no parameter gradient and no
optimiser state exist. `step_loss` is that pass: it freezes the weights and makes the embedding output require grad,
as the calibration does, so the plan counts an activation-only backward and no gradient or optimiser memory.
"""
from __future__ import annotations

import torch

DATASET = {
    "name": "WikiText-2 raw (wikitext-2-raw-v1), calibration: 128 x 2048 tokens of wiki.train.raw",
    "bytes": 13.1e6,  # wiki.train.raw 10.9 MB + valid 1.1 MB + test 1.3 MB (the raw-v1 zip's text files)
    "samples": 128,  # calibration sequences (cali_nsamples)
    "source": "HEAPr code (LLIKKE/HEAPr utils/data_utils.py: Salesforce/wikitext wikitext-2-raw-v1, cali_nsamples 128, "
              "seqlen 2048); file sizes of the wikitext-2-raw-v1 release",
}

PAPER = {
    "params": 16.4e9,
    "params_source": "DeepSeek-MoE-16B (Dai et al. 2024, arXiv 2401.06066: 16.4B total parameters), the model of the "
                     "first rows of HEAPr's results (code README)",
    "steps": 16,  # 128 calibration sequences / cali_batch_size 8
    "accelerator": "H100",
    "note": "post-training pruning: one calibration forward + activation-only backward per batch, then a global top-k; "
            "the d x d Fisher M of each routed expert (64 x 27 layers x 2048^2 fp32 = 29 GB) is kept on the host, as "
            "in the official code",
}


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    """A calibration batch: `batch_size` sequences of `seq_len` token ids (labels = inputs, as the LM loss)."""
    T, V = datamodule.seq_len, datamodule.vocab_size
    ids = torch.randint(0, V, (batch_size, T), device=device) if str(device) != "meta" else \
        torch.zeros(batch_size, T, dtype=torch.long, device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def causal_mask(ids: torch.Tensor) -> torch.Tensor:
    """The (B, 1, T, T) boolean causal mask of fully real sequences, given to the model ready-made: transformers then
    uses it as it is instead of inspecting a 2-D mask on the host (which meta tensors cannot do)."""
    T = ids.shape[1]
    return torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()[None, None].expand(ids.shape[0], 1, T, T)


def step_loss(module, batch) -> torch.Tensor:
    """HEAPr's calibration loss (`calibrate.py`): the summed next-token NLL with the weights frozen and the activation
    graph differentiable from the embedding output on, so the backward yields the expert-output gradients only."""
    from contextlib import nullcontext

    from lit_iclr.core.moe.balanced import balanced_dispatch

    model = module.model
    model.requires_grad_(False)
    hook = model.get_input_embeddings().register_forward_hook(lambda m, a, out: out.requires_grad_(True))
    # meta tensors cannot route (data-dependent dispatch): there the experts see a balanced share of the rows
    meta = batch["input_ids"].device.type == "meta"
    try:
        with balanced_dispatch(model) if meta else nullcontext():
            logits = model(input_ids=batch["input_ids"], attention_mask=causal_mask(batch["input_ids"]),
                           use_cache=False).logits
    finally:
        hook.remove()
    target = batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), target.flatten(), reduction="sum")
