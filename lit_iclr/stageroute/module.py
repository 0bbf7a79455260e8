"""StageRoute as a LightningModule: no gradients, one training step routes the next batch of queries in order.

The bandit state (per-model counts and sums, the deployed set, the cached routing distribution, the run's counters)
lives in float64 buffers; the simulator in `router.py` works on numpy views of them, so checkpoints and `--ckpt_path
last` resume the stream exactly.
"""
from __future__ import annotations

import torch

from lit_iclr.core import BaseModule
from lit_iclr.core.errors import ConfigError

from .router import Router, RouterConfig, RouterState


class StageRoute(BaseModule):
    """Online stage-wise deployment (MILP on UCB/LCB) and per-query routing (LP) of models under budget and capacity."""

    # refused before any process starts when the Trainer asks for more (core/ddp.py); the card says the same
    single_process_reason = "a bandit stream: every query is routed with the counts and sums of all the queries before it"

    def __init__(self, num_models: int, horizon: int, policy: str = "stageroute", m_max: int = 3, budget: float = 0.35,
                 stage_length: int | None = None, stage_scale: float = 1.0, radius_scale: float = 1.0,
                 cache_tol: float = 0.01, epsilon: float = 0.1, pacing: bool = True, lp_solver: str = "exact",
                 enumerate_up_to: int = 12, seed: int = 0, budget_mode: str = "absolute"):
        """
        Args:
            num_models: K, models in the workload (linked from the data).
            horizon: T, queries in the stream (linked from the data).
            policy: `stageroute` or a baseline: `oracle`, `greedy`, `eps_greedy`, `cost_blind`, `random`, `per_query`.
            m_max: M_max, models deployed at once.
            budget: b, the per-query budget on expected cost: in the workload's cost units (`budget_mode: absolute`;
                the default workload's MFLOPs, RouterBench's dollars), or a fraction in [0, 1] of its cost range.
            stage_length: Lambda, queries per stage; null uses ceil(stage_scale T^(1/3)) (T^(2/3) stages).
            stage_scale: Constant of the T^(1/3) rule.
            radius_scale: Scale of the confidence radius sqrt(2 ln T / n).
            cache_tol: Re-solve the routing LP only when a deployed model's UCB or LCB moved by more than this.
            epsilon: Exploration rate of `eps_greedy`.
            pacing: Solve the LPs with the remaining budget per remaining query instead of b (all learning policies).
            lp_solver: Routing LP solver: `exact` (closed form through the dual, vectorised) or `highs` (scipy linprog).
            enumerate_up_to: Solve the deployment problem by enumerating subsets (a batch of exact LPs) while the pool has
                at most this many models, by HiGHS's MILP beyond.
            seed: Seed of the routing draws.
            budget_mode: `absolute` (b in cost units; warns when b is at or above every model's mean cost and never
                binds) or `relative` (b in [0, 1]: c_min + b (c_max - c_min) over the models' mean costs).
        """
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.cfg = RouterConfig(policy=policy, m_max=m_max, budget=budget, horizon=horizon, stage_length=stage_length,
                                stage_scale=stage_scale, radius_scale=radius_scale, cache_tol=cache_tol, epsilon=epsilon,
                                pacing=pacing, lp_solver=lp_solver, enumerate_up_to=enumerate_up_to, seed=seed,
                                budget_mode=budget_mode)
        for name, value in RouterState.new(num_models).arrays().items():
            self.register_buffer(name, torch.from_numpy(value.copy()))
        self.router: Router | None = None

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer is not None else None
        if self.router is None and dm is not None:
            dm.setup(stage)
            if dm.workload.num_models != self.hparams.num_models:
                raise ConfigError(f"the workload has {dm.workload.num_models} models, the model was built for "
                                  f"{self.hparams.num_models}")
            self.router = Router(dm.workload, self.cfg)

    def configure_optimizers(self):
        return None

    def state(self) -> RouterState:
        """Numpy views of the buffers (shared memory: the simulator updates the buffers in place)."""
        return RouterState(**{name: getattr(self, name).numpy() for name in RouterState.new(0).arrays()})

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        s = self.state()
        self.router.serve(s, batch.cpu().numpy())
        t = float(s.t)
        self.log_train({"train/regret": float(s.regret), "train/avg_regret": float(s.regret) / t,
                        "train/avg_cost": float(s.spent) * self.router.scale / t,
                        "train/served_frac": float(s.served) / t, "train/lp_solves_per_query": float(s.lp_solves) / t,
                        "train/deployed": float(s.deployed.sum())}, prog_bar=("train/avg_regret", "train/avg_cost"))
