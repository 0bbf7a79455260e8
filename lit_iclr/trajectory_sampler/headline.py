"""The fit's own comparison: after training, sample with the trajectory ladder and with the final-model baselines on
the same landscape and the same evaluation budget, and score every sampler the same way.

The ladder is the predictor's weights at K evenly spaced training steps (kept in memory during the fit, the same
weights `ModelCheckpoint(every_n_train_steps=max_steps / K)` writes to the checkpoint folder), so one `fit` shows the
effect that `predict` with `trajectory_sampler_sample.yaml` measures on the saved folder.

Scores per domain (what the card's tables use):
- binary (bit strings, n <= 16): TV of the chains' end states to the exact target exp(beta f_final), all 2^n states
  enumerated; also the TV of the uniform start states and of as many exact i.i.d. draws (the floor), and the needle
  rate when the data carries its landscape.
- categorical (one-hot sequences): mean true score f* of the end states (the final model's score on user data).
- continuous (points): TV of the chains' mode histogram to the target's equal mode weights (`mode_tv`).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .annealing import SAMPLERS, Kernel, sample
from .landscapes import BooleanLandscape, GaussianModes2D, all_binary

# domain -> (score name, higher is better)
METRICS = {"binary": ("tv", False), "categorical": ("score", True), "continuous": ("mode_tv", False)}
MAX_ENUMERATED_BITS = 16


def tv_to(idx: torch.Tensor, pi: torch.Tensor) -> float:
    """Total variation between the empirical distribution of state indices `idx` and the distribution `pi`."""
    p = torch.bincount(idx, minlength=len(pi)).double() / len(idx)
    return 0.5 * float((p - pi.double()).abs().sum())


def bits_index(x: torch.Tensor) -> torch.Tensor:
    """Integer of each bit string (little-endian, the order of `all_binary`)."""
    return (x.round().long() << torch.arange(x.shape[-1])).sum(-1)


def compare_samplers(models: Sequence[torch.nn.Module], datamodule, chains: int, steps_per_checkpoint: int,
                     beta: float, beta_min: float, step_size: float, seed: int) -> dict[str, float]:
    """{"<score>_<sampler>": value, ...} for every sampler of `SAMPLERS` (same K * m budget), plus the references."""
    domain = getattr(datamodule, "sampler_domain", "binary")
    g = torch.Generator().manual_seed(seed)
    x0 = datamodule.chain_starts(g)[:chains]
    f_true = datamodule.landscape() if hasattr(datamodule, "landscape") else None
    nets = [m.eval() for m in models]
    if domain == "binary":
        scores = [lambda x, m=m: m(x[..., 1]).reshape(len(x)) for m in nets]
        chains0, kernel = F.one_hot(x0.round().long(), 2).float(), Kernel("gwg")
        decode = lambda x: x[..., 1]  # noqa: E731
    elif domain == "categorical":
        scores = [lambda x, m=m: m(x).reshape(len(x)) for m in nets]
        chains0, kernel, decode = x0.float(), Kernel("gwg"), (lambda x: x)
    else:
        scores = [lambda x, m=m: m(x).reshape(len(x)) for m in nets]
        chains0, kernel, decode = x0.float(), Kernel("mala", step_size=step_size), (lambda x: x)
    out: dict[str, float] = {}
    ends = {}
    for method in SAMPLERS:
        gen = torch.Generator().manual_seed(1000 + seed)
        state, trace = sample(method, scores, chains0, beta, steps_per_checkpoint, kernel, beta_min=beta_min,
                              generator=gen)
        ends[method] = decode(state.x).detach()
        out[f"acceptance_{method}"] = trace.accepted
    out["evaluations_per_chain"] = float(trace.evaluations)
    with torch.no_grad():
        if domain == "binary":
            n = x0.shape[1]
            if n <= MAX_ENUMERATED_BITS:
                X = all_binary(n)
                pi = torch.softmax(beta * nets[-1](X).reshape(-1).double(), 0)
                for method, x in ends.items():
                    out[f"tv_{method}"] = tv_to(bits_index(x), pi)
                out["tv_start"] = tv_to(bits_index(x0), pi)
                out["tv_floor"] = tv_to(torch.multinomial(pi, len(x0), replacement=True, generator=g), pi)
                if isinstance(f_true, BooleanLandscape):
                    out["target_needle_mass"] = float(pi[f_true.in_needle(X)].sum())
            if isinstance(f_true, BooleanLandscape):
                for method, x in ends.items():
                    out[f"needle_rate_{method}"] = float(f_true.in_needle(x).float().mean())
        elif domain == "categorical":
            f = f_true if f_true is not None else (lambda x: nets[-1](x).reshape(len(x)))
            for method, x in ends.items():
                out[f"score_{method}"] = float(f(x).mean())
            out["score_start"] = float(f(chains0).mean())
        elif isinstance(f_true, GaussianModes2D):
            from .data import mode_stats

            for method, x in ends.items():
                stats = mode_stats(f_true, x)
                out[f"mode_tv_{method}"] = stats["mode_tv"]
                out[f"modes_covered_{method}"] = float(stats["modes_covered"])
            out["mode_tv_start"] = mode_stats(f_true, x0)["mode_tv"]
    return out
