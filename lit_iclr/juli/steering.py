"""The clients that talk to a `TopKLogprobAPI`: JULI's BiasNet steering, the baselines, and BiasNet's training loss."""
from __future__ import annotations

import torch

from .model import BiasNet


def biasnet_loss(net: BiasNet, ids: torch.Tensor, lp: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                 max_bias: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced steering loss and the coverage of the target text by the returned candidates.

    ids, lp `[B, R, k]` are what the API returned at each position of the target reply `target [B, R]`. The plug-in's
    distribution over the k candidates is softmax_j(lp_j + b_j); the loss is -log of the target token's share, averaged
    over the positions where the target token is among the k candidates (elsewhere no choice can emit it).
    """
    steps = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[:2])
    b = net(ids, lp, steps)
    if max_bias is not None:
        b = b.clamp(-max_bias, max_bias)
    hit = ids == target.unsqueeze(-1)
    valid = hit.any(-1) & mask
    logq = torch.log_softmax(lp + b, -1)
    nll = -(logq * hit).sum(-1)
    loss = (nll * valid).sum() / valid.sum().clamp(min=1)
    coverage = valid.sum() / mask.sum().clamp(min=1)
    return loss, coverage


def steer_chooser(net: BiasNet, control: str = "prefill"):
    """JULI's client: emit argmax_j (lp_j + b_j) over the returned candidates (or send b as a logit bias)."""
    def choose(step, ids, lp, _true_logp):
        b = net(ids, lp, step)
        if control == "logit_bias":
            return b
        return ids.gather(-1, (lp + b).argmax(-1, keepdim=True)).squeeze(-1)
    return choose


def random_chooser(generator: torch.Generator):
    """Baseline: a uniformly random returned candidate at every step (same API calls, no learning)."""
    def choose(_step, ids, _lp, _true_logp):
        j = torch.randint(ids.shape[-1], (ids.shape[0], 1), generator=generator).to(ids.device)
        return ids.gather(-1, j).squeeze(-1)
    return choose


def fixed_rank_chooser(rank: int):
    """Baseline: the rank-`rank` returned candidate (1 = the top) at the first step, greedy afterwards.

    The non-learned rule a plug-in reading ranks only could at best follow at the opening; the best such rank over
    r = 1..k is the baseline a learned choice must beat (`harness.evaluate`: `violation/fixed_rank_best`)."""
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")

    def choose(step, ids, _lp, _true_logp):
        return ids[:, min(rank, ids.shape[-1]) - 1] if step == 0 else ids[:, 0]
    return choose


def second_first_chooser():
    """Baseline: the rank-2 candidate at the first step (away from the policy's opening), greedy afterwards."""
    return fixed_rank_chooser(2)


def sample_chooser(temperature: float, generator: torch.Generator):
    """Ordinary users: sampling from the full distribution at `temperature` (the detector's negatives)."""
    def choose(_step, _ids, _lp, true_logp):
        p = torch.softmax(true_logp / temperature, -1)
        return torch.multinomial(p.cpu(), 1, generator=generator).squeeze(-1).to(true_logp.device)
    return choose
