"""`cli.py plan` hooks of StageRoute (see `lit_iclr/core/plan.py`). No gradient training: `step_loss` returns None.

A step routes `queries_per_step` queries (the batch: their row indices in the quality/cost table). Per query: one
routing LP over the <= M_max deployed models (closed form through the dual, O(M log M), re-solved only when an estimate
moved by more than `cache_tol`) and a draw; per stage (T^(2/3) of them): the deployment problem over all C(K, M_max)
subsets (165 exact LPs for K = 11, M_max = 3). All of it is scalar CPU work: the counted FLOPs are ~0 and the model has
no parameters (its state is K-sized buffers). What the deployment itself costs (the LLMs answering) is in the table.
"""
from __future__ import annotations

import torch


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> torch.Tensor:
    return torch.zeros(batch_size, dtype=torch.long, device=device)  # row indices of the next queries


def step_loss(module, batch) -> None:
    """None: routing is an online LP policy, not gradient training."""
    return None


DATASET = {"name": "RouterBench 0-shot (36,497 prompts x 11 LLMs)", "bytes": 2.0e8, "samples": 36_497,
           "source": "routerbench_0shot.pkl on the Hugging Face hub (withmartian/routerbench), about 200 MB with prompts"}
PAPER = {"params": None, "params_source": "no parameters (a bandit's estimates)", "steps": 200,
         "accelerator": "H100", "note": "T = 100k queries / 500 per step; constants and workload reconstructed"}
