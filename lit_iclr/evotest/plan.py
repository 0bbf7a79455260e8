"""`cli.py plan` hooks of EvoTest (see `lit_iclr/core/plan.py`). No gradient training: `step_loss` returns None.

The cost is the Actor's: at each of the <= 110 steps of an episode it scores the admissible commands under one prompt
(guide + extracted state + last turns + retrieved examples): one forward over CANDIDATES sequences of PROMPT + COMMAND
tokens, the "batch" planned here (`actor_lm`, built on the meta device from the config's lm_path). A J-TTL run is
episodes x step_limit such forwards plus one Evolver API call per episode (remote, not planned). The `pg` baseline's
logit table is the module's only parameter of its own.
"""
from __future__ import annotations

import torch

PROMPT, COMMAND, CANDIDATES = 2048, 8, 16  # reconstructed: prompt tokens, tokens per command, admissible commands


def example_batch(datamodule, batch_size: int = 1, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(CANDIDATES, PROMPT + COMMAND, dtype=torch.long, device=device)}


def step_loss(module, batch) -> None:
    """None (no gradients); runs the Actor's scoring forward of one game step so the plan counts its FLOPs."""
    lm = getattr(module, "actor_lm", None)
    if lm is not None:
        with torch.no_grad():
            lm(input_ids=batch["input_ids"])
    return None


DATASET = {"name": "Jericho Z-machine games (one story file per game)", "bytes": 1.0e5, "samples": 50,
           "source": "detective.z5 is about 100 KB; one sample = one episode of the J-TTL stream"}
PAPER = {"params": None, "params_source": "not stated (the Actor and Evolver are closed API models)",
         "steps": 50 * 110, "accelerator": "H100",
         "note": "50 episodes x 110 actor forwards; actor Llama-3.1-8B-Instruct reconstructed (paper: gemini-2.5-flash)"}
