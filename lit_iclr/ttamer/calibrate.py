"""Per-stage temperature scaling (Guo et al. 2017) and the signals a policy observes after consulting a stage."""
from __future__ import annotations

import torch

SIGNALS = ("confidence", "margin", "entropy")


def fit_temperatures(logits: torch.Tensor, labels: torch.Tensor, iters: int = 100) -> torch.Tensor:
    """T_i > 0 per stage minimising the NLL of softmax(logits[:, i] / T_i) on the calibration split.

    The stages' problems are separable, so one L-BFGS run on log T (shape (S,)) fits all of them at once.
    """
    logits = logits.detach().double()
    log_t = torch.zeros(logits.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=iters, line_search_fn="strong_wolfe")
    target = labels[:, None].expand(-1, logits.shape[1])

    def closure():
        opt.zero_grad()
        scaled = logits / log_t.exp()[None, :, None]
        nll = torch.nn.functional.cross_entropy(scaled.permute(0, 2, 1), target, reduction="sum")
        nll.backward()
        return nll

    opt.step(closure)
    return log_t.detach().exp().float()


def calibrated_probs(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """(N, S, C) softmax of the temperature-scaled logits."""
    return torch.softmax(logits / temperatures[None, :, None], dim=-1)


def signal(probs: torch.Tensor, kind: str = "confidence") -> torch.Tensor:
    """(N, S) scalar signal per stage: max probability, top-1 minus top-2 margin, or 1 - normalised entropy."""
    if kind == "confidence":
        return probs.max(-1).values
    if kind == "margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if kind == "entropy":
        ent = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
        return 1 - ent / torch.log(torch.tensor(float(probs.shape[-1])))
    raise ValueError(f"unknown signal {kind!r}; choose one of {SIGNALS}")


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> torch.Tensor:
    """(S,) ECE of each stage: sum over confidence bins of |accuracy - confidence| weighted by the bin's share, i.e.
    |sum of correct - sum of confidence| per bin over N."""
    conf, pred = probs.max(-1)
    correct = (pred == labels[:, None]).float()
    idx = (conf * bins).long().clamp(max=bins - 1)                       # (N, S)
    n, s = conf.shape
    flat = idx + bins * torch.arange(s)[None, :]                          # one bin id per (stage, bin)
    acc = torch.zeros(s * bins).index_add_(0, flat.reshape(-1), correct.reshape(-1))
    cf = torch.zeros(s * bins).index_add_(0, flat.reshape(-1), conf.reshape(-1))
    return ((acc - cf).abs().reshape(s, bins).sum(-1)) / n
