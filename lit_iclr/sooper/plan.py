"""`cli.py plan` hooks of SOOPER (see `lit_iclr/core/plan.py`).

A training step of the module is one real episode followed by `model_updates` ensemble updates, `sac_updates` SAC
updates and the prior's cost-critic updates (the real episode and the imagined rollouts are forward passes of small
networks). The plan's step is one update of each learner on one batch: the dynamics ensemble's NLL on a bootstrap
batch per member, SAC's critic TD loss and actor loss, and the prior cost critic's regression; the schedule counts
`online_episodes x max(model_updates, sac_updates)` such steps (PAPER below, for configs/paper/sooper.yaml).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    B, S, A = batch_size, datamodule.obs_dim, datamodule.action_dim
    z = dict(device=device)
    return {"obs": torch.zeros(B, S, **z), "action": torch.zeros(B, A, **z), "reward": torch.zeros(B, **z),
            "cost": torch.zeros(B, **z), "next_obs": torch.zeros(B, S, **z), "done": torch.zeros(B, **z)}


def step_loss(module, batch) -> torch.Tensor:
    h = module.hparams
    s, a, s2 = batch["obs"], batch["action"], batch["next_obs"]
    E = h.ensemble_size
    target = torch.zeros(E, *s.shape[:1], s.shape[1] + 2, device=s.device)  # [delta s, r, c] per member
    model_loss = module.model.loss(s.expand(E, -1, -1), a.expand(E, -1, -1), target)
    with torch.no_grad():  # SAC's TD target, as sac_update builds it
        a2, logp2 = module.actor(s2)
        y = batch["reward"] + h.discount * (1 - batch["done"]) * (module.critic_target(s2, a2).min(0).values - logp2)
    critic_loss = F.mse_loss(module.critic(s, a), y.expand(h.critic_heads, -1))
    a_pi, logp = module.actor(s)
    actor_loss = (logp - module.critic(s, a_pi).mean(0)).mean()
    cost_loss = F.mse_loss(module.prior_cost(s, a), batch["cost"].expand(h.critic_heads, -1))
    return model_loss + critic_loss + actor_loss + cost_loss


DATASET = {"name": "cartpole swing-up offline data of the prior (D4RL layout with costs)", "bytes": 150_000 * 16 * 4,
           "samples": 150_000, "source": "reconstructed: a prior's data set of about the online run's size (obs 5, "
                                         "action 1, next obs, reward, cost, flags: 16 float32 per transition)"}
PAPER = {"params": None, "params_source": "not stated", "steps": 600 * 1000, "accelerator": "H100",
         "note": "600 real episodes x 1,000 updates of each learner (authors: 150k real steps, 40 updates per 10-env "
                 "collection step); the real episodes' MuJoCo steps run on the CPU"}
