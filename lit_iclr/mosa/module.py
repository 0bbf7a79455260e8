"""The MoSA LightningModule: text -> 3-D structure -> projected structure maps -> video, and its baselines.

One code path, four switches: `structure` (3d: MoSA; 2d: skeleton-first; none: direct text-to-video), `control` (hadc or
plain `concat`), `lambda_track` (0: without the dense-tracking loss) and `lambda_contact` (0: without the contact loss).
Both stages train together: the structure transformer on the captions' motions, the video DiT on the ground-truth
structure (teacher forcing, as a pose-conditioned video model is trained); sampling chains them. On motion data without
videos (HumanML3D alone, `video_stage: false`, linked from the data) only the structure stage is built and trained,
and validation / test report its losses and the foot penetration and skating of sampled structures.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable

from lit_iclr.core import BaseModule, ConfigError
from lit_iclr.core.figures import log_figure
from lit_iclr.core.global_batch import rank_rows, step_rng
from lit_iclr.core.summary import Headline
from lit_iclr.core.threads import CpuThreads

from .maps import NUM_LIMB_GROUPS, control_maps, project
from .metrics import evaluate_videos, foot_penetration, foot_skating, joint_jerk, load_or_fit_evaluators
from .model import StructureTransformer, VideoDiT
from .objectives import bone_loss, contact_loss, euler_sample, interpolate, tracking_loss, x0_from_velocity, x0_velocity

# KID of the benchmark's 3-seed table (seeds/mosa.md, "Default task"): 256 prompts per seed, separately trained stages
# (raw KID; the card prints it x 1e3). The CLI trains both stages jointly on fewer evaluation clips: a rough reference.


class MoSA(BaseModule):
    def __init__(
        self,
        vocab_size: int = 128,
        num_frames: int = 8,
        image_size: int = 32,
        structure: Literal["3d", "2d", "none"] = "3d",
        control: Literal["hadc", "concat"] = "hadc",
        dim: int = 64,
        depth: int = 3,
        heads: int = 4,
        patch: int = 8,
        structure_dim: int = 64,
        structure_layers: int = 2,
        spread_steps: int = 2,
        region_dilate: int = 1,
        lambda_track: float = 0.5,
        lambda_contact: float = 1.0,
        lambda_bone: float = 1.0,
        video_steps: int = 10,
        structure_steps: int = 10,
        log_videos: int = 4,
        eval_videos: int = 64,
        evaluator_epochs: int = 15,
        video_stage: bool = True,
        num_threads: int | None = None,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=1e-3),
    ):
        """
        Args:
            vocab_size: Word ids of the captions (linked from the data).
            num_frames: Frames per clip (linked from the data).
            image_size: Frame size in pixels (linked from the data).
            structure: `3d` (MoSA), `2d` (2-D-skeleton-first baseline) or `none` (direct text-to-video baseline).
            control: How structure maps enter the video DiT: `hadc` (Human-Aware Dynamic Control) or `concat`.
            dim: Video DiT width.
            depth: Video DiT blocks.
            heads: Attention heads.
            patch: Video patch size in pixels.
            structure_dim: Structure transformer width.
            structure_layers: Structure transformer layers.
            spread_steps: HADC depthwise-convolution steps spreading skeleton features over the human region.
            region_dilate: HADC human-region dilation in patches.
            lambda_track: Weight of the dense-tracking loss on the predicted clean video (0 disables it).
            lambda_contact: Weight of the contact loss on the predicted 3-D structure (0 disables it).
            lambda_bone: Weight of the bone-length loss on the predicted 3-D structure.
            video_steps: Euler steps when sampling videos.
            structure_steps: Euler steps when sampling structures.
            log_videos: Validation prompts sampled and logged (figure + mp4) each validation (0: none).
            eval_videos: Evaluation clips sampled each validation / test for the video metrics (KID of the action
                classifier's features, joint jerk, warp error, text agreement), beside the real clips' own values and
                the same video network rendering the clips' true structure (0: none). Prompts and real references are
                two disjoint halves of these clips, so the real-vs-real KID is the floor.
            evaluator_epochs: Epochs of the evaluators (action classifier, pose regressor) fit once on the real
                training clips and stored next to the data (`<data_dir>/<data folder>-evaluators-e<epochs>.pt`).
            video_stage: Build and train the video DiT (linked from the data: false for motion without videos, where
                only the 3-D structure stage trains).
            num_threads: torch intra-op threads while fitting, validating or testing (`torch.set_num_threads`, set in
                `setup`, restored in `teardown`): at the CPU default's sizes (width 64, 16 tokens per frame) every
                product is small, and on a shared 2-core CPU a second thread mostly spins (a training step cost ~14x
                the CPU time with 2 threads than with 1 at load ~7, seeds/mosa.md). null: leave torch's setting.
            optimizer: Optimizer factory.
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        if structure == "none" and control != "hadc":
            raise ConfigError("model.control is only used with a structure; keep control: hadc with structure: none")
        if not video_stage and structure != "3d":
            raise ConfigError(f"motion data without videos trains the 3-D structure stage only; model.structure is "
                              f"{structure!r}: set model.init_args.structure: 3d, or give the data a videos/ folder")
        if image_size % patch:
            raise ConfigError(f"model.patch {patch} must divide image_size {image_size}")
        self._threads = CpuThreads(num_threads)  # core/threads.py: checked here, set in setup, restored in teardown
        self.optimizer = optimizer
        self.structure = structure
        self.channels = NUM_LIMB_GROUPS + (1 if structure == "3d" else 0)
        self.structure_net = None
        if structure != "none":
            self.structure_net = StructureTransformer(vocab_size, num_frames, coords=3 if structure == "3d" else 2,
                                                      dim=structure_dim, layers=structure_layers, heads=heads)
        self.video_net = None
        if video_stage:
            self.video_net = VideoDiT(vocab_size, num_frames, image_size, control if structure != "none" else "none",
                                      self.channels, dim, depth, heads, patch, spread_steps, region_dilate)

    def setup(self, stage: str) -> None:
        self._threads.enter(self)

    def teardown(self, stage: str) -> None:
        self._threads.exit()

    # ----- structure <-> maps
    def structure_target(self, batch: dict) -> torch.Tensor:
        if self.structure == "3d":
            return batch["joints3d"]
        return batch["keypoints2d"] / self.hparams.image_size * 2 - 1  # 2-D skeleton in [-1, 1] image coordinates

    def maps(self, structure: torch.Tensor, batch: dict) -> torch.Tensor:
        """Per-frame control maps of a structure: the 3-D one projected with the clip's camera (limbs + depth)."""
        if self.structure == "3d":
            uv, z = project(structure, batch["K"], batch["extrinsics"])
            return control_maps(uv, self.hparams.image_size, z)
        return control_maps((structure + 1) / 2 * self.hparams.image_size, self.hparams.image_size)

    # ----- losses
    def draw(self, draw, shape) -> torch.Tensor:
        """`draw(shape)`; in training drawn for the global batch and this rank's rows kept (`core.global_batch`), so
        under DDP the ranks' t and noise together are one process's. Evaluation runs whole on every rank with the
        global batch (`HumanMotionVideo`'s evaluation loaders), so there it draws as one process does."""
        return rank_rows(draw, shape) if self.training else draw(shape)

    def structure_loss(self, batch: dict) -> dict[str, torch.Tensor]:
        x0 = self.structure_target(batch)
        t = self.draw(lambda s: torch.rand(s, device=x0.device), (len(x0),))
        noise = self.draw(lambda s: torch.randn(s, device=x0.device), x0.shape)
        x0_hat = self.structure_net(interpolate(x0, noise, t), t, batch["text_ids"], batch["text_mask"])
        out = {"struct_mse": F.mse_loss(x0_hat, x0)}
        if self.structure == "3d":
            out["bone"] = bone_loss(x0_hat, x0)
            out["contact"] = contact_loss(x0_hat, batch["contacts"], sync=self.training)
        return out

    def video_loss(self, batch: dict, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        x0 = batch["video"]
        t = self.draw(lambda s: torch.rand(s, device=x0.device, generator=generator), (len(x0),))
        noise = self.draw(lambda s: torch.randn(s, device=x0.device, generator=generator), x0.shape)
        x_t = interpolate(x0, noise, t)
        maps = None
        if self.structure != "none":  # ground-truth structure maps (precomputed by the data when present)
            maps = batch["maps"][:, :, : self.channels] if "maps" in batch else self.maps(self.structure_target(batch), batch)
        v = self.video_net(x_t, t, batch["text_ids"], batch["text_mask"], maps)
        out = {"fm": F.mse_loss(v, noise - x0)}
        if self.hparams.lambda_track > 0:
            out["track"] = tracking_loss(x0_from_velocity(x_t, v, t), batch["tracks"], batch["track_visible"],
                                         sync=self.training)
        return out

    def total(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        h = self.hparams
        w = {"fm": 1.0, "struct_mse": 1.0, "bone": h.lambda_bone, "contact": h.lambda_contact, "track": h.lambda_track}
        return sum(w[k] * v for k, v in parts.items())

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        with step_rng(self.global_step):  # t and noise: seeded by the step, the same on every rank (and on resume)
            parts = self.video_loss(batch) if self.video_net is not None else {}
            if self.structure_net is not None:
                parts |= self.structure_loss(batch)
        loss = self.total(parts)
        self.log_train({"train/loss": loss, **{f"train/{k}": v for k, v in parts.items()}}, prog_bar=["train/loss"])
        return loss

    # ----- sampling
    @torch.no_grad()
    def generate(self, batch: dict, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Sample videos for the batch's captions; structure methods first sample the structure (returned as `plan`) and
        condition on its maps, projected with the batch's cameras."""
        ids, mask = batch["text_ids"], batch["text_mask"]
        B, h = len(ids), self.hparams
        out: dict[str, torch.Tensor] = {}
        maps = None
        if self.structure_net is not None:
            net = self.structure_net
            plan = euler_sample(x0_velocity(lambda x, t: net(x, t, ids, mask)), (B, *net.shape), h.structure_steps,
                                generator, ids.device)
            out["plan"], maps = plan, self.maps(plan, batch)
            out["maps"] = maps
        video = euler_sample(lambda x, t: self.video_net(x, t, ids, mask, maps),
                             (B, h.num_frames, 3, h.image_size, h.image_size), h.video_steps, generator, ids.device)
        out["video"] = video.clamp(-1, 1)
        return out

    @torch.no_grad()
    def sample_structure(self, batch: dict, generator: torch.Generator | None = None) -> torch.Tensor:
        net, ids, mask = self.structure_net, batch["text_ids"], batch["text_mask"]
        return euler_sample(x0_velocity(lambda x, t: net(x, t, ids, mask)), (len(ids), *net.shape),
                            self.hparams.structure_steps, generator, ids.device)

    # ----- validation / test
    def evaluate(self, batch: dict, batch_idx: int, stage: str) -> None:
        n = len(batch["text_ids"])
        parts = {}
        if self.video_net is not None:
            g = torch.Generator(device=batch["video"].device).manual_seed(1000 + batch_idx)  # same noise every time
            parts = self.video_loss(batch, g)
        if self.structure_net is not None:
            with torch.random.fork_rng(devices=[]):  # the structure loss draws t and noise: same ones every validation
                torch.manual_seed(2000 + batch_idx)
                parts |= self.structure_loss(batch)
        self.log(f"{stage}/loss", self.total(parts), batch_size=n, prog_bar=stage == "val")
        for k, v in parts.items():
            self.log(f"{stage}/{k}", v, batch_size=n)
        if self.video_net is None:  # the structure stage alone: physical plausibility of sampled structures
            if batch_idx == 0 and not self.trainer.sanity_checking:
                plan = self.sample_structure(batch, torch.Generator(device=batch["text_ids"].device).manual_seed(0))
                self.log(f"{stage}/plan_penetration_cm", foot_penetration(plan), batch_size=n)
                self.log(f"{stage}/plan_skating_cm", foot_skating(plan), batch_size=n)
                self.log(f"{stage}/data_skating_cm", foot_skating(batch["joints3d"]), batch_size=n)
            return
        if stage == "val" and batch_idx == 0 and self.hparams.log_videos > 0 and not self.trainer.sanity_checking:
            k = min(self.hparams.log_videos, n)
            small = {key: v[:k] for key, v in batch.items()}
            out = self.generate(small, torch.Generator(device=batch["video"].device).manual_seed(0))
            if "plan" in out and self.structure == "3d":
                self.log("val/plan_penetration_cm", foot_penetration(out["plan"]), batch_size=k)
                self.log("val/plan_skating_cm", foot_skating(out["plan"]), batch_size=k)
            self.log_samples(out["video"], small["video"])
        if not self.trainer.sanity_checking:
            self.collect_eval_videos(batch, batch_idx)

    # ----- video metrics: samples of the evaluation clips' prompts against the real clips (and the real floor)
    def evaluators(self):
        """The action classifier and pose regressor, fit once on the real training clips and stored beside the data
        (held outside the module's state: they are part of the measurement, not of the model)."""
        if "_evaluators" not in self.__dict__:
            dm = self.trainer.datamodule
            if "train" not in dm.splits:
                dm.splits["train"] = dm.read_split("train")
            ds = dm.splits["train"]
            path = Path(dm.data_dir) / f"{dm.path.name}-evaluators-e{self.hparams.evaluator_epochs}.pt"
            # fit outside validation's inference mode; the training stream's random state is left as it was
            with torch.inference_mode(False), torch.enable_grad(), torch.random.fork_rng(devices=[]):
                items = [ds[i] for i in range(min(len(ds), 2000))]
                train = {k: torch.stack([it[k] for it in items]) for k in ("video", "action", "keypoints2d", "depth")}
                self.__dict__["_evaluators"] = load_or_fit_evaluators(train, path, self.hparams.evaluator_epochs)
        return self.__dict__["_evaluators"]

    def collect_eval_videos(self, batch: dict, batch_idx: int) -> None:
        """Sample this batch's prompts (up to `eval_videos` clips an epoch) with fixed noise, and the same video network
        on the clips' true structure maps; keep what the epoch-end metrics need."""
        buf = self.__dict__.setdefault("_eval_buf", [])
        room = self.hparams.eval_videos - sum(len(b["real"]) for b in buf)
        if room <= 0 or self.video_net is None or self.trainer.datamodule is None:
            return
        part = {k: v[:room] for k, v in batch.items()}
        g = torch.Generator(device=part["video"].device).manual_seed(3000 + batch_idx)
        ids, mask = part["text_ids"], part["text_mask"]
        rec = {"real": part["video"].cpu(), "gen": self.generate(part, g)["video"].cpu(),
               "batch": {k: part[k].cpu() for k in ("K", "extrinsics", "action", "keypoints2d")}}
        if self.structure != "none":
            maps = part["maps"][:, :, : self.channels]
            g = torch.Generator(device=part["video"].device).manual_seed(3000 + batch_idx)
            rec["true_structure"] = euler_sample(lambda x, t: self.video_net(x, t, ids, mask, maps),
                                                 tuple(part["video"].shape), self.hparams.video_steps, g,
                                                 ids.device).clamp(-1, 1).cpu()
        buf.append(rec)

    def log_eval_videos(self, stage: str) -> None:
        """KID (and the other video metrics) of the samples of half A's prompts against the real clips of half B, the
        real-vs-real floor (half A's real clips against half B's), and the same for the true-structure renders."""
        buf = self.__dict__.pop("_eval_buf", [])
        if not buf:
            return
        real = torch.cat([b["real"] for b in buf])
        batch = {k: torch.cat([b["batch"][k] for b in buf]) for k in buf[0]["batch"]}
        if len(real) < 4:
            return  # too few clips for two halves of two
        clf, reg = self.evaluators()
        a, b = torch.arange(0, len(real), 2), torch.arange(1, len(real), 2)
        with torch.no_grad():
            ref = clf.features(real[b]).numpy()
        sets = {"": torch.cat([r["gen"] for r in buf]), "_real": real}
        if "true_structure" in buf[0]:
            sets["_true_structure"] = torch.cat([r["true_structure"] for r in buf])
        n = len(a)
        for tag, video in sets.items():
            res = evaluate_videos(video[a], {k: v[a] for k, v in batch.items()}, clf, reg, ref)
            for key in ("kid", "jerk_px", "warp_err", "flicker", "text_acc"):
                self.log(f"{stage}/{key}{tag}", res[key], batch_size=n)
        self.log(f"{stage}/jerk_px_true_motion", joint_jerk(batch["keypoints2d"][a]), batch_size=n)

    def on_train_epoch_start(self) -> None:
        """The run always ends with a validation (the headline's KID): a last epoch that `check_val_every_n_epoch`
        would skip (e.g. max_epochs 1 under the default 5, as the fast overlay runs) validates anyway."""
        t = self.trainer
        steps_left = t.max_steps - t.global_step if t.max_steps and t.max_steps > 0 else None
        last = (t.max_epochs is not None and t.current_epoch == t.max_epochs - 1) or (
            steps_left is not None and steps_left <= t.num_training_batches)
        if last and t.check_val_every_n_epoch is not None:
            t.check_val_every_n_epoch = 1
        ds = getattr(t.train_dataloader, "dataset", None)
        if hasattr(ds, "epoch"):
            ds.epoch = t.current_epoch  # the items' random windows and paraphrases of this epoch (`data.item_rng`)

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.log_eval_videos("val")

    def on_test_epoch_end(self) -> None:
        self.log_eval_videos("test")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluate(batch, batch_idx, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluate(batch, batch_idx, "test")

    def log_samples(self, video: torch.Tensor, real: torch.Tensor) -> None:
        from .plots import frames_figure, write_video_grid

        log_figure(self, "val/samples", frames_figure({"generated": video, "data": real}))
        log_dir = self.trainer.log_dir if self.trainer.loggers else None
        if log_dir is not None and self.trainer.is_global_zero:
            write_video_grid(Path(log_dir) / "videos" / f"val_step{self.global_step}.mp4", video)

    def summary_metrics(self):
        return ("{stage}/loss", "{stage}/fm", "{stage}/track", "{stage}/struct_mse", "{stage}/plan_*", "{stage}/kid*",
                "{stage}/jerk_px*", "{stage}/warp_err*")

    def headline(self) -> Headline:
        if self.video_net is None:  # HumanML3D alone: the structure stage's foot skating against the data's own
            return Headline(metric="{stage}/plan_skating_cm", higher_is_better=False,
                            baselines={"motion data": "{stage}/data_skating_cm"}, method="MoSA 3-D structure",
                            claim="the contact constraint keeps sampled feet from sliding",
                            extra=("{stage}/plan_penetration_cm", "{stage}/struct_mse"))
        names = {"3d": "MoSA", "2d": "2-D skeleton first", "none": "direct text-to-video"}
        method = names[self.structure] + (" (concat)" if self.structure != "none" and self.hparams.control == "concat"
                                          else "") + (" w/o tracking loss" if self.hparams.lambda_track == 0 else "")
        # No card rows: the card's KID (1e4 scale) came from evaluators fit for 15 epochs on another setting, so it is
        # on another scale than this run's; the floor and the true-structure render are measured here, on the same set.
        baselines = {"real clips (floor)": "{stage}/kid_real"}
        if self.structure != "none":
            baselines["same video net on true structure"] = "{stage}/kid_true_structure"
        return Headline(
            metric="{stage}/kid", higher_is_better=False, baselines=baselines, method=method,
            claim="structure-first generation is closer to real videos than direct text-to-video",
            extra=("{stage}/jerk_px", "{stage}/jerk_px_real", "{stage}/warp_err", "{stage}/warp_err_real",
                   "{stage}/text_acc", "{stage}/text_acc_real"))

    def configure_optimizers(self):
        return self.optimizer(self.parameters())

