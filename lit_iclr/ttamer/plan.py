"""`cli.py plan` hooks of T-Tamer (see `lit_iclr/core/plan.py`). No gradient training: `step_loss` returns None.

The module's one "step" fits the policies on the whole calibration table (the batch: logits (N, S, C), labels (N,),
cost (S,)): a temperature per stage (a 1-D convex fit over N S C logits), the B signal bins, the Markov transition counts
(O(N S)) and backward induction over (stage, bin, best-so-far level), O(S B^2 (S B + 1)). Serving a query afterwards is
O(S) table look-ups. None of it is a matrix product, so the counted FLOPs are ~0: the cost that matters is the networks'
forward passes that wrote the exit tables (PAPER["note"]), paid once per image before T-Tamer runs.
"""
from __future__ import annotations

import torch

# calibration half of ImageNet-1k val, 1000 classes (configs/paper/ttamer.yaml)
CALIBRATION, CLASSES = 25_000, 1000


def example_batch(datamodule, batch_size: int = 1, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    s = datamodule.stages
    return {"logits": torch.zeros(CALIBRATION, s, CLASSES, device=device),
            "labels": torch.zeros(CALIBRATION, dtype=torch.long, device=device),
            "cost": torch.ones(s, dtype=torch.float64, device=device)}


def step_loss(module, batch) -> None:
    """None: the policies are fitted by counting and backward induction, not by gradients."""
    return None


DATASET = {"name": "ImageNet-1k val exit tables of a 4-model cascade (calibration + test npz)",
           "bytes": 50_000 * 4 * 1000 * 4.0, "samples": 50_000,
           "source": "50,000 images x 4 stages x 1000 float32 logits (the tables; the images themselves are 6.4 GB)"}
PAPER = {"params": None, "params_source": "no trained parameters (the policies are tables)", "steps": 1,
         "accelerator": "H100",
         "note": "writing the tables costs one forward of each member on 50k images: mobilenetv3_small_100 0.06, resnet18 "
                 "1.8, resnet50 4.1, vit_base_patch16_224 17.6 GFLOPs (multiply-adds, timm) = 23.6 GMACs/image, "
                 "about 2.4 PFLOP in all; cascade members reconstructed"}
