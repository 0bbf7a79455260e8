"""How alike K models are: Jensen-Shannon divergence of next-token distributions and linear CKA of representations."""
from __future__ import annotations

import itertools

import torch


def pairwise_js(logits: torch.Tensor) -> torch.Tensor:
    """Mean JS divergence (nats) over model pairs and positions; logits (K, ..., V). JS = H(mean p) - mean H(p)."""
    logp = torch.log_softmax(logits.float(), -1)
    K = logp.shape[0]
    vals = []
    for a, b in itertools.combinations(range(K), 2):
        lm = torch.logsumexp(torch.stack([logp[a], logp[b]]), 0) - torch.log(torch.tensor(2.0))
        kl_a = (logp[a].exp() * (logp[a] - lm)).sum(-1)
        kl_b = (logp[b].exp() * (logp[b] - lm)).sum(-1)
        vals.append(0.5 * (kl_a + kl_b).mean())
    return torch.stack(vals).mean() if vals else torch.zeros(())


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Linear CKA (Kornblith et al. 2019) of two (n, d) representation matrices: ||Y^T X||_F^2 / (||X^T X|| ||Y^T Y||)."""
    x = x - x.mean(0)
    y = y - y.mean(0)
    num = (y.T @ x).pow(2).sum()
    return num / ((x.T @ x).pow(2).sum().sqrt() * (y.T @ y).pow(2).sum().sqrt())


def pairwise_cka(reps: torch.Tensor) -> torch.Tensor:
    """Mean linear CKA over model pairs; reps (K, n, d)."""
    vals = [linear_cka(reps[a], reps[b]) for a, b in itertools.combinations(range(reps.shape[0]), 2)]
    return torch.stack(vals).mean() if vals else torch.ones(())
