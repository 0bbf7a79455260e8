"""LightningModule: a concept bottleneck family, with or without the concepts' information bottleneck (IB_B or IB_E).

Losses per batch (official `train_model`, sums over concepts, means over the batch):

    IB_B:  L = CE(y, q(y|z)) + lambda * BCE(c, z) + beta * (I_c - I_hat(X;C));   then beta <- beta + beta_lr * (I_c - I_hat)
    IB_E:  L = CE + (1 + beta) * lambda * BCE, plus (1 - beta) * H_hat(C) backpropagated into the concept heads only
    none:  L = CE + lambda * BCE

I_hat is the official minibatch estimator (`mi_estimator: minibatch`, ceiling log M) or the Gaussian variational bound
(`mi_estimator: gaussian`, no ceiling; see ib.py). I_hat and H_hat are computed on a fresh subsample of `mi_samples`
training inputs each batch (`mi_source: train`, as the
official code does) or on the batch itself (`mi_source: batch`). Manual optimisation, because IB_E's term is
backpropagated into a subset of the parameters (`manual_backward(..., inputs=...)`) before the main loss.
Family specifics: sequential trains the concepts for `sequential_concept_epochs` epochs, then only the label head on
frozen concept predictions; independent trains the label head on true concepts; CEM intervenes at random during
training (probability `cem_p_int`); ProbCBM adds a KL(N(mu, sigma) || N(0, I)) term.

Vanilla CBM in the same run (`vanilla_baseline`): a deterministic joint CBM (same heads, optimiser, schedule, batches)
trained alongside on CE + lambda * BCE, evaluated on the same points: its accuracy, concept accuracy and class leakage are
logged as `<stage>/<metric>_vanilla` and shown by the run summary next to the model's (`headline`).

Logged: train/val/test accuracy, concept accuracy, I_hat(X;C), I(C;Y) (information plane, figure at the end of fit),
beta; at test also intervention curves (random and uncertainty order; figure), and, with `leakage_metrics`, OIS, NIS
and class leakage. `self.test_results` holds the test numbers for benchmarks.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable

from lit_iclr.core import BaseModule, ConfigError
from lit_iclr.core.figures import log_figure
from lit_iclr.core.global_batch import rand_rows, randn_rows
from lit_iclr.core.summary import Headline

from . import interventions as tti
from .ib import dual_update, est_hc, est_mi, gaussian_mi_bound, mi_cy
from .model import FAMILIES, ConceptBottleneck


class CIBM(BaseModule):
    def __init__(
        self,
        input_shape: list[int] = (1344,),
        num_concepts: int = 15,
        num_classes: int = 16,
        concept_groups: list[list[int]] | None = None,
        family: Literal["joint", "sequential", "independent", "cem", "probcbm", "blackbox"] = "joint",
        ib: Literal["none", "B", "E"] = "B",
        stochastic: bool = True,
        hidden: int = 256,
        emb_dim: int = 16,
        backbone: str = "test_resnet",
        concept_weight: float = 1.0,
        beta: float = 0.5,
        beta_lr: float = -0.01,
        mi_const: float = 1.0,
        mi_samples: int = 200,
        mi_source: Literal["train", "batch"] = "train",
        jensen: bool = False,
        mi_estimator: Literal["minibatch", "gaussian"] = "minibatch",
        sample_at_eval: bool = True,
        sequential_concept_epochs: int | None = None,
        sequential_head_lr: float = 1e-2,
        cem_p_int: float = 0.25,
        probcbm_kl: float = 1e-4,
        use_scheduler: bool = True,
        intervention_trials: int = 5,
        leakage_metrics: bool = False,
        leakage_samples: int = 1000,
        nis_mode: str = "refit",
        probe_leakage: bool = True,
        vanilla_baseline: bool = True,
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-3),
    ):
        """
        Args:
            input_shape: [D] embeddings or [C, H, W] images (linked from the data).
            num_concepts: Number of concepts K (linked from the data).
            num_classes: Number of classes (linked from the data).
            concept_groups: Concept indices of each group, for interventions (linked from the data).
            family: joint | sequential | independent | cem | probcbm | blackbox (no concept supervision).
            ib: Information bottleneck: none, B (MI constraint with a dual beta) or E (entropy surrogate).
            stochastic: Gaussian concept layer; false gives the deterministic CBM (requires ib: none).
            hidden: Width of the concept heads.
            emb_dim: Per-concept embedding size (cem, probcbm).
            backbone: timm backbone for image inputs (end-to-end training).
            concept_weight: lambda, the weight of the concept BCE (official: 1).
            beta: Initial beta (official 0.5).
            beta_lr: Dual step on beta after each batch (official -0.01; IB_B only).
            mi_const: I_c, the information target of IB_B (official 1).
            mi_samples: Subsample size M of the I(X;C) / H(C) estimators (official 200).
            mi_source: Draw the subsample from the training set (`train`, official) or use the batch (`batch`).
            jensen: Jensen bound instead of logsumexp for the marginal p(z).
            mi_estimator: I(X;C) of IB_B and of the logged `mi_xc`: `minibatch` (official, Ji et al.; saturates at
                log M) or `gaussian` (variational KL bound to the subsample's moment-matched Gaussian; no ceiling).
            sample_at_eval: Sample z at evaluation too (official); false uses the mean.
            sequential_concept_epochs: Sequential family: epochs of concept training before the head (null: half).
            sequential_head_lr: Sequential: constant learning rate of the label-head stage (a separate convex fit in Koh
                et al.; the decayed concept-stage rate leaves it under-trained in a few epochs).
            cem_p_int: CEM: probability of a random training-time intervention per concept.
            probcbm_kl: ProbCBM: weight of KL(N(mu, sigma) || N(0, I)).
            use_scheduler: Cosine annealing of the learning rate over max_epochs (official).
            intervention_trials: Random-order intervention trials at test (official 5).
            leakage_metrics: Compute OIS, NIS and class leakage at test (a few seconds each).
            leakage_samples: Test points those metrics use at most (a seeded subset).
            nis_mode: NIS predictor: `refit` (a predictor per niche on the outside-niche concepts) or `reference` (the
                `concept-quality` code: one full-input predictor, niche zeroed, softmax over concepts); see leakage.py.
            probe_leakage: The class-leakage probe (soft minus hard concepts) at every validation and test, for the
                model and the vanilla baseline (a few logistic regressions on at most `leakage_samples` points).
            vanilla_baseline: Train a deterministic joint CBM alongside, on the same batches (the run's baseline).
            optimizer: Optimizer factory (official Adam, lr 1e-3).
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        self.automatic_optimization = False
        if family not in FAMILIES:
            raise ConfigError(f"model.family must be one of {FAMILIES}, got {family!r}")
        if ib != "none" and (family == "blackbox" or not (stochastic or family == "probcbm")):
            raise ConfigError(f"ib: {ib} needs a stochastic concept layer (stochastic: true, family other than blackbox)")
        if family == "blackbox" and stochastic:
            raise ConfigError("the blackbox reference is deterministic: set stochastic: false")
        if mi_estimator not in ("minibatch", "gaussian"):
            raise ConfigError(f"model.mi_estimator must be minibatch or gaussian, got {mi_estimator!r}")
        self.groups = [list(g) for g in (concept_groups or [[k] for k in range(num_concepts)])]
        self.net = ConceptBottleneck(list(input_shape), num_concepts, num_classes, family, stochastic, hidden, emb_dim, backbone)
        is_vanilla = family == "joint" and not stochastic and ib == "none"
        # built after `net`, so the model's initialisation (and every draw of its training) is the same with or without it
        self.vanilla = (ConceptBottleneck(list(input_shape), num_concepts, num_classes, "joint", False, hidden, emb_dim,
                                          backbone) if vanilla_baseline and family != "blackbox" and not is_vanilla else None)
        self.register_buffer("beta", torch.tensor(float(beta), dtype=torch.float64))
        self.plane: list[tuple[int, float, float]] = []  # (epoch, I_hat(X;C), I(C;Y)) at each validation
        self.test_results: dict = {}
        self._eval: dict[str, list] = {}

    # ---------------------------------------------------------------- training
    def _subsample(self, x: torch.Tensor, seed: int | None = None) -> torch.Tensor:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        pool = getattr(dm, "train_inputs", None)
        if self.hparams.mi_source == "batch" or pool is None:
            return x
        g = torch.Generator().manual_seed(self._step_seed() if seed is None else seed)
        m = min(self.hparams.mi_samples, len(pool))
        idx = torch.randperm(len(pool), generator=g)[:m]
        return pool[idx].to(x.device)

    def _concepts_trained(self) -> bool:
        """False during the sequential family's second stage (label head only)."""
        if self.hparams.family != "sequential":
            return True
        n = self.hparams.sequential_concept_epochs
        if n is None:
            n = max(1, (self.trainer.max_epochs or 2) // 2)
        return self.current_epoch < n

    def _step_seed(self) -> int:
        """Seed of this step's random draws: a function of (run seed, global step) only, so a resumed fit draws the same."""
        return int(self.global_step) * 7919 + torch.initial_seed() % 100003

    def training_step(self, batch, batch_idx):
        # eps of z = mu + sigma * eps and CEM's training interventions come from the global RNG, which a checkpoint does not
        # hold: fork it and seed it per step, so an interrupted and resumed fit makes the same draws as an uninterrupted one.
        seed = self._step_seed()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed + 1)
            return self._training_step(batch, seed)

    def _mi(self, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        if self.hparams.mi_estimator == "gaussian":
            return gaussian_mi_bound(mu, sigma)
        return est_mi(mu, sigma, jensen=self.hparams.jensen)

    def losses(self, batch, seed: int, beta: float, sub_x: torch.Tensor | None = None) -> dict:
        """The step's losses: `loss` (the model's, IB_B term included), `hc` (IB_E's H_hat, backpropagated separately),
        `mi` (IB_B's I_hat), `loss_vanilla` (the baseline's); `sub_x` replaces the I(X;C) subsample (the plan's)."""
        hp = self.hparams
        x, c, y = batch["x"], batch["c"], batch["y"]
        concepts_stage = self._concepts_trained()
        enc = self.net.encode(x)
        # eps and the intervention mask drawn for the global batch, this rank's rows kept: under DDP the ranks' draws
        # together are one process's, and the RNG then draws I(X;C)'s z on the (shared) subsample as one process does
        z = self.net.sample(enc, eps=randn_rows(enc["mu"]) if "sigma" in enc else None)
        mask = None
        if hp.family == "cem" and hp.cem_p_int > 0:
            mask = rand_rows(c) < hp.cem_p_int
        out = self.net.decide(enc, z, c_true=c, mask=mask, detach_concepts=not concepts_stage)
        bce = F.binary_cross_entropy_with_logits(out["c_logits"], c, reduction="none").sum(1).mean()
        ce = F.cross_entropy(out["y_logits"], y)
        if hp.family == "blackbox":
            loss = ce
        elif hp.family == "sequential":
            loss = hp.concept_weight * bce if concepts_stage else ce
        elif hp.family == "independent":
            ce_true = F.cross_entropy(self.net.decide(enc, z, c_true=c, head_on_true=True)["y_logits"], y)
            loss = ce_true + hp.concept_weight * bce
        else:
            loss = ce + hp.concept_weight * bce
        if hp.family == "probcbm" and concepts_stage:
            mu, sigma = enc["mu"], enc["sigma"]
            kl = 0.5 * (mu**2 + sigma**2 - 1 - 2 * torch.log(sigma)).sum(1).mean()
            loss = loss + hp.probcbm_kl * kl
        res: dict = {"y_logits": out["y_logits"]}
        use_ib = hp.ib != "none" and concepts_stage
        if use_ib and hp.ib == "B":
            if sub_x is None and hp.mi_source == "train":
                sub_x = self._subsample(x, seed)
            sub = self.net.encode(sub_x) if sub_x is not None else enc
            mi = self._mi(sub["mu"], sub["sigma"])
            loss = loss + beta * (hp.mi_const - mi)                # beta * (I_c - I_hat)
            res["mi"] = mi
        elif use_ib and hp.ib == "E":
            loss = loss + beta * hp.concept_weight * bce           # (1 + beta) * BCE in total
            if hp.mi_source == "train":
                with torch.no_grad():  # the backbone gets no gradient from H(C): only the heads' inputs are needed
                    h_sub = self.net.features(self._subsample(x, seed) if sub_x is None else sub_x)
                sigma_sub = self.net.latent(h_sub)["sigma"]
            else:
                sigma_sub = enc["sigma"]
            res["hc"] = est_hc(sigma_sub)
        if self.vanilla is not None:  # the baseline: a deterministic joint CBM on the same batch, CE + lambda * BCE
            enc_v = self.vanilla.encode(x)
            out_v = self.vanilla.decide(enc_v, enc_v["mu"])
            res["loss_vanilla"] = (F.cross_entropy(out_v["y_logits"], y) + hp.concept_weight
                                   * F.binary_cross_entropy_with_logits(out_v["c_logits"], c, reduction="none").sum(1).mean())
        res["loss"] = loss
        return res

    def _training_step(self, batch, seed: int):
        hp = self.hparams
        y = batch["y"]
        opt = self.optimizers()
        if not self._concepts_trained():  # sequential head stage: its own constant rate (the model's group only)
            opt.param_groups[0]["lr"] = hp.sequential_head_lr
        beta = float(self.beta)
        r = self.losses(batch, seed, beta)
        loss = r["loss"]
        if "hc" in r:
            # H(C) reaches only the concept encoder heads (official: backward(inputs=pred_mu + pred_sigma params))
            self.manual_backward((1 - beta) * r["hc"], inputs=self.net.head_params(), retain_graph=True)
            self.log("train/h_c", r["hc"].detach(), batch_size=len(y))
        # one backward for both: the two graphs share no parameter, and Adam's state is per parameter
        self.manual_backward(loss + r["loss_vanilla"] if "loss_vanilla" in r else loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mi = r.get("mi")
        if mi is not None:  # Lagrangian dual step after the batch (official sign: beta_lr < 0)
            self.beta.fill_(dual_update(beta, float(mi.detach()), hp.mi_const, hp.beta_lr))
            self.log("train/mi_xc", mi.detach(), batch_size=len(y))
        if "loss_vanilla" in r:
            self.log("train/loss_vanilla", r["loss_vanilla"].detach(), batch_size=len(y))
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=len(y))
        self.log("train/acc", (r["y_logits"].argmax(-1) == y).float().mean(), batch_size=len(y))
        self.log("train/beta", float(self.beta), batch_size=len(y))
        return loss.detach()

    def on_train_epoch_end(self):
        sch = self.lr_schedulers()
        if sch is not None:
            sch.step()

    # ---------------------------------------------------------------- evaluation
    def _eval_step(self, batch, batch_idx: int):
        enc = self.net.encode(batch["x"])
        # eval's z from a generator seeded by the batch: the same draws on every rank and in every validation, whatever
        # training drew before (the global RNG's state differs between 1 process and DDP ranks)
        g = torch.Generator(device=enc["mu"].device).manual_seed(7000 + batch_idx)
        eps = torch.randn(enc["mu"].shape, generator=g, device=enc["mu"].device, dtype=enc["mu"].dtype)
        z = self.net.sample(enc, self.hparams.sample_at_eval, eps=eps)
        out = self.net.decide(enc, z)
        keep = {"y": batch["y"], "c": batch["c"], "y_logits": out["y_logits"], "c_logits": out["c_logits"], "mu": enc["mu"]}
        if self.vanilla is not None:
            enc_v = self.vanilla.encode(batch["x"])
            out_v = self.vanilla.decide(enc_v, enc_v["mu"])
            keep["y_logits_v"], keep["c_logits_v"] = out_v["y_logits"], out_v["c_logits"]
        if "sigma" in enc:
            keep["sigma"] = enc["sigma"]
        if "emb" in enc:
            keep["emb"] = enc["emb"]
        for k, v in keep.items():
            self._eval.setdefault(k, []).append(v.detach())

    def _collect(self) -> dict[str, torch.Tensor]:
        out = {k: torch.cat(v) for k, v in self._eval.items()}
        self._eval = {}
        return out

    def _summary(self, r: dict[str, torch.Tensor], stage: str) -> dict[str, float]:
        hp = self.hparams
        res = {"acc": (r["y_logits"].argmax(-1) == r["y"]).float().mean().item(),
               "mi_cy": mi_cy(r["y_logits"], r["y"], hp.num_classes).item()}
        if hp.family != "blackbox":
            res["concept_acc"] = ((r["c_logits"] > 0).float() == r["c"]).float().mean().item()
        if "y_logits_v" in r:
            res["acc_vanilla"] = (r["y_logits_v"].argmax(-1) == r["y"]).float().mean().item()
            res["concept_acc_vanilla"] = ((r["c_logits_v"] > 0).float() == r["c"]).float().mean().item()
        if hp.probe_leakage and hp.family != "blackbox":
            res.update(self._probe(r))
        # I_hat's z draws in a fixed RNG stream: the estimate is then the same on every rank and in every run, whatever
        # the process's RNG state (which differs between DDP ranks and one process)
        with torch.random.fork_rng(devices=[r["mu"].device] if r["mu"].device.type == "cuda" else []):
            torch.manual_seed(0)
            self._summary_mi(r, res, stage)
        for k, v in res.items():
            self.log(f"{stage}/{k}", v, prog_bar=k == "acc")
        return res

    def _summary_mi(self, r: dict[str, torch.Tensor], res: dict[str, float], stage: str) -> None:
        hp = self.hparams
        if "sigma" in r:
            g = torch.Generator(device=r["mu"].device).manual_seed(0)
            idx = torch.randperm(len(r["mu"]), generator=g, device=r["mu"].device)[:hp.mi_samples]
            res["mi_xc"] = self._mi(r["mu"][idx], r["sigma"][idx]).item()
            res["mi_xc_bound"] = gaussian_mi_bound(r["mu"][idx], r["sigma"][idx]).item()  # no ceiling, for comparison
            if stage == "test":  # the estimator's ceiling is log M: I_hat at other subsample sizes, and sigma vs spread of mu
                for m in (32, 400, 1000) if r["mu"].dim() == 2 else (32, 400):  # (M, M, K, D) pairs: bounded
                    sub = torch.randperm(len(r["mu"]), generator=g, device=r["mu"].device)[:m]
                    res[f"mi_xc_m{m}"] = est_mi(r["mu"][sub], r["sigma"][sub], jensen=hp.jensen).item()
                res["sigma_median"] = r["sigma"].median().item()
                res["mu_std"] = r["mu"].flatten(1).std(0).mean().item()

    def _probe(self, r: dict[str, torch.Tensor]) -> dict[str, float]:
        """Class leakage (probe on soft minus hard concepts) of the model and the vanilla baseline, on the same points."""
        from .leakage import class_leakage

        sub = torch.randperm(len(r["y"]), generator=torch.Generator().manual_seed(0))[:self.hparams.leakage_samples]
        y = r["y"][sub].cpu().numpy()
        out = {}
        for tag, key in (("", "c_logits"), ("_vanilla", "c_logits_v")):
            if key in r:
                probe = class_leakage(torch.sigmoid(r[key][sub]).cpu().numpy(), y)
                if probe:
                    out.update({f"{k}{tag}": v for k, v in probe.items()})
        return out

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx)

    def on_validation_epoch_end(self):
        if not self._eval:
            return
        res = self._summary(self._collect(), "val")
        if not self.trainer.sanity_checking and "mi_xc" in res:
            self.plane.append((self.current_epoch, res["mi_xc"], res["mi_cy"]))

    def on_fit_end(self):
        if self.plane:
            from .plots import information_plane

            log_figure(self, "fit/information_plane", information_plane(self.plane, self._label()))

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx)

    def _label(self) -> str:
        hp = self.hparams
        return hp.family + ("" if hp.ib == "none" else f" + IB_{hp.ib}") + ("" if hp.stochastic or hp.ib != "none" else " (det.)")

    @torch.no_grad()
    def _interventions(self, r: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        hp = self.hparams
        enc = {k: r[k] for k in ("mu", "sigma", "emb") if k in r}
        k = hp.num_concepts
        sample = hp.sample_at_eval

        def predict(mask):
            z = self.net.sample(enc, sample)
            return self.net.decide(enc, z, c_true=r["c"], mask=mask)["y_logits"]

        g = torch.Generator().manual_seed(0)
        rand = np.mean([tti.intervention_curve(predict, tti.random_order(len(r["y"]), len(self.groups), g).to(r["y"].device),
                                               self.groups, k, r["y"]) for _ in range(hp.intervention_trials)], axis=0)
        logits_mean = self.net.concept_logits(r["mu"])
        sigma = r.get("sigma") if hp.family != "probcbm" else None
        order = tti.uncertainty_order(logits_mean, sigma, self.groups)
        unc = tti.intervention_curve(predict, order, self.groups, k, r["y"])
        return {"random": rand, "uncertainty": unc}

    def on_test_epoch_end(self):
        if not self._eval:
            return
        r = self._collect()
        res = self._summary(r, "test")
        if self.hparams.family != "blackbox":
            curves = self._interventions(r)
            for name, curve in curves.items():
                for key, v in tti.summarize(curve).items():
                    res[f"tti_{name}_{key}"] = v
                    self.log(f"test/tti_{name}_{key}", v)
            res["curves"] = {k: v.tolist() for k, v in curves.items()}
            from .plots import intervention_figure

            log_figure(self, "test/interventions", intervention_figure({self._label(): curves["random"]}))
            if self.hparams.leakage_metrics:
                from .leakage import niche_impurity_score, oracle_impurity_score

                # on at most `leakage_samples` test points (seeded), to bound the K^2 probe fits
                sub = torch.randperm(len(r["y"]), generator=torch.Generator().manual_seed(0))[:self.hparams.leakage_samples]
                probs = torch.sigmoid(r["c_logits"][sub]).cpu().numpy()
                c_true = r["c"][sub].cpu().numpy()
                res["ois"] = oracle_impurity_score(probs, c_true)
                res["nis"] = niche_impurity_score(probs, c_true, mode=self.hparams.nis_mode)
                if "leakage" not in res:  # the probe, when `probe_leakage` did not already log it
                    res.update(self._probe({"y": r["y"], "c_logits": r["c_logits"]}))
                for key in ("ois", "nis", "leakage", "probe_soft", "probe_hard"):
                    if key in res:
                        self.log(f"test/{key}", res[key])
        res["beta"] = float(self.beta)
        res["plane"] = list(self.plane)
        self.test_results = res

    # ---------------------------------------------------------------- optimisation
    def setup(self, stage: str) -> None:
        # concept groups a lazy reader knew only after reading its files (a config that states the sizes links none)
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        groups = getattr(dm, "concept_groups", None)
        if self.hparams.concept_groups is None and groups:
            self.groups = [list(g) for g in groups]

    def headline(self) -> Headline:
        base = {"vanilla CBM": "{stage}/acc_vanilla"} if self.vanilla is not None else {}
        extra = ("{stage}/concept_acc", "{stage}/concept_acc_vanilla", "{stage}/leakage", "{stage}/leakage_vanilla",
                 "{stage}/mi_xc", "{stage}/mi_xc_bound")
        return Headline(metric="{stage}/acc", higher_is_better=True, baselines=base, method=self._label(), extra=extra,
                        claim="IB-CBM is at least as accurate as a vanilla CBM and leaks less class information "
                              "(leakage = probe on soft minus hard concepts)")

    def configure_optimizers(self):
        main = [p for n, p in self.named_parameters() if not n.startswith("vanilla.")]
        groups = [{"params": main}]
        if self.vanilla is not None:  # a second group, so the sequential head stage's rate reaches the model only
            groups.append({"params": list(self.vanilla.parameters())})
        opt = self.optimizer(groups)
        if not self.hparams.use_scheduler:
            return opt
        t_max = max(1, self.trainer.max_epochs or 1) if self._trainer is not None else 1
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_max)}
