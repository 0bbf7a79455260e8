"""LightningModules: the predictors (fit, checkpointed along the way) and the trajectory sampler (a `predict` run).

`LandscapePredictor` / `ImageClassifier` are ordinary supervised models; fitting them with
`ModelCheckpoint(save_top_k=-1, every_n_train_steps=N)` leaves the training trajectory in `<run>/checkpoints/`.
`TrajectorySampler` loads such a folder and, for each batch of queries from the DataModule's `predict_dataloader`,
runs the annealed sampler across the checkpoints (or a final-model baseline with the same evaluation budget).
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.cli import OptimizerCallable

from lit_iclr.core import BaseModule
from lit_iclr.core.summary import Headline

from .annealing import SAMPLERS, Kernel, sample
from .headline import METRICS, compare_samplers
from .model import LandscapeMLP, SmallCNN
from .trajectory import as_score, load_trajectory


def _adam(params):
    return torch.optim.Adam(params, lr=1e-3)


class LandscapePredictor(BaseModule):
    """Regressor f_theta(x) of a landscape's scores (MSE), trained on (x, y) tables; its checkpoints are the ladder."""

    def __init__(self, input_dim: int, hidden: int = 128, depth: int = 2, activation: str = "relu",
                 optimizer: OptimizerCallable = _adam, domain: str = "binary", compare_samplers: bool = True,
                 sampler_checkpoints: int = 20, sampler_steps: int = 15, sampler_chains: int = 128,
                 sampler_beta: float = 1.0, sampler_beta_min: float = 0.1, sampler_step_size: float = 0.1,
                 sampler_seed: int = 0):
        """
        Args:
            input_dim: Flattened input size (bits, sequence length x 4, or point dimension); linked from the data.
            hidden: Hidden width of the MLP.
            depth: Number of hidden layers.
            activation: relu | silu | tanh | gelu.
            optimizer: Optimizer (a callable of the parameters).
            domain: binary | categorical | continuous (what the sampler moves on); linked from the data.
            compare_samplers: After training, sample with the trajectory ladder and the final-model baselines
                (final, temperature annealing, parallel tempering; same budget) and log their scores (the headline).
            sampler_checkpoints: K, training steps (evenly spaced) whose weights form that ladder.
            sampler_steps: m, MCMC steps per ladder stage; every sampler runs K * m steps per chain.
            sampler_chains: Chains per sampler.
            sampler_beta: Inverse temperature beta of the target exp(beta f_final).
            sampler_beta_min: Lowest beta of the temperature-annealing and tempering ladders.
            sampler_step_size: MALA step size (continuous inputs).
            sampler_seed: Seed of the chains' starts and moves.
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        self.net = LandscapeMLP(input_dim, hidden, depth, activation)
        # R^2 of the whole validation set (1 - SSE / SST over all samples, its sums reduced over ranks), not a mean of
        # per-batch R^2 values, which depends on how the set is batched and split
        self.val_r2 = torchmetrics.R2Score()
        self._ladder: list[tuple[int, dict[str, torch.Tensor]]] = []
        self._every = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self(batch["x"]), batch["y"])
        self.log("train/mse", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        pred = self(batch["x"])
        mse = F.mse_loss(pred, batch["y"])
        # sync_dist: the ranks' shares of the validation set, weighted by their sizes (each sample once)
        n = len(batch["y"])
        self.log("val/mse", mse, prog_bar=True, batch_size=n, sync_dist=True)
        self.val_r2.update(pred.detach().flatten(), batch["y"].flatten())
        self.log("val/r2", self.val_r2)

    def configure_optimizers(self):
        return self.optimizer(self.parameters())

    # ---------------------------------------------------------------- the fit's own sampler comparison (headline)
    def _snapshot(self) -> None:
        state = {k: v.detach().cpu().clone() for k, v in self.net.state_dict().items()}
        self._ladder.append((int(self.global_step), state))

    def on_train_start(self) -> None:
        # estimated_stepping_batches already holds max_steps; reading max_steps itself would size a run stopped by
        # max_steps (and resumed) differently from the same run unstopped
        total = int(self.trainer.estimated_stepping_batches)
        self._every = max(1, -(-total // max(1, self.hparams.sampler_checkpoints)))  # ceil: K stages span the run
        if self.global_step == 0:  # a resumed fit keeps the ladder its checkpoint brought back
            self._ladder = []

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # the snapshots taken so far: a fit resumed after a stop anneals over the same ladder as one never stopped
        super().on_save_checkpoint(checkpoint)
        checkpoint["sampler_ladder"] = [{"step": step, "state": state} for step, state in self._ladder]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._ladder = [(int(e["step"]), e["state"]) for e in checkpoint.get("sampler_ladder", [])]

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.hparams.compare_samplers and self.global_step % self._every == 0 \
                and len(self._ladder) < self.hparams.sampler_checkpoints:
            self._snapshot()

    def on_train_end(self) -> None:
        hp = self.hparams
        dm = getattr(self.trainer, "datamodule", None)
        if not hp.compare_samplers or dm is None or not hasattr(dm, "chain_starts"):
            return
        if not self._ladder or self._ladder[-1][0] != self.global_step:
            self._snapshot()  # the ladder ends at the final model
        models = []
        for _, state in self._ladder:
            net = copy.deepcopy(self.net).cpu()
            net.load_state_dict(state)
            models.append(net.requires_grad_(False))
        t0 = time.perf_counter()
        results = compare_samplers(models, dm, hp.sampler_chains, hp.sampler_steps, hp.sampler_beta,
                                   hp.sampler_beta_min, hp.sampler_step_size, hp.sampler_seed)
        results["checkpoints"] = float(len(models))
        results["seconds"] = time.perf_counter() - t0
        metrics = {f"val/sampler_{k}": float(v) for k, v in results.items()}
        for logger in self.loggers:  # after the last training step: straight to the loggers, and to the summary
            logger.log_metrics(metrics, step=int(self.global_step))
            logger.save()
        for k, v in metrics.items():
            self.trainer.callback_metrics[k] = torch.tensor(v)

    def headline(self) -> Headline:
        domain = self.hparams.get("domain", "binary")
        name, higher = METRICS.get(domain, METRICS["binary"])
        label = {"tv": "TV to exp(beta f_final)", "score": "mean true score of the samples",
                 "mode_tv": "mode-histogram TV"}[name]
        extra = [f"{{stage}}/sampler_{name}_start"] + ([f"{{stage}}/sampler_{name}_floor"] if name == "tv" else [])
        extra += [f"{{stage}}/sampler_needle_rate_{m}" for m in SAMPLERS] if domain == "binary" else []
        extra += ["{stage}/sampler_checkpoints", "{stage}/sampler_evaluations_per_chain", "{stage}/sampler_seconds"]
        return Headline(
            metric=f"{{stage}}/sampler_{name}_trajectory", higher_is_better=higher,
            baselines={m if m != "final" else "final-model MCMC": f"{{stage}}/sampler_{name}_{m}"
                       for m in SAMPLERS if m != "trajectory"},
            method="trajectory annealing",
            claim=f"annealing across the training checkpoints beats single-model samplers at the same budget ({label})",
            extra=tuple(extra))


class ImageClassifier(BaseModule):
    """CNN classifier of (binarised) images (cross-entropy); its checkpoints drive counterfactual sampling."""

    def __init__(self, num_classes: int = 10, width: int = 16, image_size: int = 28, optimizer: OptimizerCallable = _adam):
        """
        Args:
            num_classes: Number of classes; linked from the data.
            width: Channels of the first conv block (the second and third have twice as many).
            image_size: Side of the square images (flattened inputs are reshaped to it).
            optimizer: Optimizer (a callable of the parameters).
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        self.net = SmallCNN(num_classes, width, image_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["x"]), batch["y"])
        self.log("train/ce", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        logits = self(batch["x"])
        n = len(batch["y"])  # sync_dist: each sample of the ranks' shares once
        self.log("val/ce", F.cross_entropy(logits, batch["y"]), batch_size=n, sync_dist=True)
        self.log("val/acc", (logits.argmax(-1) == batch["y"]).float().mean(), prog_bar=True, batch_size=n, sync_dist=True)

    def headline(self) -> Headline:
        # this fit only trains the predictor; the method's comparison (trajectory annealing vs single-model samplers)
        # is the `predict` run of configs/trajectory_sampler_counterfactual_sample.yaml over this run's checkpoints
        return Headline(metric="{stage}/acc", higher_is_better=True, method="predictor",
                        claim="accuracy of the classifier whose saved training checkpoints the counterfactual "
                              "sampler anneals across (next: predict with trajectory_sampler_counterfactual_sample)")

    def configure_optimizers(self):
        return self.optimizer(self.parameters())


class TrajectorySampler(BaseModule):
    """Samples pi(x) ~ exp(beta f(x)) * 1[x in constraint set] by annealing across a predictor's training checkpoints.

    Batches from `predict_dataloader` hold `x0` (queries' start states) and optionally `x_ref` (reference inputs the edit
    budget and penalty refer to) and `target` (class for a classifier's log p(target | x)). Writes `samples.pt` (tensors)
    and `summary.json` into the run folder.
    """

    def __init__(self, checkpoint_dir: str, predictor_class: str | None = None,
                 method: Literal["trajectory", "final", "temperature", "tempering"] = "trajectory",
                 domain: Literal["binary", "categorical", "continuous"] = "binary", max_checkpoints: int | None = None,
                 spacing: Literal["even", "log"] = "even", steps_per_checkpoint: int = 20, beta: float = 1.0,
                 beta_min: float = 0.05, replicas: int = 4, smc: bool = False, ess_threshold: float = 0.5,
                 step_size: float = 0.05, chains_per_query: int = 1, edit_budget: int | None = None,
                 edit_penalty: float = 0.0, fixed_positions: list[int] | None = None, target_class: int | None = None,
                 seed: int = 0):
        """
        Args:
            checkpoint_dir: Folder of the predictor's checkpoints (or a glob; the newest matching folder is used).
            predictor_class: Dotted path of the LightningModule that wrote them; null reads it from the checkpoints.
            method: trajectory (the paper) | final | temperature | tempering (baselines on the final model, same budget).
            domain: binary (bits, GWG) | categorical (one-hot, GWG) | continuous (MALA); linked from the data.
            max_checkpoints: Use at most this many checkpoints (K) of the folder; null uses all.
            spacing: How the K checkpoints are picked: even (in checkpoint order) | log (log-spaced in steps).
            steps_per_checkpoint: MCMC steps m per checkpoint; every method runs K*m steps per chain.
            beta: Inverse temperature of the target exp(beta f).
            beta_min: Lowest inverse temperature of the temperature-annealing / tempering ladders.
            replicas: Parallel-tempering replicas (each replica step costs one evaluation).
            smc: Reweight (w ~ pi_k / pi_{k-1}) and resample chains between checkpoints when the ESS drops.
            ess_threshold: Resample when ESS < ess_threshold * chains per query.
            step_size: MALA step size epsilon (continuous domain).
            chains_per_query: Chains started from each query of the batch (SMC resamples within a query's chains).
            edit_budget: At most this many positions may differ from the query's `x_ref` (hard constraint); null: none.
            edit_penalty: lambda in f(x) - lambda * (positions differing from `x_ref`), favouring minimal edits.
            fixed_positions: Positions (bits / sequence positions) that never change.
            target_class: Class whose log-probability is f(x) for classifiers when the batch has no `target`.
            seed: Seed of the chains' random numbers.
        """
        super().__init__()
        self.save_hyperparameters()
        self.trajectory: torch.nn.ModuleList | None = None
        self.steps: list[int] = []
        self._outputs: list[dict[str, torch.Tensor]] = []
        self._stats: list[dict[str, float]] = []

    # ---------------------------------------------------------------- loading the ladder
    def setup(self, stage: str) -> None:
        if self.trajectory is None:
            hp = self.hparams
            steps, models = load_trajectory(hp.checkpoint_dir, hp.predictor_class, hp.max_checkpoints, hp.spacing)
            self.steps, self.trajectory = steps, torch.nn.ModuleList(models)

    # ---------------------------------------------------------------- domain adapters
    def _to_chains(self, x: torch.Tensor) -> torch.Tensor:
        if self.hparams.domain == "binary":  # bits (C, n) -> one-hot (C, n, 2) so GWG treats a flip as a letter change
            return F.one_hot(x.round().long(), 2).float()
        return x.float()

    def _from_chains(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., 1] if self.hparams.domain == "binary" else x

    def _edits(self, x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """Number of positions where chains x differ from the reference (C,)."""
        if self.hparams.domain == "continuous":
            return (x - ref).abs().flatten(1).sum(-1)
        return (x != ref).any(-1).flatten(1).sum(-1).float()

    def _allowed(self, ref: torch.Tensor | None):
        fixed, budget = self.hparams.fixed_positions or [], self.hparams.edit_budget
        if not fixed and (budget is None or ref is None):
            return None

        def allowed(x: torch.Tensor) -> torch.Tensor:
            ok = torch.ones_like(x, dtype=torch.bool)
            if fixed:
                ok[:, fixed] = False
            if budget is not None and ref is not None:
                changed = (x != ref).any(-1)  # (C, L)
                full = changed.sum(-1) >= budget  # at the budget only already-changed positions may move
                ok &= ~(full[:, None] & ~changed)[..., None]
            return ok

        return allowed

    def _scores(self, ref, target):
        penalty = self.hparams.edit_penalty
        scores = []
        for model in self.trajectory:
            f = as_score(model, target)
            if penalty and ref is not None:
                scores.append(lambda x, f=f: f(self._from_chains(x)) - penalty * self._edits(x, ref))
            else:
                scores.append(lambda x, f=f: f(self._from_chains(x)))
        return scores

    # ---------------------------------------------------------------- predict loop
    def predict_step(self, batch, batch_idx):
        # predict runs under inference mode; the kernels need gradients w.r.t. the inputs, so leave it here
        with torch.inference_mode(False), torch.enable_grad():
            batch = {k: v.clone() for k, v in batch.items()}
            return self._sample_batch(batch, batch_idx)

    def _sample_batch(self, batch, batch_idx):
        hp = self.hparams
        R = hp.chains_per_query
        rep = lambda t: t.repeat_interleave(R, 0) if t is not None else None
        x0 = self._to_chains(rep(batch["x0"]))
        ref = self._to_chains(rep(batch["x_ref"])) if "x_ref" in batch else None
        target = batch.get("target")
        if target is None and hp.target_class is not None:
            target = torch.full((len(batch["x0"]),), hp.target_class, device=x0.device)
        target = rep(target)
        if hp.domain == "continuous" and (hp.fixed_positions or hp.edit_budget is not None):
            raise ValueError("fixed_positions / edit_budget apply to binary and categorical inputs only")
        kernel = Kernel("mala" if hp.domain == "continuous" else "gwg", hp.step_size, self._allowed(ref))
        gen = torch.Generator(device=x0.device).manual_seed(hp.seed + batch_idx)
        t0 = time.perf_counter()
        state, trace = sample(hp.method, self._scores(ref, target), x0, hp.beta, hp.steps_per_checkpoint, kernel,
                              beta_min=hp.beta_min, replicas=hp.replicas, smc=hp.smc, ess_threshold=hp.ess_threshold,
                              groups=len(batch["x0"]), generator=gen)
        seconds = time.perf_counter() - t0
        x = self._from_chains(state.x)
        with torch.no_grad():
            final = self.trajectory[-1](x)
        out = {"x": x.detach().cpu(), "query": torch.arange(len(batch["x0"])).repeat_interleave(R) + batch_idx * 10**6}
        if final.dim() == 2 and final.shape[1] > 1:
            out["predicted_class"] = final.argmax(-1).cpu()
            out["target"] = target.cpu()
            out["score"] = as_score(self.trajectory[-1], target)(x).cpu()
        else:
            out["score"] = final.reshape(-1).cpu()
        if ref is not None:
            out["edits"] = self._edits(state.x, ref).cpu()
        self._outputs.append(out)
        self._stats.append({"seconds": seconds, "chains": len(x), "evaluations": trace.evaluations,
                            "acceptance": trace.accepted, "resamples": trace.resamples})
        return out

    def on_predict_epoch_start(self) -> None:
        self._outputs, self._stats = [], []

    def on_predict_end(self) -> None:
        if not self._outputs or not self.trainer.is_global_zero:
            return
        samples = {k: torch.cat([o[k] for o in self._outputs]) for k in self._outputs[0]}
        summary = self.summarize(samples)
        datamodule = getattr(self.trainer, "datamodule", None)
        if hasattr(datamodule, "evaluate_samples"):
            summary.update(datamodule.evaluate_samples(samples["x"]))
        run = Path(self.trainer.default_root_dir)
        run.mkdir(parents=True, exist_ok=True)
        torch.save(samples, run / "samples.pt")
        (run / "summary.json").write_text(json.dumps(summary, indent=2))
        print("trajectory sampler:", json.dumps(summary))

    def summarize(self, samples: dict[str, torch.Tensor]) -> dict:
        hp = self.hparams
        secs = sum(s["seconds"] for s in self._stats)
        evals = self._stats[0]["evaluations"]
        out = {"method": hp.method, "checkpoints": len(self.steps), "checkpoint_steps": self.steps,
               "chains": int(sum(s["chains"] for s in self._stats)), "evaluations_per_chain": evals,
               "acceptance": sum(s["acceptance"] for s in self._stats) / len(self._stats),
               "score_mean": float(samples["score"].mean()), "score_max": float(samples["score"].max()),
               "seconds": secs, "chain_steps_per_s": float(sum(s["chains"] * s["evaluations"] for s in self._stats) / secs)}
        if "predicted_class" in samples:
            out["success_rate"] = float((samples["predicted_class"] == samples["target"]).float().mean())
        if "edits" in samples:
            out["edits_mean"] = float(samples["edits"].mean())
        return out

    def configure_optimizers(self):
        return None
