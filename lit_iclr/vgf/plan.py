"""Paper-scale plan hooks of VGF (`cli.py plan`, see `lit_iclr/core/plan.py`).

One step is one gradient update (`update_losses`): the critics' TD loss against targets built from the reference
policy's particles moved `train_flow_steps` SVGD steps (no graph), plus the reference flow's flow-matching loss; one
backward serves both (disjoint parameters). A batch is what the offline-RL DataModule yields for one update.

The transport differentiates Q with `torch.func.grad`, which refuses the saved-tensor hooks the plan measures
activations with; the TD target carries no graph (it is built under `no_grad` and saves nothing for the backward), so
`step_loss` builds it with those hooks lifted and measures the tensors the two losses save.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

DATASET = {
    "name": "OGBench antmaze-large-navigate-v0 (npz)",
    "bytes": 1_000_000 * (2 * 29 + 8 + 3) * 4,  # 1M transitions: observations, next_observations (29), actions (8), flags
    "samples": 1_000_000,
    "source": "OGBench (Park et al. 2024): navigate datasets of 1M transitions; antmaze obs 29, action 8",
}

PAPER = {"params": None, "params_source": None, "steps": 2_000_000, "accelerator": "H100",
         "note": "2M gradient steps (official offline_steps); no parameter count stated"}


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    B, S, A = batch_size, datamodule.obs_dim, datamodule.action_dim
    return {"observations": torch.zeros(B, S, device=device), "actions": torch.zeros(B, A, device=device),
            "rewards": torch.zeros(B, device=device), "masks": torch.ones(B, device=device),
            "next_observations": torch.zeros(B, S, device=device)}


def _noise(module, batch) -> dict[str, torch.Tensor]:
    hp, B, dev = module.hparams, batch["rewards"].shape[0], batch["rewards"].device
    return {"particles": torch.randn(B, hp.num_particles, hp.action_dim, device=dev),
            "fm_x0": torch.randn(B, hp.action_dim, device=dev), "fm_t": torch.rand(B, 1, device=dev)}


@contextmanager
def _without_saved_tensor_hooks():
    """Lift the active saved-tensor hooks (the plan's activation measurement) for a graph-free computation."""
    lifted = []
    while (top := torch._C._autograd._top_saved_tensors_default_hooks(False)) is not None:
        lifted.append(top)
        torch._C._autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(lifted):
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)


def step_loss(module, batch) -> torch.Tensor:
    """critic TD loss + flow-matching loss of one update (`VGF.update_losses`, whose sum `update` backpropagates)."""
    noise = _noise(module, batch)
    with _without_saved_tensor_hooks():  # torch.func.grad inside; no graph is kept
        target = module._td_target(batch["next_observations"], batch["rewards"], batch["masks"], noise["particles"])
    qs = module.critic(batch["observations"], batch["actions"])  # [2, B], as update_losses
    critic_loss = (qs - target).pow(2).sum(0).mean()
    bc_loss = module.policy.flow_matching_loss(batch["observations"], batch["actions"],
                                               noise=(noise["fm_x0"], noise["fm_t"]))
    return critic_loss + bc_loss
