"""LightningModule: a 3-D encoder (SchNet or PaiNN) trained on a QM9 target, whose pooled atom features are the
representation scored on the 3DCS axes (`embed`), during validation and by `benchmarks/three_dcs.py`."""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from lightning.pytorch.cli import OptimizerCallable

from lit_iclr.core import BaseModule
from lit_iclr.core.figures import log_figure
from lit_iclr.core.summary import Headline

from .model import ENCODERS, pad_molecules


class ConformerEncoder(BaseModule):
    def __init__(self, encoder: Literal["schnet", "painn"] = "schnet", hidden: int = 64, n_interactions: int = 3,
                 n_rbf: int = 32, cutoff: float = 5.0, extensive: bool = True,
                 optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-3), gce_every_n_epochs: int = 1,
                 metric_version: Literal["paper", "v2", "release"] = "paper", unsup_kmax: int | None = 10,
                 energy_window: int = 50, plot: bool = True):
        """
        Args:
            encoder: `schnet` (invariant continuous-filter convolutions) or `painn` (E(3)-equivariant scalar/vector).
            hidden: Feature width (= embedding dimension).
            n_interactions: Message-passing blocks.
            n_rbf: Radial basis functions on [0, cutoff].
            cutoff: Interaction cutoff in Angstrom.
            extensive: Sum (extensive target, energy) or mean (intensive, gap) readout (linked from the data).
            optimizer: Optimizer factory.
            gce_every_n_epochs: Score the embedding on the 3DCS benchmark every this many validation epochs (0: never).
            metric_version: 3DCS metric definitions, `paper` (published tables), `v2` (paper text) or `release` (the
                released three_dbench 0.1.0 code).
            unsup_kmax: Largest k of the unsupervised-silhouette scan (null: n - 1 as in the published run).
            energy_window: Frames per trajectory window of the energy axis.
            plot: Log the distance-vs-torsion figure with each GCE evaluation.
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        if encoder not in ENCODERS:
            raise ValueError(f"model.encoder must be one of {list(ENCODERS)}, got {encoder!r}")
        self.net = ENCODERS[encoder](hidden=hidden, n_interactions=n_interactions, n_rbf=n_rbf, cutoff=cutoff,
                                     extensive=extensive)
        self._abs_err: list[torch.Tensor] = []
        self._init_state: dict[str, torch.Tensor] | None = None  # the encoder before training: a baseline MR
        self._baseline_scores: dict[str, dict] | None = None  # fixed baselines are scored once per run

    def forward(self, z: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(z, pos)

    @torch.no_grad()
    def embed(self, mols, batch_size: int = 256) -> np.ndarray:
        """(C, hidden) float32 embeddings of RDKit conformers (hydrogens kept), in input order."""
        was_training = self.training
        self.eval()
        zs = [np.array([a.GetAtomicNum() for a in m.GetAtoms()]) for m in mols]
        ps = [m.GetConformer().GetPositions() for m in mols]
        out = []
        for s in range(0, len(mols), batch_size):
            Z, P = pad_molecules(zs[s:s + batch_size], ps[s:s + batch_size])
            out.append(self(Z.to(self.device), P.to(self.device))[1].float().cpu())
        self.train(was_training)
        return torch.cat(out).numpy()

    def training_step(self, batch, batch_idx):
        pred, _ = self(batch["z"], batch["pos"])
        loss = torch.nn.functional.mse_loss(pred, batch["y"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["y"]))
        return loss

    def validation_step(self, batch, batch_idx):
        pred, _ = self(batch["z"], batch["pos"])
        self._abs_err.append((pred - batch["y"]).abs().detach())

    def on_validation_epoch_end(self):
        # each rank holds its share of the validation set: the sum and count of the errors are reduced over the ranks
        # (every rank takes part, also one whose share was empty), so the MAE counts each molecule once
        err = torch.cat(self._abs_err) if self._abs_err else torch.zeros(0, device=self.device)
        self._abs_err = []
        strategy = self.trainer.strategy
        total = strategy.reduce(err.sum().double(), reduce_op="sum")
        count = strategy.reduce(torch.tensor(float(err.numel()), dtype=torch.float64, device=err.device), reduce_op="sum")
        if float(count) > 0:
            mae = (total / count).float()
            dm = getattr(self.trainer, "datamodule", None)
            self.log("val/mae", mae, prog_bar=True)
            if dm is not None and hasattr(dm, "y_std"):
                self.log("val/mae_ev", mae * dm.y_std)  # in the target's unit (eV)
        k = self.hparams.gce_every_n_epochs
        if k and not self.trainer.sanity_checking and self.current_epoch % k == 0:
            self.log_gce()

    def on_fit_start(self) -> None:
        if self._init_state is None:
            self._init_state = {k: v.detach().clone() for k, v in self.net.state_dict().items()}

    def _score(self, bench, embed) -> dict:
        from .evaluate import score, summarise

        return summarise(score(bench, embed, version=self.hparams.metric_version, unsup_kmax=self.hparams.unsup_kmax,
                               window=self.hparams.energy_window))

    def _baselines(self, bench) -> dict[str, dict]:
        """GCE scores of the representations the trained encoder is read against, on the same benchmark rows: the
        same encoder before training (its architecture's prior) and the element-pair distance histogram (a fixed 3-D
        representation with no learning). Scored once per run: neither changes during training."""
        if self._baseline_scores is None:
            from copy import deepcopy

            from .representations import DistanceHistogram

            out = {"distance_histogram": self._score(bench, DistanceHistogram().embed)}
            if self._init_state is not None:
                untrained = deepcopy(self.net)
                untrained.load_state_dict(self._init_state)
                trained, self.net = self.net, untrained
                try:
                    out["untrained"] = self._score(bench, self.embed)
                finally:
                    self.net = trained
            self._baseline_scores = out
        return self._baseline_scores

    def headline(self) -> Headline:
        key = "gce/geometry_A1_spearman"
        return Headline(metric=key, higher_is_better=True, method=f"{self.hparams.encoder}, trained",
                        baselines={"same encoder untrained": f"{key}/untrained",
                                   "distance histogram (no learning)": f"{key}/distance_histogram"},
                        claim="a 3-D representation is geometry-sensitive within a molecule (Spearman of embedding "
                              "distance vs RMSD > 0), and whether training adds to it is the benchmark's question",
                        extra=tuple(f"gce/{m}{who}" for m in ("chirality_ES_AUC", "energy_spearman")
                                    for who in ("", "/untrained", "/distance_histogram")) + ("val/mae_ev",))

    HEADLINE_METRICS = (("geometry", "A1_spearman"), ("chirality", "ES_AUC"), ("energy", "spearman"))

    def log_gce(self) -> None:
        """Score the current embedding on the DataModule's 3DCS benchmark and log the headline metrics, with the
        baselines' values of the three headline metrics as `gce/<axis>_<metric>/<baseline>`."""
        bench = getattr(getattr(self.trainer, "datamodule", None), "benchmark", None)
        if bench is None:
            return
        res = self._score(bench, self.embed)
        for axis, metric in (("geometry", "A1_spearman"), ("geometry", "G_cka_rbf"), ("geometry", "torsion_sp"),
                             ("chirality", "ES_AUC"), ("enantiomers", "ES_AUC"), ("energy", "spearman"),
                             ("energy", "ROC_AUC")):
            if metric not in res.get(axis, {}):  # a partial benchmark (e.g. only chirality/) has fewer axes
                continue
            mean = res[axis][metric][0]
            if np.isfinite(mean):
                self.log(f"gce/{axis}_{metric}", float(mean))
        for who, scores in self._baselines(bench).items():
            for axis, metric in self.HEADLINE_METRICS:
                mean = scores.get(axis, {}).get(metric, (float("nan"),))[0]
                if np.isfinite(mean):
                    self.log(f"gce/{axis}_{metric}/{who}", float(mean))
        if self.hparams.plot and bench.rotation:
            from .plots import torsion_figure

            g = bench.rotation[0]
            log_figure(self, "gce/torsion_scan", torsion_figure(g, {self.hparams.encoder: self.embed(g.mols)},
                                                                bench.reference(g)))

    def configure_optimizers(self):
        return self.optimizer(self.parameters())
