"""StageRoute as a LightningModule: no gradients, one training step routes the next batch of queries in order.

The bandit state (per-model counts and sums, the deployed set, the cached routing distribution, the run's counters)
lives in float64 buffers; the simulator in `router.py` works on numpy views of them, so checkpoints and `--ckpt_path
last` resume the stream exactly. The baselines of the headline (epsilon-greedy and the oracle that knows the means, both
paced like StageRoute) route the same queries in the same job, each with its own state in buffers `<policy>__<field>`.
Regret is measured against V_B, the bandits-with-knapsacks benchmark over the horizon, split over the queries
(`Router.horizon_rates`), so the curve after t queries is sum_{t' < t} v_t' - sum of mu over the served queries.
"""
from __future__ import annotations

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_iclr.core import BaseModule
from lit_iclr.core.errors import ConfigError
from lit_iclr.core.summary import Headline

from .router import POLICIES, Router, RouterConfig, RouterState


class StageRoute(BaseModule):
    """Online stage-wise deployment (MILP on UCB/LCB) and per-query routing (LP) of models under budget and capacity."""

    # refused before any process starts when the Trainer asks for more (core/ddp.py); the card says the same
    single_process_reason = "a bandit stream: every query is routed with the counts and sums of all the queries before it"

    def __init__(self, num_models: int, horizon: int, policy: str = "stageroute", m_max: int = 3, budget: float = 0.35,
                 stage_length: int | None = None, stage_scale: float = 1.0, radius_scale: float = 0.1,
                 cache_tol: float = 0.01, epsilon: float = 0.1, pacing: bool = True, lp_solver: str = "exact",
                 enumerate_up_to: int = 12, seed: int = 0, budget_mode: str = "absolute",
                 baselines: tuple[str, ...] = ("eps_greedy", "oracle"), plot: bool = True):
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
            radius_scale: s, scale of the confidence radius s sqrt(2 ln T / n) (0.1: tuned on separate streams,
                seeds/stageroute.md; 1 is the textbook radius, too wide for gaps of a few hundredths).
            cache_tol: Re-solve the routing LP only when a deployed model's UCB or LCB moved by more than this.
            epsilon: Exploration rate of `eps_greedy` (also of the `eps_greedy` baseline; tuned like s).
            pacing: Solve the LPs with the remaining budget per remaining query instead of b (every policy).
            lp_solver: Routing LP solver: `exact` (closed form through the dual, vectorised) or `highs` (scipy linprog).
            enumerate_up_to: Solve the deployment problem by enumerating subsets (a batch of exact LPs) while the pool has
                at most this many models, by HiGHS's MILP beyond.
            seed: Seed of the routing draws.
            budget_mode: `absolute` (b in cost units; warns when b is at or above every model's mean cost and never
                binds) or `relative` (b in [0, 1]: c_min + b (c_max - c_min) over the models' mean costs).
            baselines: Policies run on the same query stream in the same job, for the headline (regret vs V_B).
            plot: Log the regret-over-t figure (policy and baselines) at the end of the stream.
        """
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        unknown = [p for p in baselines if p not in POLICIES]
        if unknown:
            raise ConfigError(f"model.init_args.baselines: unknown policies {unknown}; choose from {POLICIES}")
        kw = dict(m_max=m_max, budget=budget, horizon=horizon, stage_length=stage_length, stage_scale=stage_scale,
                  radius_scale=radius_scale, cache_tol=cache_tol, epsilon=epsilon, pacing=pacing, lp_solver=lp_solver,
                  enumerate_up_to=enumerate_up_to, seed=seed, budget_mode=budget_mode)
        self.cfg = RouterConfig(policy=policy, **kw)
        self.baseline_cfgs = {p: RouterConfig(policy=p, **kw) for p in dict.fromkeys(baselines) if p != policy}
        for prefix in ("", *(f"{p}__" for p in self.baseline_cfgs)):
            for name, value in RouterState.new(num_models).arrays().items():
                self.register_buffer(prefix + name, torch.from_numpy(value.copy()))
        self.router: Router | None = None
        self.baseline_routers: dict[str, Router] = {}
        self.rates: np.ndarray | None = None  # V_B per query
        self.curve: list[list[float]] = []  # [t, regret vs V_B of the policy, then of each baseline] per step

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer is not None else None
        if self.router is None and dm is not None:
            dm.setup(stage)
            if dm.workload.num_models != self.hparams.num_models:
                raise ConfigError(f"the workload has {dm.workload.num_models} models, the model was built for "
                                  f"{self.hparams.num_models}")
            self.router = Router(dm.workload, self.cfg)
            self.baseline_routers = {p: Router(dm.workload, c) for p, c in self.baseline_cfgs.items()}
            self.rates = np.cumsum(self.router.horizon_rates())

    def configure_optimizers(self):
        return None

    def state(self, policy: str | None = None) -> RouterState:
        """Numpy views of the buffers (shared memory: the simulator updates the buffers in place); `policy` names a
        baseline's state."""
        prefix = f"{policy}__" if policy else ""
        return RouterState(**{name: getattr(self, prefix + name).numpy() for name in RouterState.new(0).arrays()})

    def regret_vb(self, s: RouterState) -> float:
        """V_B's share of the first t queries minus the expected reward earned on them (sum of mu over served)."""
        t = int(s.t)
        return float(self.rates[t - 1]) - float(s.reward) if t > 0 else 0.0

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        s = self.state()
        # The stream has a horizon of T queries (V_B and the pacing are defined on it): a run longer than one pass
        # (more epochs, or a partial epoch repeated) serves up to T queries and then ends the fit.
        rows = batch.cpu().numpy()[:max(len(self.rates) - int(s.t), 0)]
        if len(rows) == 0:
            if not self.trainer.should_stop:
                rank_zero_info(f"StageRoute: the horizon's {len(self.rates)} queries are served; the fit ends here")
            self.trainer.should_stop = True
            return
        self.router.serve(s, rows)
        for p, router in self.baseline_routers.items():
            router.serve(self.state(p), rows)
        t = float(s.t)
        metrics = {"train/regret": self.regret_vb(s), "train/avg_regret": self.regret_vb(s) / t,
                   "train/regret_per_stage_oracle": float(s.regret),
                   "train/avg_cost": float(s.spent) * self.router.scale / t,
                   "train/served_frac": float(s.served) / t, "train/lp_solves_per_query": float(s.lp_solves) / t,
                   "train/deployed": float(s.deployed.sum())}
        metrics.update({f"train/regret/{p}": self.regret_vb(self.state(p)) for p in self.baseline_routers})
        self.curve.append([t, self.regret_vb(s), *(self.regret_vb(self.state(p)) for p in self.baseline_routers)])
        self.log_train(metrics, prog_bar=("train/avg_regret", "train/avg_cost"))

    def on_train_epoch_end(self) -> None:
        s = self.state()
        t = float(s.t)
        if t == 0:
            return
        out = {"stream/regret_vs_VB": self.regret_vb(s), "stream/regret_per_stage_oracle": float(s.regret),
               "stream/avg_cost": float(s.spent) * self.router.scale / t, "stream/budget": self.router.budget,
               "stream/served_frac": float(s.served) / t, "stream/queries": t}
        for p in self.baseline_routers:
            b = self.state(p)
            out[f"stream/regret_vs_VB/{p}"] = self.regret_vb(b)
            out[f"stream/avg_cost/{p}"] = float(b.spent) * self.router.scale / t
        self.log_dict(out, batch_size=1)
        if self.hparams.plot and self.curve:
            from lit_iclr.core.figures import log_figure

            log_figure(self, "stream/regret", self.regret_figure())

    def regret_figure(self):
        import matplotlib.pyplot as plt

        c = np.asarray(self.curve)
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for j, name in enumerate([self.hparams.policy, *self.baseline_routers]):
            ax.plot(c[:, 0], c[:, 1 + j], marker=".", label=name)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(xlabel="queries t", ylabel="regret vs V_B (cumulative)",
               title=f"StageRoute: regret vs the horizon benchmark (b = {self.router.budget:g})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        return fig

    def headline(self) -> Headline:
        names = {"eps_greedy": f"epsilon-greedy (eps {self.hparams.epsilon:g})", "oracle": "oracle (knows mu, c; paced)"}
        return Headline(
            metric="stream/regret_vs_VB", higher_is_better=False,
            baselines={names.get(p, p): f"stream/regret_vs_VB/{p}" for p in self.baseline_routers},
            claim="regret against V_B (bandits-with-knapsacks benchmark) grows sublinearly, O~(T^(2/3)), and stays "
                  "near a strong oracle under a tight budget",
            method=f"{self.hparams.policy} (s {self.hparams.radius_scale:g})" if self.hparams.policy == "stageroute"
            else self.hparams.policy,
            extra=("stream/avg_cost", "stream/budget", "stream/served_frac", "stream/regret_per_stage_oracle",
                   "stream/queries"))

    def summary_metrics(self):
        return ("stream/avg_cost/*",)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["stageroute_curve"] = self.curve

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.curve = [list(r) for r in checkpoint.get("stageroute_curve", [])]
