"""Synthetic long-horizon workload (T up to 1e5 and more): K models arriving over the stream, later ones better.

mu_m in [0.4, 0.9] rising with the arrival order (plus noise), per-query quality ~ Bernoulli(mu_m); mean costs c_m in
[0.05, 1] rising with quality (better models cost more), per-query cost lognormal around c_m (clipped to [0, 2 c_max]);
capacities alpha_m ~ U[0.3, 1]. The first `initial` models are present at t = 0, the others arrive at uniform times in
[0, 0.7 T].
"""
from __future__ import annotations

import numpy as np

from .workload import Workload


def synthetic_workload(num_models: int = 12, num_queries: int = 20000, initial: int = 3, seed: int = 0,
                       cost_sigma: float = 0.5) -> Workload:
    rng = np.random.default_rng(seed)
    rank = np.linspace(0.0, 1.0, num_models)
    mu = np.clip(0.4 + 0.5 * rank + rng.normal(0, 0.05, num_models), 0.35, 0.95)
    c = np.clip(0.05 + 0.95 * rank ** 1.5 * rng.uniform(0.6, 1.0, num_models), 0.05, 1.0)
    release = np.concatenate([np.zeros(initial), np.sort(rng.uniform(0.0, 0.7, num_models - initial))])
    capacity = rng.uniform(0.3, 1.0, num_models)
    quality = (rng.random((num_queries, num_models)) < mu).astype(float)
    cost = c * rng.lognormal(-cost_sigma ** 2 / 2, cost_sigma, (num_queries, num_models))
    cost = np.minimum(cost, 2.0 * c.max())
    names = [f"model-{i:02d}" for i in range(num_models)]
    return Workload(names, quality, cost, release, np.full(num_models, np.inf), capacity)
