"""LightningModule: the BEV fusion detector trained with (or without) AsyncBEV, evaluated by nuscenes-devkit."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.cli import OptimizerCallable

from lit_iclr.core import BaseModule
from lit_iclr.core.errors import CheckpointError, ConfigError
from lit_iclr.core.summary import Headline
from lit_iclr.core.sync_batchnorm import convert_sync_batchnorm
from lit_iclr.core.threads import CpuThreads

from .evaluate import box_record, nuscenes_metrics, write_results
from .model import BEVFusionDetector
from .targets import build_targets, decode, flow_loss, focal_loss, gt_velocity_field, regression_loss

COMPENSATIONS = ("none", "emc", "asyncbev", "oracle")
LABELS = {"none": "no compensation", "emc": "EMC", "asyncbev": "AsyncBEV", "oracle": "oracle warp (EMC + GT flow)"}
LOGGED = ("NDS", "mAP", "mAVE", "mATE")  # devkit metrics logged per subset (all, dynamic, static)
WORLD_CLASSES = ("car", "truck", "pedestrian", "bicycle")  # the generated world's detection classes


class AsyncBEV(BaseModule):
    """Grid-based LiDAR-camera BEV detector with the AsyncBEV flow module (or a baseline compensation)."""

    def __init__(self, num_classes: int = 4, detection_classes: list[str] | None = None,
                 image_size: tuple[int, int] = (40, 64), half_range: float = 25.6,
                 grid_size: int = 64, channels: int = 32, image_backbone: str = "test_resnet", flow_base: int = 16,
                 flow_depth: int = 1, use_time_code: bool = True, use_position_code: bool = True,
                 compensation: str = "asyncbev", flow_loss_weight: float = 0.2, reg_loss_weight: float = 0.25,
                 detector_checkpoint: str | None = None, freeze_detector: bool = False, top_k: int = 100,
                 val_baselines: list[str] | None = None, num_threads: int | None = None, sync_batchnorm: bool = True,
                 optimizer: OptimizerCallable = torch.optim.AdamW):
        """
        Args:
            num_classes: Detection classes (from the data).
            detection_classes: Their nuScenes names, in label order (from the data; null: the generated world's four).
            image_size: Camera image height, width (from the data).
            half_range: BEV grid covers [-half_range, half_range] m in x and y around the LiDAR.
            grid_size: BEV cells per side.
            channels: BEV feature channels of both branches.
            image_backbone: timm architecture of the camera branch (stride-8 stage used).
            flow_base: Channels of the first FlowUNet level (then x2, x4, x8).
            flow_depth: Conv blocks per FlowUNet encoder level.
            use_time_code: Condition the flow on dt (ablation: false).
            use_position_code: Condition the flow on the EMC-transformed cell positions (ablation: false).
            compensation: How the delayed modality is aligned in training and validation: none | emc | asyncbev | oracle.
            flow_loss_weight: Weight of the speed-bucketed flow loss (paper: 0.2); 0 trains AsyncBEV without it.
            reg_loss_weight: Weight of the box regression L1 (CenterPoint: 0.25).
            detector_checkpoint: Weights of a trained detector (a Lightning checkpoint, read with weights_only=True).
            freeze_detector: Train only the AsyncBEV module (the paper starts from the synchronous detector, frozen).
            top_k: Boxes kept per sample when decoding.
            val_baselines: Compensations also scored in validation and test on the same weights and batches (e.g.
                [none, emc]): logged as val/<split>_<metric>/<compensation> next to the model's own
                (val/<split>_<metric> and val/<split>_<metric>/<its compensation>). A validation limited to a few
                batches (limit_val_batches) is scored on the samples it ran (val/eval_samples says how many).
            num_threads: torch intra-op threads while fitting, validating or testing (`torch.set_num_threads`, set in
                `setup`): at the default sizes every convolution is small, and on a shared 2-core CPU a second thread
                mostly spins (a training step cost 5.6 s CPU with 2 threads against 0.6 s with 1 at load ~7,
                seeds/asyncbev.md). null: leave torch's setting.
            sync_batchnorm: Under DDP, BatchNorm in training normalises with the global batch's statistics
                (`core.sync_batchnorm`, any device), so the step is one process's on the global batch; with the
                default 1-2 samples per device a device's own statistics are mostly noise. false: each device's own.
            optimizer: Optimizer factory.
        """
        super().__init__()
        for c in [compensation, *(val_baselines or [])]:
            if c not in COMPENSATIONS:
                raise ConfigError(f"compensation and val_baselines must be among {COMPENSATIONS}, got {c!r}")
        names = list(detection_classes) if detection_classes is not None else list(WORLD_CLASSES)
        if len(names) != num_classes:
            raise ConfigError(f"detection_classes names {len(names)} classes ({names}) but num_classes is {num_classes}")
        self.save_hyperparameters(ignore=["optimizer"])
        self._threads = CpuThreads(num_threads)  # core/threads.py: checked here, set in setup, restored in teardown
        self.class_names = names
        self.optimizer = optimizer
        self.compensation, self.flow_loss_weight, self.reg_loss_weight = compensation, flow_loss_weight, reg_loss_weight
        self.top_k, self.freeze_detector, self.val_baselines = top_k, freeze_detector, list(val_baselines or [])
        self.net = BEVFusionDetector(num_classes, half_range, grid_size, channels, image_backbone, tuple(image_size),
                                     flow_base, flow_depth, use_time_code, use_position_code)
        if detector_checkpoint is not None:
            self.load_detector(detector_checkpoint)
        self._val_results: dict[str | None, dict[str, list[dict]]] = {}  # compensation (None: the model's) -> boxes

    def setup(self, stage: str) -> None:
        self._threads.enter(self)
        if self.hparams.sync_batchnorm and self.trainer.world_size > 1:  # before DDP wraps the model
            convert_sync_batchnorm(self.net)

    def teardown(self, stage: str) -> None:
        self._threads.exit()

    # ------------------------------------------------------------------ weights
    def load_detector(self, path: str) -> None:
        """Detector weights (everything except the flow module) from a checkpoint of this class."""
        p = Path(path)
        if not p.exists():
            raise CheckpointError(p, "detector checkpoint not found", "train the synchronous detector first or fix the path")
        state = torch.load(p, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state)
        det = {k[len("net."):]: v for k, v in state.items() if k.startswith("net.") and not k.startswith("net.flow.")}
        missing, _ = self.net.load_state_dict(det, strict=False)
        if [k for k in missing if not k.startswith("flow.")]:
            raise CheckpointError(p, f"does not hold this detector's weights (missing {missing[:3]})",
                                  "use a checkpoint written by AsyncBEV with the same sizes")

    def detector_parameters(self):
        return [p for n, p in self.net.named_parameters() if not n.startswith("flow.")]

    def configure_optimizers(self):
        if self.freeze_detector:
            for p in self.detector_parameters():
                p.requires_grad_(False)
        return self.optimizer([p for p in self.parameters() if p.requires_grad])

    def on_train_epoch_start(self) -> None:
        t = self.trainer
        steps_left = t.max_steps - t.global_step if t.max_steps and t.max_steps > 0 else None
        last = (t.max_epochs is not None and t.current_epoch == t.max_epochs - 1) or (
            steps_left is not None and steps_left <= t.num_training_batches)
        if last and t.check_val_every_n_epoch is not None:  # the run always ends with a validation (the headline);
            t.check_val_every_n_epoch = 1  # e.g. max_epochs 1 under a check_val_every_n_epoch of 4
        ds = getattr(self.trainer.train_dataloader, "dataset", None)
        if hasattr(ds, "epoch"):
            ds.epoch = self.current_epoch  # new random delays every epoch
        if self.freeze_detector:  # frozen BatchNorm statistics too
            for name, m in self.net.named_modules():
                if not name.startswith("flow") and isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.eval()

    # ------------------------------------------------------------------ losses
    def losses(self, batch: dict, compensation: str | None = None) -> dict[str, torch.Tensor]:
        comp = compensation or self.compensation
        grid = self.net.grid
        gt_v = gt_velocity_field(batch["boxes"], batch["boxes_mask"], batch["dt"], grid)
        gt_flow = gt_v * batch["dt"].view(-1, 1, 1, 1)
        out = self.net(batch, comp, gt_flow)
        heat_t, ind, reg_t, reg_m = build_targets(batch["boxes"], batch["boxes_mask"], grid, out["heatmap"].shape[1])
        # in training under DDP each normaliser (peaks, boxes, cells per speed bucket) is the global batch's, so the
        # averaged gradient is that of one process's loss on the global batch (`core.global_batch.rank_denominator`)
        sync = self.training
        loss_hm = focal_loss(out["heatmap"], heat_t, sync)
        loss_reg = regression_loss(out["reg"], ind, reg_t, reg_m, sync)
        logs = {"loss_heatmap": loss_hm, "loss_reg": loss_reg}
        loss = loss_hm + self.reg_loss_weight * loss_reg
        if "velocity" in out:
            pred_flow = out["velocity"] * batch["dt"].view(-1, 1, 1, 1)
            logs["loss_flow"] = flow_loss(pred_flow, gt_flow, gt_v, sync)
            loss = loss + self.flow_loss_weight * logs["loss_flow"]
        logs["loss"] = loss
        return logs

    def training_step(self, batch, batch_idx):
        logs = self.losses(batch)
        self.log_train({f"train/{k}": v for k, v in logs.items()}, prog_bar=["train/loss"])
        return logs["loss"]

    # ------------------------------------------------------------------ prediction and devkit evaluation
    @torch.no_grad()
    def predict_boxes(self, batch: dict, compensation: str | None = None) -> dict[str, list[dict]]:
        """nuScenes result boxes (global frame) per sample token."""
        comp = compensation or self.compensation
        gt_flow = None
        if comp == "oracle":
            gt_flow = gt_velocity_field(batch["boxes"], batch["boxes_mask"], batch["dt"], self.net.grid)
            gt_flow = gt_flow * batch["dt"].view(-1, 1, 1, 1)
        out = self.net(batch, comp, gt_flow)
        dets = decode(out["heatmap"], out["reg"], self.net.grid, self.top_k)
        results = {}
        for b, d in enumerate(dets):
            T = batch["lidar2global"][b].double().cpu().numpy()
            c = d["center"].double().cpu().numpy() @ T[:3, :3].T + T[:3, 3]
            v = d["velocity"].double().cpu().numpy() @ T[:2, :2].T
            yaw = d["yaw"].double().cpu().numpy() + np.arctan2(T[1, 0], T[0, 0])
            size = d["size"].cpu().numpy()
            results[batch["sample_token"][b]] = [
                box_record(batch["sample_token"][b], c[k], size[k], yaw[k], v[k], self.class_names[int(d["label"][k])],
                           float(d["score"][k]))
                for k in range(len(c))]
        return results

    def _score_step(self, stage: str, batch) -> None:
        logs = self.losses(batch)
        self.log_dict({f"{stage}/{k}": v for k, v in logs.items()}, batch_size=len(batch["dt"]))
        for comp in [None, *self.val_baselines]:
            self._val_results.setdefault(comp, {}).update(self.predict_boxes(batch, comp))

    def validation_step(self, batch, batch_idx):
        self._score_step("val", batch)

    def test_step(self, batch, batch_idx):
        self._score_step("test", batch)

    def _score_epoch(self, stage: str) -> None:
        """nuscenes-devkit metrics of the model and each baseline on the samples this pass ran (all of the split, or
        the batches limit_val_batches / limit_test_batches left)."""
        dm = getattr(self.trainer, "datamodule", None)
        all_results, self._val_results = self._val_results, {}
        if self.trainer.sanity_checking or dm is None or getattr(dm, "reader", None) is None or not all_results:
            return
        for comp, results in all_results.items():
            with tempfile.TemporaryDirectory() as tmp:
                path = write_results(Path(tmp) / "results_nusc.json", results)
                m = nuscenes_metrics(dm.reader.nusc, path, dm.val_split, tmp, class_range=self.net.grid.half_range,
                                     classes=self.class_names)
            for split, vals in m.items():
                vals = {f"{stage}/{split}_{k}": float(v) for k, v in vals.items() if k in LOGGED}
                # <stage>/<metric>/<compensation> puts the model and its baselines side by side in the run summary;
                # the model's own metrics are also logged without the suffix (what checkpoint monitors name)
                self.log_dict({f"{k}/{comp or self.compensation}": v for k, v in vals.items()})
                if comp is None:
                    self.log_dict(vals)
        self.log(f"{stage}/eval_samples", float(len(all_results[None])))

    def on_validation_epoch_end(self) -> None:
        self._score_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._score_epoch("test")

    def headline(self) -> Headline:
        base = [c for c in ("emc", "none") if c in self.val_baselines and c != self.compensation]
        return Headline(
            metric="{stage}/dynamic_NDS", higher_is_better=True,
            baselines={LABELS[c]: f"{{stage}}/dynamic_NDS/{c}" for c in base},
            claim="aligning the late LiDAR map with the predicted BEV flow raises NDS on moving objects over EMC "
                  "(paper: +16.6 NDS points at 0.5 s); the split is by the ground truth's speed, not the detector's",
            method=LABELS[self.compensation],
            extra=("{stage}/dynamic_NDS/oracle", "{stage}/all_NDS", "{stage}/all_NDS/emc", "{stage}/all_NDS/none",
                   "{stage}/dynamic_mAVE", "{stage}/eval_samples"))

    def summary_metrics(self):
        return ("{stage}/dynamic_NDS/*", "{stage}/dynamic_mAP/*", "{stage}/static_NDS/*", "{stage}/all_NDS/*",
                "{stage}/all_mAP/*", "{stage}/dynamic_mAVE/*", "{stage}/loss_flow")
