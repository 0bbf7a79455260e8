"""T-Tamer as a LightningModule: fit exit policies on a calibration exit table, score them on the test table.

Fitting (one training step over the calibration split, no gradients): per-stage temperatures, signal bins, the Markov
model of the stages (bin values q_k(b), first-stage bins, transitions) and each stage's bin marginal, all kept in
buffers so a checkpoint holds the fitted policies. Validation/test sweeps the latency weight lambda for every policy
(and the threshold tau for the heuristic) and logs the area under each accuracy-cost curve.
"""
from __future__ import annotations

import numpy as np
import torch

from lit_iclr.core import BaseModule
from lit_iclr.core.errors import ConfigError
from lit_iclr.core.figures import log_figure, plt
from lit_iclr.core.summary import Headline

from .calibrate import SIGNALS, calibrated_probs, expected_calibration_error, fit_temperatures, signal
from .curves import mean_accuracy, upper_hull
from .policies import MarkovModel, dp_policy, oracle_policy, pandora_policy, reservation_values, threshold_policy

POLICIES = ("threshold", "no_recall", "recall", "pandora", "oracle")


class ExitPolicies(BaseModule):
    """Confidence threshold, optimal no-recall and recall stopping (backward induction), Pandora's-box index, oracle."""

    # refused before any process starts when the Trainer asks for more (core/ddp.py); the card says the same
    single_process_reason = ("a cascade policy: fit in one step on the whole calibration table (temperatures, bins, "
                             "Markov counts), with no gradient to average")

    def __init__(self, stages: int, bins: int = 15, signal_kind: str = "confidence", value: str = "calibrated",
                 smoothing: float | None = None, smoothing_grid: list[float] | None = None,
                 select_fraction: float = 0.3, prior_weight: float = 5.0, lambdas: list[float] | None = None,
                 thresholds: list[float] | None = None):
        """
        Args:
            stages: Number of exits / cascade members (linked from the data).
            bins: B, bins of the stage signal in the Markov model.
            signal_kind: What a policy observes after a stage: `confidence`, `margin` or `entropy` (of calibrated probs).
            value: Value of an answer: `calibrated` (temperature-scaled confidence, mean per bin) or `empirical`
                (the bin's accuracy on the calibration split).
            smoothing: Laplace count added to every transition cell and first-stage bin; null: chosen from
                `smoothing_grid` on the calibration split alone (policies fitted on part of it, scored on the rest).
            smoothing_grid: Candidate Laplace counts for `smoothing: null`; null: [0.01, 0.1, 1.0].
            select_fraction: Share of the calibration queries held out to choose the smoothing (never the test table).
            prior_weight: Pseudo-queries shrinking each recall stop value (calibration accuracy of the best-so-far
                answer in a state) toward its model value; 0 uses the raw accuracies.
            lambdas: Latency weights swept to draw the DP/Pandora/oracle curves (cost in units of stage 1's cost);
                null: 100 values log-spaced in [1e-4, 10].
            thresholds: Confidence thresholds swept for the heuristic; null: 101 values in [0, 1].
        """
        super().__init__()
        if signal_kind not in SIGNALS:
            raise ConfigError(f"model.init_args.signal_kind must be one of {SIGNALS}, got {signal_kind!r}")
        if value not in ("calibrated", "empirical"):
            raise ConfigError(f"model.init_args.value must be 'calibrated' or 'empirical', got {value!r}")
        if stages < 2:
            raise ConfigError(f"exit policies need at least 2 stages, the data has {stages}")
        if not 0 < select_fraction < 1:
            raise ConfigError(f"model.init_args.select_fraction must be in (0, 1), got {select_fraction}")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.lambdas = list(lambdas) if lambdas is not None else np.logspace(-4, 1, 100).tolist()
        self.thresholds = list(thresholds) if thresholds is not None else np.linspace(0.0, 1.0, 101).tolist()
        self.register_buffer("temperatures", torch.ones(stages))
        self.register_buffer("q", torch.zeros(stages, bins, dtype=torch.float64))
        self.register_buffer("p0", torch.zeros(bins, dtype=torch.float64))
        self.register_buffer("trans", torch.zeros(stages - 1, bins, bins, dtype=torch.float64))
        self.register_buffer("cost", torch.ones(stages, dtype=torch.float64))
        self.register_buffer("marginal", torch.zeros(stages, bins, dtype=torch.float64))
        levels = stages * bins + 1
        self.register_buffer("stop_value", torch.zeros(stages, bins, levels, dtype=torch.float64))
        self.register_buffer("answer_current", torch.zeros(stages, bins, levels, dtype=torch.bool))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self.register_buffer("smoothing_used", torch.full((), float("nan"), dtype=torch.float64))

    def on_load_checkpoint(self, checkpoint) -> None:
        # before the generic shape check: say which count differs, not which buffers
        fitted = checkpoint.get("hyper_parameters", {}).get("stages")
        if fitted is not None and fitted != self.hparams.stages:
            raise ConfigError(f"the checkpoint's exit policies were fitted on a {fitted}-stage network, the exit tables "
                              f"given have {self.hparams.stages} stages: test on tables of the network it was fitted "
                              "on (data.init_args.root of its run's config.yaml), or fit the policies on these tables")
        super().on_load_checkpoint(checkpoint)

    def configure_optimizers(self):
        return None

    def _bins(self, probs: torch.Tensor) -> torch.Tensor:
        s = signal(probs, self.hparams.signal_kind)
        return (s * self.hparams.bins).long().clamp(0, self.hparams.bins - 1)

    def markov(self) -> MarkovModel:
        return MarkovModel(self.q, self.p0, self.trans, self.cost, self.stop_value, self.answer_current)

    def fit_policies(self, logits: torch.Tensor, labels: torch.Tensor, cost: torch.Tensor) -> None:
        """Temperatures, bins and the Markov model from the calibration table (smoothing chosen on it when null)."""
        if logits.shape[1] != self.hparams.stages:
            raise ConfigError(f"the exit table has {logits.shape[1]} stages, the model was built for {self.hparams.stages}")
        smoothing = self.hparams.smoothing
        if smoothing is None:
            smoothing = self.select_smoothing(logits, labels, cost)
        self._fit(logits, labels, cost, float(smoothing))

    def _fit(self, logits: torch.Tensor, labels: torch.Tensor, cost: torch.Tensor, smoothing: float) -> None:
        self.temperatures.copy_(fit_temperatures(logits, labels))
        probs = calibrated_probs(logits, self.temperatures)
        bins = self._bins(probs)
        correct = (probs.argmax(-1) == labels[:, None]).double()
        values = probs.max(-1).values.double() if self.hparams.value == "calibrated" else correct
        model = MarkovModel.estimate(bins, values, cost, self.hparams.bins, smoothing,
                                     correct=correct.bool(), prior_weight=self.hparams.prior_weight)
        self.q.copy_(model.q)
        self.p0.copy_(model.p0)
        self.trans.copy_(model.trans)
        self.cost.copy_(model.cost)
        self.stop_value.copy_(model.stop_value)
        self.answer_current.copy_(model.answer_current)
        hist = torch.stack([torch.bincount(bins[:, k], minlength=self.hparams.bins) for k in range(bins.shape[1])])
        self.marginal.copy_(hist.double() / hist.sum(1, keepdim=True))
        self.smoothing_used.fill_(smoothing)
        self.fitted.fill_(True)

    def select_smoothing(self, logits: torch.Tensor, labels: torch.Tensor, cost: torch.Tensor) -> float:
        """The Laplace count of `smoothing_grid` whose DP policies (no recall and recall, mean of their areas under the
        accuracy-cost curve) score best on a held-out share of the calibration queries, fitted on the rest."""
        grid = list(self.hparams.smoothing_grid or [0.01, 0.1, 1.0])
        perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
        n_sel = max(1, int(round(self.hparams.select_fraction * len(labels))))
        sel, rest = perm[:n_sel], perm[n_sel:]
        scores = []
        for smoothing in grid:
            self._fit(logits[rest], labels[rest], cost, float(smoothing))
            curves = self.dp_curves(logits[sel], labels[sel])
            lo, hi = float(self.cost[0]), float(self.cost.sum())
            scores.append(sum(mean_accuracy(v, lo, hi) for v in curves.values()) / len(curves))
        self.selection_scores = dict(zip(grid, scores, strict=True))
        return float(grid[int(np.argmax(scores))])

    def dp_curves(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, list[tuple[float, float]]]:
        """[(mean cost, accuracy)] of the no-recall and recall DP policies over the lambda sweep."""
        probs = calibrated_probs(logits, self.temperatures)
        bins = self._bins(probs)
        correct = probs.argmax(-1) == labels[:, None]
        model = self.markov()
        return {name: [tuple(reversed(dp_policy(model, bins, lam, recall).summary(correct))) for lam in self.lambdas]
                for name, recall in (("no_recall", False), ("recall", True))}

    def training_step(self, batch, batch_idx: int) -> None:
        self.fit_policies(batch["logits"], batch["labels"], batch["cost"])

    def curves(self, logits: torch.Tensor, labels: torch.Tensor, nested: bool) -> dict[str, list[tuple[float, float]]]:
        """[(mean cost, accuracy)] per policy over the lambda / tau sweeps, on one table."""
        probs = calibrated_probs(logits, self.temperatures)
        bins = self._bins(probs)
        correct = probs.argmax(-1) == labels[:, None]
        conf = probs.max(-1).values
        model = self.markov()
        out: dict[str, list[tuple[float, float]]] = {p: [] for p in POLICIES}
        for tau in self.thresholds:
            out["threshold"].append(tuple(reversed(threshold_policy(conf, self.cost, tau).summary(correct))))
        for lam in self.lambdas:
            for name, recall in (("no_recall", False), ("recall", True)):
                out[name].append(tuple(reversed(dp_policy(model, bins, lam, recall).summary(correct))))
            out["oracle"].append(tuple(reversed(oracle_policy(correct, self.cost, lam, nested).summary(correct))))
            if not nested:  # a cascade's order is free: Weitzman's index policy on the bin marginals
                sigma = self.reservation(lam)
                values = self.q[torch.arange(self.q.shape[0])[None, :], bins]
                out["pandora"].append(tuple(reversed(pandora_policy(values, self.cost, sigma).summary(correct))))
        if nested:
            del out["pandora"]
        return out

    def reservation(self, lam: float) -> torch.Tensor:
        """sigma_i from each stage's calibration distribution of answer values (bin values weighted by the marginal)."""
        return reservation_values(self.q.T, self.cost, lam, weights=self.marginal.T)

    def _evaluate(self, batch, prefix: str) -> None:
        if not bool(self.fitted):
            raise ConfigError("the exit policies are not fitted: run `fit` first or pass --ckpt_path of a fitted run")
        logits, labels = batch["logits"], batch["labels"]
        nested = self.trainer.datamodule.source == "nested" if self._trainer is not None else True
        curves = self.curves(logits, labels, nested)
        lo, hi = float(self.cost[0]), float(self.cost.sum())
        metrics = {f"{prefix}/auc_{k}": mean_accuracy(v, lo, hi) for k, v in curves.items()}
        metrics[f"{prefix}/auc_gap_recall_vs_no_recall"] = metrics[f"{prefix}/auc_recall"] - metrics[f"{prefix}/auc_no_recall"]
        metrics[f"{prefix}/auc_gap_recall_vs_threshold"] = metrics[f"{prefix}/auc_recall"] - metrics[f"{prefix}/auc_threshold"]
        correct = logits.argmax(-1) == labels[:, None]
        metrics[f"{prefix}/acc_last_stage"] = float(correct[:, -1].float().mean())
        metrics[f"{prefix}/acc_any_stage"] = float(correct.any(1).float().mean())
        ece = expected_calibration_error(calibrated_probs(logits, self.temperatures), labels)
        metrics[f"{prefix}/ece_calibrated"] = float(ece.mean())
        metrics[f"{prefix}/smoothing"] = float(self.smoothing_used)
        self.log_dict(metrics, batch_size=1)
        self._figure(curves, prefix)

    def headline(self) -> Headline:
        return Headline(
            metric="{stage}/auc_recall", higher_is_better=True,
            baselines={"threshold heuristic": "{stage}/auc_threshold", "DP no recall": "{stage}/auc_no_recall"},
            method="T-Tamer recall DP",
            claim="with recall the optimal exit policy beats no-recall stopping (mean accuracy over the cost range)",
            extra=("{stage}/auc_pandora", "{stage}/auc_oracle", "{stage}/acc_last_stage", "{stage}/smoothing"))

    def validation_step(self, batch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _figure(self, curves, prefix: str) -> None:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for name, pts in curves.items():
            hull = upper_hull(pts)
            ax.plot(hull[:, 0], hull[:, 1], label=name, marker=".", ms=3)
        ax.set_xlabel("expected cost (units of stage 1)")
        ax.set_ylabel("accuracy")
        ax.legend(fontsize=8)
        fig.tight_layout()
        log_figure(self, f"{prefix}/tradeoff", fig)
