"""LightningModule: trains the compact VLM on evidence VQA (fit), then runs the paper's analysis and VEA (test).

fit:  cross-entropy of the answer read at the last (ANSWER) position; val/acc. Every validation also runs VEA on the
      val split itself, split in two: the layers are profiled on its even-indexed questions and the plain answer, VEA
      and its controls are scored on its odd-indexed ones (val/acc/<variant>), so `fit` ends with VEA against plain
      decoding. Under DDP every number counts each question of the split once (`gather.py`).
test: layer profiling on the calibration split (the DataModule's val loader, once, stored in the `layer_auroc` buffer so
      the checkpoint carries it), then on the test split: per-layer RAPT image share, evidence AUROC/NDCG, the
      seeing-but-not-believing rate, and the accuracy of the plain answer, VEA and its controls (random layers, shallow
      layers, random mask) and baselines (attention-guided crop, AGLA-style assembly, the annotated-evidence mask).
      A figure of the per-layer curves is logged; `self.test_results` holds the numbers for benchmarks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info

from lit_iclr.core import BaseModule
from lit_iclr.core.summary import Headline

from . import analysis, gather, pretrain
from .model import CompactVLM


class VEAModule(BaseModule):
    def __init__(self, num_answers: int = 10, vocab_size: int = 512, image_size: int = 32, patch_size: int = 8,
                 vision_dim: int = 48, vision_depth: int = 1, dim: int = 64, depth: int = 4, heads: int = 4,
                 max_question_len: int = 8, num_layers: int = 2, top_frac: float = 0.25, smooth_sigma: float = 0.5,
                 edge_sigma: float = 1.5, gamma: float = 0.3, context: str = "blur", context_sigma: float = 2.0,
                 min_overlap: float = 0.5, variants: list[str] = analysis.VARIANTS, control_seed: int = 0,
                 one_cycle: bool = True, vision_pretrain_steps: int = 0, vision_pretrain_seed: int = 0,
                 freeze_vision: bool = False, vision_cache: str | None = "data/vea_vision", question_first: bool = False,
                 optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=2e-3, weight_decay=0.05),
                 hf_model: str | None = None):
        """
        Args:
            num_answers: Answer classes (linked from the data).
            vocab_size: Hashed question vocabulary (linked from the data).
            image_size: Image side in pixels (linked from the data).
            patch_size: ViT patch side (image tokens = (image_size / patch_size)^2).
            vision_dim: timm ViT width.
            vision_depth: timm ViT blocks.
            dim: Decoder width.
            depth: Decoder layers (the layers the analysis profiles).
            heads: Decoder attention heads (averaged in the analysis).
            max_question_len: Question tokens (linked from the data).
            num_layers: m, the number of profiled layers whose attention VEA aggregates.
            top_frac: rho, the fraction of patches the mask keeps.
            smooth_sigma: Gaussian smoothing of the aggregated attention on the patch grid (patches).
            edge_sigma: Soft edge of the pixel mask (pixels).
            gamma: Retention of the context outside the mask (1: no change, 0: context fully replaced).
            context: What the attenuated region fades to: blur | mean | zero.
            context_sigma: Blur of the context (pixels).
            min_overlap: A patch is evidence when at least this fraction of it lies in an evidence box.
            variants: Answers computed at test (plain, vea, controls and baselines).
            control_seed: Seed of the random-layer and random-mask controls.
            one_cycle: One-cycle learning-rate schedule over the whole run (warm-up to the optimizer's lr, then anneal),
                stepped per batch; false: the optimizer's constant lr.
            vision_pretrain_steps: Steps of patch-level item-classification pretraining of the vision tower before fit
                (`pretrain.py`; 0: the tower trains from scratch with the rest).
            vision_pretrain_seed: Seed of that pretraining (its scenes, initialisation and batches).
            freeze_vision: Keep the (pretrained) vision tower fixed while the projector and decoder learn the VQA task.
            vision_cache: Folder of cached pretrained towers (keyed by architecture, settings and seed); null: no cache.
            question_first: Sequence [question; image; ANSWER] instead of [image; question; ANSWER] (image tokens see the
                question, question tokens cannot see the image: the lookup happens at the ANSWER position).
            optimizer: Optimizer of the compact VLM.
            hf_model: A Hugging Face VLM folder (the paper's LLaVA-1.5-7B: configs/paper/hf/llava-1.5-7b-hf), built in
                `configure_model` as `hf_vlm` for `hf.py`'s `image_attention` / `vea_answer` (training-free); a folder
                with only config.json builds the architecture on the meta device (`cli.py plan`). null: none.
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        self.image_size = image_size
        self.vlm = CompactVLM(num_answers, vocab_size, image_size, patch_size, 3, vision_dim, vision_depth, 2, dim, depth,
                              heads, 2, max_question_len, question_first)
        self.cfg = analysis.VEAConfig(num_layers, top_frac, smooth_sigma, edge_sigma, gamma, context, context_sigma,
                                      min_overlap, tuple(variants))
        self.register_buffer("layer_auroc", torch.full((depth,), float("nan")))
        if freeze_vision:
            self.vlm.vision.requires_grad_(False)
        self.test_results: dict = {}
        self.vision_item_acc = float("nan")  # held-out item accuracy of the pretrained tower (fit only)

    def configure_model(self) -> None:
        if self.hparams.hf_model is not None and getattr(self, "hf_vlm", None) is None:
            from lit_iclr.core.hf_arch import build

            self.hf_vlm = build(self.hparams.hf_model, "AutoModelForImageTextToText").requires_grad_(False)

    def setup(self, stage: str) -> None:
        # before Lightning restores a checkpoint (which then overwrites these weights on resume)
        if stage == "fit" and self.hparams.vision_pretrain_steps > 0:
            res = pretrain.pretrained_vision(self.vlm.vision, self.hparams.vision_cache, self.image_size, self.vlm.grid,
                                             self.hparams.vision_pretrain_steps, self.hparams.vision_pretrain_seed)
            self.vision_item_acc = res["item_acc"]
            rank_zero_info(f"vision tower pretrained: held-out item accuracy {self.vision_item_acc:.3f}")

    def training_step(self, batch, batch_idx):
        out = self.vlm(batch["x"], batch["q"])
        loss = F.cross_entropy(out.logits, batch["y"], ignore_index=-1)
        acc = analysis.correct(out.logits.detach(), batch["gold"]).float().mean()
        self.log_train({"train/loss": loss.detach(), "train/acc": acc}, prog_bar=["train/loss"])
        return loss

    # ---- validation: plain accuracy on the whole split, VEA on its odd questions with layers profiled on its even ones ----
    def on_validation_epoch_start(self):
        self._val_calib, self._val_eval = [], []

    def validation_step(self, batch, batch_idx):
        first = analysis.attention_batch(self.vlm, batch, self.image_size, self.cfg.min_overlap)
        # sync_dist with batch_size: the ranks' sums and counts are reduced, so each question counts once under DDP
        self.log("val/acc", first["correct"].float().mean(), prog_bar=True, batch_size=len(batch["x"]), sync_dist=True)
        if self.trainer.sanity_checking:
            return
        # the halves are by the question's index in the split, not by batch: the same questions on any number of ranks
        calib = batch["index"] % 2 == 0
        self._val_calib.append(first["auroc"][calib].cpu())  # calibration half: per-question layer AUROCs
        if (~calib).any():  # evaluation half: re-answered at epoch end, once the layers are profiled
            self._val_eval.append(({k: v[~calib] for k, v in batch.items()}, {k: v[~calib] for k, v in first.items()}))

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        # every rank profiles on the calibration questions of all ranks (the same layers), re-answers its own evaluation
        # questions, and summarises the evaluation rows of all ranks
        calib = gather.gather_lists(self._val_calib)
        n_calib = sum(len(a) for a in calib)
        layer_auroc = torch.cat(calib).nanmean(0) if n_calib else None
        gen = torch.Generator().manual_seed(self.hparams.control_seed)
        firsts, variants = [], []
        for batch, first in self._val_eval if layer_auroc is not None else ():
            variants.append({k: v.cpu() for k, v in
                             analysis.intervene(self.vlm, batch, first, layer_auroc, self.cfg, self.image_size, gen).items()})
            firsts.append({k: v.cpu() for k, v in first.items() if k != "logits"})
        firsts, variants = gather.gather_lists(firsts), gather.gather_lists(variants)
        self._val_calib, self._val_eval = [], []
        if not firsts:
            return  # VEA needs both halves (a single validation question has no evaluation half)
        res = analysis.summarize(firsts, variants, {"auroc": layer_auroc})
        # the same value on every rank (summarised over all of them); sync_dist only averages equal numbers
        for k in ("sbnb_rate", "hit_rate_correct", *(f"acc/{v}" for v in self.cfg.variants)):
            self.log(f"val/{k}", res[k], sync_dist=True)
        self.log("val/vea_questions", float(sum(len(f["correct"]) for f in firsts)), sync_dist=True)

    def configure_optimizers(self):
        opt = self.optimizer([p for p in self.parameters() if p.requires_grad])
        if not self.hparams.one_cycle:
            return opt
        # short CPU runs learn the binding of question and cell much sooner with warm-up + annealing than at a constant lr
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[g["lr"] for g in opt.param_groups],
                                                    total_steps=int(self.trainer.estimated_stepping_batches), pct_start=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- test: the analysis and VEA ----
    def on_test_epoch_start(self):
        dm = self.trainer.datamodule
        moved = ({k: v.to(self.device) for k, v in b.items()} for b in dm.val_dataloader())
        profile = analysis.profile_layers(moved, self.vlm, self.image_size, self.cfg.min_overlap)
        self.layer_auroc.copy_(profile["auroc"])
        self._calib = profile
        self._firsts, self._variants = [], []
        self._gen = torch.Generator().manual_seed(self.hparams.control_seed)

    def test_step(self, batch, batch_idx):
        first = analysis.attention_batch(self.vlm, batch, self.image_size, self.cfg.min_overlap)
        var = analysis.intervene(self.vlm, batch, first, self.layer_auroc.cpu(), self.cfg, self.image_size, self._gen)
        self._firsts.append({k: v.cpu() for k, v in first.items() if k != "logits"})
        self._variants.append({k: v.cpu() for k, v in var.items()})

    def on_test_epoch_end(self):
        # every rank tested its share of the questions: the summary is over the rows of all ranks (each question once)
        firsts, variants = gather.gather_lists(self._firsts), gather.gather_lists(self._variants)
        res = analysis.summarize(firsts, variants, self._calib)
        res["layers"] = analysis.vea.choose_layers(self.layer_auroc.cpu(), self.cfg.num_layers, "profiled")
        res["vea_questions"] = float(sum(len(f["correct"]) for f in firsts))
        self.test_results = res
        for k, v in res.items():  # equal on every rank; sync_dist only averages equal numbers
            if isinstance(v, float):
                self.log(f"test/{k}", v, sync_dist=True)
            elif k.startswith("layer/"):
                for i, x in enumerate(v):
                    self.log(f"test/{k}_{i}", float(x), sync_dist=True)
        from lit_iclr.core.figures import log_figure

        from .plots import layer_figure

        log_figure(self, "test/layers", layer_figure(res))
        self._firsts, self._variants = [], []

    def headline(self) -> Headline:
        names = {"vea_random_layers": "VEA, random layers", "vea_shallow_layers": "VEA, shallow layers",
                 "vea_random_mask": "random mask", "crop": "attention crop-and-zoom", "assembly": "AGLA-style assembly",
                 "oracle_mask": "annotated-evidence mask (upper bound)"}
        baselines = {"plain decoding": "{stage}/acc/plain"}
        baselines.update({names[v]: f"{{stage}}/acc/{v}" for v in self.cfg.variants if v in names})
        return Headline(
            metric="{stage}/acc/vea", higher_is_better=True, method="VEA", baselines=baselines,
            claim="masking the image to the profiled layers' evidence raises accuracy over plain decoding (val: layers "
                  "profiled on the even-indexed val questions, scored on the odd ones; test: profiled on val, scored "
                  "on test)",
            extra=("{stage}/sbnb_rate", "{stage}/hit_rate_correct", "{stage}/vea_questions"))

    def summary_metrics(self):
        return ["{stage}/acc", "{stage}/acc/*", "{stage}/sbnb_rate", "{stage}/hit_rate_correct"]
