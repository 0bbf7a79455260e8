"""HEAPr as a LightningModule: train (or load) an MoE LM, then calibrate, prune atomic experts, evaluate and export.

`fit` trains the LM; when it ends (single process, `prune_ratio > 0`, `prune_at_fit_end`), the module evaluates the
dense model, calibrates on the DataModule's held-out `calib` split, prunes in place, evaluates again, and writes into
the run folder: `checkpoints/pruned.ckpt` (Lightning, restores the per-expert widths), `pruned_compact/` (safetensors
with each expert's own width) and `pruned_hf/` (standard transformers folder, experts zero-padded to one width),
`heapr_report.json`. `test` on a dense checkpoint prunes first (same settings); on a pruned checkpoint it evaluates it.
Under FSDP/DDP recovery fine-tuning (`pretrained:` a pruned folder, `prune_ratio: 0`) the HF model is built in
`configure_model()` so the strategy can shard it; large checkpoints are pruned by `python -m lit_iclr.heapr.streaming`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torchmetrics.aggregation import SumMetric

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.global_batch import rank_denominator
from lit_iclr.core.module import BaseModule
from lit_iclr.core.moe import check_moe, save_compact, save_hf, unfuse_experts
from lit_iclr.core.moe.balance_loss import load_balancing_loss
from lit_iclr.core.summary import Headline

from .calibrate import lm_loss_sum
from .evaluate import perplexity, topic_accuracy
from .model import build_moe_lm
from .prune import METHODS, PruneReport, drop_experts, prune_model
from .scores import AVERAGING, check_ratio

TOPIC_MIN_DOC_TOKENS = 8  # core.corpus.TopicChoiceDataset refuses fewer document tokens after the topic line


def check_topic_room(dm) -> None:
    """The zero-shot topic evaluation puts "Topic: <name>" before every document, in `seq_len` tokens: refuse at the
    start a `seq_len` that leaves no room for a document (it failed only after training, in `on_fit_end`)."""
    from lit_iclr.core.corpus import encode_batch, topic_line

    names = dm.topic_names
    lengths = [len(ids) for ids in encode_batch(dm.tokenizer, [topic_line(t) for t in names])]
    i = max(range(len(names)), key=lengths.__getitem__)
    need = 1 + lengths[i] + TOPIC_MIN_DOC_TOKENS  # EOS + the longest topic line + a document
    if dm.seq_len < need:
        raise ConfigError(f"data.init_args.seq_len={dm.seq_len} leaves no room for a document in the zero-shot topic "
                          f"evaluation: the longest topic line ({names[i]!r}, {lengths[i]} tokens) needs seq_len >= {need} "
                          f"(EOS + topic line + {TOPIC_MIN_DOC_TOKENS} document tokens); raise seq_len or set "
                          "model.init_args.topic_eval: false")


class HEAPrLM(BaseModule):
    def __init__(self, vocab_size: int = 2048, arch: str = "qwen2_moe", hidden_size: int = 128, num_layers: int = 4,
                 num_heads: int = 4, num_kv_heads: int = 2, num_experts: int = 8, top_k: int = 2,
                 expert_width: int = 64, shared_width: int = 128, max_positions: int = 512,
                 pretrained: str | None = None, hf_config: str | None = None, experts_implementation: str = "eager",
                 optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.01),
                 warmup_steps: int = 30,
                 aux_loss_coef: float = 0.01, prune_ratio: float = 0.25, prune_method: str = "heapr",
                 averaging: str = "per_token", fisher_state: str = "full", calib_sequences: int = 128,
                 prune_at_fit_end: bool = True, export: bool = True, topic_eval: bool = True, seed: int = 0,
                 cpu_threads: int | None = None):
        """
        Args:
            vocab_size: Vocabulary size (linked from the DataModule's tokenizer).
            arch: Hugging Face MoE architecture built from the sizes below: qwen2_moe (Qwen1.5-MoE: routed + gated
                shared expert), mixtral (routed only) or deepseek_v2 (routed + shared, first layer dense).
            hidden_size: Model width d.
            num_layers: Decoder layers.
            num_heads: Attention heads.
            num_kv_heads: Key/value heads (grouped-query attention).
            num_experts: Routed experts per MoE layer.
            top_k: Experts per token.
            expert_width: Intermediate width of each routed expert (its number of atomic experts).
            shared_width: Width of the shared expert (qwen2_moe) or of all shared experts together (deepseek_v2).
            max_positions: Longest sequence (rotary positions).
            pretrained: Local Hugging Face checkpoint folder (safetensors; a pruned compact folder works too) to load
                instead of building a random model; the sizes above are then ignored.
            hf_config: Folder holding a published model's config.json (e.g. configs/paper/hf/deepseek-moe-16b-base):
                that architecture at full size with random weights, no checkpoint (paper-scale configs, `cli.py
                plan`); the sizes above and vocab_size are then ignored. `pretrained` takes precedence.
            experts_implementation: transformers' kernel for the fused experts while training: eager (fastest on
                CPU), grouped_mm or batched_mm (GPU).
            optimizer: Optimizer factory.
            warmup_steps: Linear learning-rate warm-up steps, then cosine decay to 10 % over `trainer.max_steps`.
            aux_loss_coef: Weight of the router load-balancing loss during training.
            prune_ratio: Fraction of the routed experts' atoms removed, strictly between 0 and 1; 0 disables pruning.
            prune_method: heapr, or a baseline: wanda, magnitude, random (atomic), frequency, naee (whole experts).
            averaging: per_token (official code: mean over each expert's routed tokens) or frequency (weighted by
                routing frequency).
            fisher_state: full (the paper's d x d output-space Fisher per expert) or atom (per-atom sums of the
                squared gradient at h_k: identical scores, O(I) memory).
            calib_sequences: Calibration sequences taken from the DataModule's held-out `calib` split.
            prune_at_fit_end: Prune and evaluate right after `fit`.
            export: Write the pruned model as pruned_compact/ and pruned_hf/ folders in the run directory.
            topic_eval: Also report zero-shot topic accuracy (needs a DataModule with `topic_choice_dataloader`).
            seed: Seed of the random pruning baseline.
            cpu_threads: torch CPU threads (null: torch's default). One thread is fastest for small models on a
                shared or busy machine, where extra OpenMP threads mostly wait for each other.
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        self.model: torch.nn.Module | None = None
        self.report: PruneReport | None = None
        self.results: dict[str, Any] = {}
        self.val_nll, self.val_tokens = SumMetric(), SumMetric()
        self.test_nll, self.test_tokens = SumMetric(), SumMetric()

    # ------------------------------------------------------------------------------------------------ model
    def setup(self, stage: str) -> None:
        """Check the pruning settings before any work (errors reach the CLI as one line)."""
        h = self.hparams
        if h.cpu_threads:
            torch.set_num_threads(h.cpu_threads)
        if h.prune_ratio != 0:
            check_ratio(h.prune_ratio)
        if h.prune_method not in METHODS:
            raise ConfigError(f"unknown prune_method {h.prune_method!r}; choose from {', '.join(METHODS)}")
        if h.averaging not in AVERAGING:
            raise ConfigError(f"averaging must be one of {AVERAGING}, got {h.averaging!r}")
        dm = self._trainer.datamodule if self._trainer is not None else None
        topic_eval_runs = stage == "test" or (stage == "fit" and h.prune_at_fit_end and h.prune_ratio > 0)
        if h.topic_eval and topic_eval_runs and hasattr(dm, "topic_choice_dataloader"):
            check_topic_room(dm)


    def configure_model(self) -> None:
        """Build (or load) the Hugging Face model here, so FSDP can shard it as it is created."""
        if self.model is not None:
            return
        h = self.hparams
        self.model = build_moe_lm(h.pretrained, h.experts_implementation, h.get("hf_config"), arch=h.arch,
                                  vocab_size=h.vocab_size,
                                  hidden_size=h.hidden_size,
                                  num_layers=h.num_layers, num_heads=h.num_heads, num_kv_heads=h.num_kv_heads,
                                  num_experts=h.num_experts, top_k=h.top_k, expert_width=h.expert_width,
                                  shared_width=h.shared_width, max_positions=h.max_positions)
        if hasattr(self.model.config, "router_aux_loss_coef"):
            self.model.config.router_aux_loss_coef = h.aux_loss_coef
        from lit_iclr.core.moe.sharding import shard_model, strategy_mesh

        mesh = strategy_mesh(self)
        if mesh is not None:  # configs/trainer/fsdp.yaml: FSDP2 per decoder block (pruning at fit end: 1 process)
            shard_model(self.model, mesh)

    @property
    def pruned(self) -> bool:
        return self.report is not None or getattr(self, "_restored_pruned", False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def _loss(self, batch, router_logits: bool = False, sync: bool = False):
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                         output_router_logits=router_logits)
        nll, n = lm_loss_sum(out.logits, batch.get("labels", batch["input_ids"]), batch.get("attention_mask"))
        aux = getattr(out, "aux_loss", None) if router_logits else None
        if aux is not None and isinstance(getattr(out, "router_logits", None), tuple):
            # the same Switch balancing loss as Hugging Face's, but of the global batch under DDP (its f and P are
            # batch statistics: per rank they are the rank's half's, core/moe/balance_loss.py)
            aux = load_balancing_loss(out.router_logits, self.model.num_experts, self.model.num_experts_per_tok,
                                      batch.get("attention_mask"), sync)
        return nll, n, aux

    # --------------------------------------------------------------------------------------------- training
    def training_step(self, batch, batch_idx):
        nll, n, aux = self._loss(batch, router_logits=self.hparams.aux_loss_coef > 0, sync=True)
        # mean NLL per token of the global batch under DDP (each rank's token count may differ with padding)
        loss = nll / rank_denominator(n, sync=True, min_total=1.0)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        if aux is not None:
            self.log("train/aux_loss", aux, batch_size=batch["input_ids"].shape[0])
            loss = loss + self.hparams.aux_loss_coef * aux
        return loss

    def validation_step(self, batch, batch_idx):
        nll, n, _ = self._loss(batch)
        self.val_nll.update(nll.detach())
        self.val_tokens.update(n.float())

    def on_validation_epoch_end(self) -> None:
        loss = self.val_nll.compute() / self.val_tokens.compute().clamp_min(1)
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/ppl", torch.exp(loss), prog_bar=True)
        self.val_nll.reset()
        self.val_tokens.reset()

    def configure_optimizers(self):
        opt = self.optimizer(self.model.parameters())
        # the schedule's length: `max_steps` where the run is sized by it (Lightning's estimate is min(max_steps,
        # epochs x batches)); read through the estimate, so a run stopped early can be given the full length
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warm = max(self.hparams.warmup_steps, 1)

        def lr(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            t = min((step - warm) / max(total - warm, 1), 1.0)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ------------------------------------------------------------------------------------------ test / prune
    def test_step(self, batch, batch_idx):
        nll, n, _ = self._loss(batch)
        self.test_nll.update(nll.detach())
        self.test_tokens.update(n.float())

    def on_test_start(self) -> None:
        if self.hparams.prune_ratio > 0 and not self.pruned:
            self.prune(self.trainer.datamodule)

    def on_test_epoch_end(self) -> None:
        loss = self.test_nll.compute() / self.test_tokens.compute().clamp_min(1)
        self.log("test/loss", loss)
        self.log("test/ppl", torch.exp(loss))
        dm = self.trainer.datamodule
        if self.hparams.topic_eval and hasattr(dm, "topic_choice_dataloader"):
            self.log("test/topic_acc", topic_accuracy(self.model, dm.topic_choice_dataloader("test")))
        if self.report is not None:
            self.log("test/achieved_ratio", self.report.achieved_ratio)
        self.test_nll.reset()
        self.test_tokens.reset()

    def prune(self, datamodule) -> PruneReport:
        """Calibrate on `datamodule.calibration_dataloader` and prune the model in place."""
        h = self.hparams
        loader = datamodule.calibration_dataloader(h.calib_sequences)
        self.report, _ = prune_model(self.model, loader, h.prune_ratio, h.prune_method, h.averaging, h.fisher_state,
                                     h.seed)
        rank_zero_info(f"HEAPr: pruned {self.report.atoms_pruned}/{self.report.atoms_total} atoms "
                       f"({h.prune_method}, {h.averaging}); params {self.report.params_before} -> "
                       f"{self.report.params_after}; calibration {self.report.calib_seconds:.1f}s")
        return self.report

    def evaluate(self, datamodule) -> dict[str, float]:
        out = {"test_ppl": perplexity(self.model, datamodule.test_dataloader())}
        if self.hparams.topic_eval and hasattr(datamodule, "topic_choice_dataloader"):
            out["topic_acc"] = topic_accuracy(self.model, datamodule.topic_choice_dataloader("test"))
        return out

    def on_fit_end(self) -> None:
        h, trainer = self.hparams, self.trainer
        if not (h.prune_at_fit_end and h.prune_ratio > 0) or self.pruned:
            return
        if trainer.world_size > 1:
            rank_zero_warn("HEAPr: pruning after a multi-process fit is skipped; prune the saved checkpoint with "
                           "`python -m lit_iclr.heapr.streaming` (layer by layer) instead")
            return
        dm = trainer.datamodule
        self.results = {"dense": self.evaluate(dm)}
        self.prune(dm)
        self.results["pruned"] = self.evaluate(dm)
        self.results["report"] = self.report.as_dict()
        run = Path(trainer.default_root_dir)
        run.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(run / "checkpoints" / "pruned.ckpt")
        if h.export:
            self.export(run, tokenizer=getattr(dm, "tokenizer", None))
        (run / "heapr_report.json").write_text(json.dumps(self.results, indent=1))
        metrics = {f"{k}/{m}": v for k in ("dense", "pruned") for m, v in self.results[k].items()}
        metrics["pruned/achieved_ratio"] = self.report.achieved_ratio
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
            logger.save()
        rank_zero_info("HEAPr results: " + json.dumps({k: self.results[k] for k in ("dense", "pruned")}))

    def headline(self) -> Headline:
        """After a fit that pruned (`prune_at_fit_end`): test perplexity of the model pruned at `prune_ratio` against
        the same model before pruning, both evaluated in `on_fit_end` on the same test split. After `test` (or a fit
        that did not prune): the stage's perplexity, topic accuracy and achieved ratio; the other pruning methods at the
        same ratio are the benchmark's (`seeds/heapr.md`, measured on another model, so not shown as a difference)."""
        if "pruned" in self.results:
            return Headline(
                metric="pruned/test_ppl", higher_is_better=False,
                baselines={"dense (the same model before pruning)": "dense/test_ppl"}, method="HEAPr",
                claim=f"pruning {self.hparams.prune_ratio:.0%} of the expert atoms by their output-space Hessian score "
                      "costs little perplexity",
                extra=("pruned/topic_acc", "dense/topic_acc", "pruned/achieved_ratio"))
        return Headline(metric="{stage}/ppl", higher_is_better=False, method="HEAPr",
                        claim="the pruned model keeps the dense model's perplexity (seeds/heapr.md)",
                        extra=("{stage}/topic_acc", "{stage}/achieved_ratio"))

    def export(self, out: Path, tokenizer=None) -> None:
        """pruned_compact/ (own widths) and pruned_hf/ (transformers-loadable, zero-padded) next to the run."""
        import copy

        from lit_iclr.core.tokenizer import to_hf_tokenizer

        hf_tok = to_hf_tokenizer(tokenizer) if tokenizer is not None else None
        save_compact(self.model, out / "pruned_compact", tokenizer=hf_tok)
        if self.hparams.prune_method in ("frequency", "naee"):
            return  # per-layer expert counts differ: only the compact form can express them
        save_hf(copy.deepcopy(self.model), out / "pruned_hf", tokenizer=hf_tok)

    # ------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.pruned:
            checkpoint["heapr_widths"] = {b.name: b.widths() for b in check_moe(self.model)}
            if self.report is not None:
                checkpoint["heapr_report"] = self.report.as_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        widths = checkpoint.get("heapr_widths")
        if widths:  # rebuild the pruned shapes first, so the state dict fits
            self.configure_model()
            unfuse_experts(self.model)
            blocks = {b.name: b for b in check_moe(self.model)}
            for name, ws in widths.items():
                b = blocks[name]
                if len(ws) != b.num_experts:
                    drop_experts(b, list(range(len(ws))))
                for e, w in enumerate(ws):
                    b.set_expert(e, b.get_expert(e).select(torch.arange(w)))
            self._restored_pruned = True
        super().on_load_checkpoint(checkpoint)
