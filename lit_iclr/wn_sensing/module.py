"""Matrix sensing as a LightningModule: one full-gradient iteration per training step, any of the four solvers.

    f(X, Theta) = 1/4 ||M(X Theta X^T) - y||^2                               (objective)
    G = grad_X f - X sym(X^T grad_X f),  X <- Retr(X - eta G)                 (Riemannian step on St(m, r))
    Theta <- Theta - eta_Theta grad_Theta f,  grad_Theta f = 1/2 X^T M*(r) X   (Euclidean step on S^r)

The solvers live in `algorithms.py` (shared with the benchmark); the problem comes from the DataModule at setup.
"""
from __future__ import annotations

import torch

from lit_iclr.core import BaseModule
from lit_iclr.core.errors import ConfigError
from lit_iclr.core.figures import log_figure, plt
from lit_iclr.core.summary import Headline

from .algorithms import METHODS, SolverConfig, estimate, iterate, make_factorization, make_optimizer, spectral_scale
from .manifold import RETRACTIONS
from .problem import Problem
from .sensing import loss, relative_error


class MatrixSensing(BaseModule):
    """Recover a PSD low-rank matrix from linear measurements with WN-RGD (the paper) or a baseline solver."""

    def __init__(self, dim: int, true_rank: int | None = None, method: str = "wn_rgd", rank: int = 6, lr: float = 1.0,
                 lr_theta: float = 1.0, retraction: str = "qr", init_scale: float = 1e-3, damping: float | None = None,
                 seed: int = 0, baselines: tuple[str, ...] = ("gd",), baseline_lr: float = 0.5):
        """
        Args:
            dim: m, side of the target (linked from the data).
            true_rank: r_A, rank of the target when known (linked from the data); rank >= true_rank is required.
            method: `wn_rgd` (X Theta X^T, Riemannian GD), `gd` (Y Y^T, plain GD), `scaled_gd` (ScaledGD(lambda)),
                `prec_gd` (PrecGD, damping proportional to sqrt(f)).
            rank: r, columns of the factor (r > r_A is the overparameterised regime; r = r_A is exact).
            lr: Step on X (wn_rgd) or Y (the others), in units of 1 / ||A||_2^2 (X) or 1 / ||A||_2 (Y).
            lr_theta: Step on Theta (wn_rgd only).
            retraction: `qr` or `polar` (wn_rgd only).
            init_scale: Theta_0 = init_scale I (wn_rgd) or Y_0 = init_scale G / sqrt(m) (the others).
            damping: lambda / ||A||_2 of scaled_gd (default 1e-3) or the sqrt(f) factor of prec_gd (default 1).
            seed: Seed of the initialisation.
            baselines: Solvers run beside `method` in the same fit, one iteration each per training step, on the same
                problem, rank, initialisation scale and seed, so every validation compares them at equal iterations
                (`val/log10_rel_error_<name>`). Empty: none.
            baseline_lr: Their step (the card's tuned GD step, 0.5 / ||A||_2).
        """
        super().__init__()
        if method not in METHODS:
            raise ConfigError(f"model.init_args.method must be one of {METHODS}, got {method!r}")
        if retraction not in RETRACTIONS:
            raise ConfigError(f"model.init_args.retraction must be one of {RETRACTIONS}, got {retraction!r}")
        if true_rank is not None and rank < true_rank:
            raise ConfigError(f"model.init_args.rank={rank} is below the target's rank {true_rank}: X Theta X^T cannot "
                              f"represent A; set rank >= {true_rank} (rank > {true_rank} is the overparameterised regime)")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.cfg = SolverConfig(method=method, rank=rank, lr=lr, lr_theta=lr_theta, retraction=retraction,
                                init_scale=init_scale, damping=damping, seed=seed)
        self.factor = make_factorization(self.cfg, dim)
        unknown = [b for b in baselines if b not in METHODS]
        if unknown:
            raise ConfigError(f"model.init_args.baselines: unknown solvers {unknown}; choose from {METHODS}")
        self.baseline_cfgs = {b: SolverConfig(method=b, rank=rank, lr=baseline_lr, init_scale=init_scale, seed=seed)
                              for b in baselines if b != method}
        # an nn.ModuleDict, so the baselines' factors are in the state dict (an exact resume continues them too)
        self.baseline_factors = torch.nn.ModuleDict({b: make_factorization(c, dim) for b, c in self.baseline_cfgs.items()})
        self._baseline_opts: dict[str, torch.optim.Optimizer] = {}
        self.problem: Problem | None = None
        self.register_buffer("a_norm", torch.ones((), dtype=torch.float64))

    def attach(self, problem: Problem) -> None:
        """Use `problem` (operator, measurements, optional target); sets the step-size scale ||A||_2 from M*(y)."""
        if problem.dim != self.hparams.dim:
            raise ConfigError(f"the problem has m={problem.dim} but the model was built for dim={self.hparams.dim}")
        self.problem = problem
        self.a_norm.fill_(spectral_scale(problem.op, problem.y))

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer is not None else None
        if self.problem is None and dm is not None:
            dm.setup(stage)
            self.attach(dm.problem)

    def configure_optimizers(self):
        return make_optimizer(self.cfg, self.factor, float(self.a_norm))

    def baseline_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The baselines' own optimizers (stepped here, not by Lightning: they are the comparison, not the model)."""
        if not self._baseline_opts and self.baseline_cfgs:
            self._baseline_opts = {b: make_optimizer(c, self.baseline_factors[b], float(self.a_norm))
                                   for b, c in self.baseline_cfgs.items()}
            for b, state in getattr(self, "_pending_baseline_states", {}).items():
                self._baseline_opts[b].load_state_dict(state)
        return self._baseline_opts

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["wn_sensing_baseline_optimizers"] = {b: o.state_dict() for b, o in self._baseline_opts.items()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._pending_baseline_states = checkpoint.get("wn_sensing_baseline_optimizers", {})
        self._baseline_opts = {}

    def headline(self) -> Headline:
        known = self.problem is None or self.problem.target is not None
        key = "{stage}/log10_rel_error" if known else "{stage}/loss"
        return Headline(metric=key, higher_is_better=False, method=f"{self.cfg.method} (r={self.cfg.rank})",
                        baselines={f"{b} (r={self.cfg.rank}, same iterations)": f"{key}_{b}" for b in self.baseline_cfgs},
                        claim="weight normalisation converges linearly where overparameterised GD is sublinear "
                              "(log10 of the relative error after the same number of iterations)",
                        extra=("{stage}/significant_rank",))

    def _errors(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, factor in (("", self.factor), *((f"_{b}", f) for b, f in self.baseline_factors.items())):
            out[f"loss{name}"] = loss(self.problem.op, self.problem.y, *factor()).detach()
            if self.problem.target is not None:
                err = relative_error(estimate(factor), self.problem.target)
                if not name:
                    out["rel_error"] = err
                out[f"log10_rel_error{name}"] = err.clamp_min(1e-300).log10()
        return out

    def training_step(self, batch, batch_idx: int) -> None:
        f = iterate(self.factor, self.optimizers(), self.problem.op, self.problem.y)
        for b, opt in self.baseline_optimizers().items():
            iterate(self.baseline_factors[b], opt, self.problem.op, self.problem.y)
        metrics = {"train/loss": f}
        if self.problem.target is not None:
            metrics["train/rel_error"] = relative_error(estimate(self.factor), self.problem.target)
        self.log_train(metrics, prog_bar=("train/rel_error",))

    def validation_step(self, batch, batch_idx: int) -> None:
        errors = self._errors()
        x, theta = self.factor()
        eig = torch.linalg.eigvalsh((theta + theta.T) / 2) if self.cfg.method == "wn_rgd" else torch.linalg.svdvals(x) ** 2
        # significant eigenvalues of Theta (of Y^T Y for the BM solvers): should approach r_A
        significant = (eig.abs() > 1e-3 * eig.abs().max()).sum()
        self.log_dict({f"val/{k}": v for k, v in errors.items()} | {"val/significant_rank": significant.double()},
                      prog_bar=True, batch_size=1)
        self._spectrum_figure(eig.detach().abs().sort(descending=True).values)

    def test_step(self, batch, batch_idx: int) -> None:
        self.log_dict({f"test/{k}": v for k, v in self._errors().items()}, batch_size=1)

    def _spectrum_figure(self, eig: torch.Tensor) -> None:
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.semilogy(range(1, len(eig) + 1), eig.clamp_min(1e-16).cpu().numpy(), "o-")
        if self.hparams.true_rank:
            ax.axvline(self.hparams.true_rank + 0.5, color="grey", ls="--", label="r_A")
            ax.legend()
        ax.set_xlabel("index")
        ax.set_ylabel("|eigenvalue| of Theta" if self.cfg.method == "wn_rgd" else "eigenvalue of Y^T Y")
        ax.set_title(f"{self.cfg.method}, r={self.cfg.rank}")
        log_figure(self, "val/spectrum", fig)
