"""`cli.py plan` hooks of IB-CBM (see `lit_iclr/core/plan.py`).

A batch is what CUBConcepts yields: frozen backbone embeddings `x` (B, D), concept labels `c` (B, K) and classes `y`.
The step's loss is `CIBM.losses` with the I(X;C) subsample given as `mi_samples` embeddings (the training pool lives in
the DataModule after setup); IB_E's entropy term, backpropagated into the concept heads, is added when present.
The frozen embedding of the images is a one-time pass before training (Inception-v3 at 299 px: about 5.7 GFLOP per
image, 6.7e13 FLOP for CUB's 11,788 images): not part of the step.
"""
from __future__ import annotations

import torch


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    B, K = batch_size, datamodule.num_concepts
    return {"x": torch.zeros(B, *datamodule.input_shape, device=device), "c": torch.zeros(B, K, device=device),
            "y": torch.zeros(B, dtype=torch.long, device=device)}


def step_loss(module, batch) -> torch.Tensor:
    hp = module.hparams
    sub_x = torch.zeros(hp.mi_samples, *batch["x"].shape[1:], device=batch["x"].device)
    r = module.losses(batch, seed=0, beta=float(hp.beta), sub_x=sub_x)
    loss = r["loss"] + r.get("loss_vanilla", 0.0)
    return loss + (1 - float(hp.beta)) * r["hc"] if "hc" in r else loss


DATASET = {"name": "CUB-200-2011 (Koh et al.'s CBM splits)", "bytes": 1.15e9, "samples": 4_796,
           "source": "CUB_200_2011.tgz is about 1.1 GB (11,788 images); Koh et al.'s train split has 4,796 images"}
PAPER = {"params": None, "params_source": "not stated", "steps": None, "accelerator": "H100",
         "note": "20 epochs x 4,796 / 128; the frozen Inception-v3 embedding pass is one-time"}
