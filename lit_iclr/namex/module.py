"""LightningModules of NAMEx's settings: image classification (+ zero-shot corruption robustness) and text."""
from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor

from lit_iclr.core import BaseModule
from lit_iclr.core.figures import log_figure, plt
from lit_iclr.core.global_batch import batch_samples, rank_denominator, step_rng
from lit_iclr.core.summary import CardValue, Headline

from .ffn import MergeOptions
from .model import MoETextTransformer, MoEViT, aux_loss, contribution_spread

FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
_CARD = "seeds/namex.md"
_BENCH = "benchmark setting: 5k training images, dim 48; not this config"


def _label(merge: MergeOptions) -> str:
    return f"{merge.mode} (|beta| {merge.beta_abs:g})" if merge.mode == "namex" else merge.mode


def as_options(merge: MergeOptions | dict | None) -> MergeOptions:
    """MergeOptions from the CLI (dataclass), a checkpoint's hyperparameters (dict) or nothing (defaults)."""
    if isinstance(merge, dict):
        return MergeOptions(**merge)
    return merge or MergeOptions()


def _default_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)


class MergingModule(BaseModule):
    """What every NAMEx task shares: the router balancing loss, a warm-up + cosine schedule, the balance diagnostic."""

    def __init__(self, aux_coef: float, warmup_frac: float, optimizer: OptimizerCallable):
        super().__init__()
        self.aux_coef, self.warmup_frac, self.optimizer = aux_coef, warmup_frac, optimizer

    def add_aux(self, loss: Tensor) -> Tensor:
        """loss + aux_coef * sum of the routers' cv^2(importance) + cv^2(load)."""
        return loss + self.aux_coef * aux_loss(self.net).to(loss.device)

    def log_balance(self) -> None:
        """val/contrib_cv_{nash,uniform}: spread of ||alpha_i tau_i|| vs ||tau_i|| across experts (NAMEx only)."""
        spread = contribution_spread(self.net)
        if spread is not None:  # under DDP: the mean over the ranks' first batches (each rank logs one)
            self.log("val/contrib_cv_nash", spread[0], sync_dist=True)
            self.log("val/contrib_cv_uniform", spread[1], sync_dist=True)

    def configure_optimizers(self):
        opt = self.optimizer(self.parameters())
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warmup = max(int(self.warmup_frac * total), 1)

        def factor(step: int) -> float:  # linear warm-up, then cosine to zero
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class NAMExImageClassifier(MergingModule):
    """ViT (timm blocks) whose FFNs are merging layers; tests clean and, zero-shot, on corrupted images."""

    def __init__(self, num_classes: int = 10, img_size: int = 28, patch_size: int = 4, dim: int = 64, depth: int = 4,
                 num_heads: int = 4, mlp_ratio: float = 2.0, drop: float = 0.0, merge: MergeOptions | None = None,
                 aux_coef: float = 1e-2, label_smoothing: float = 0.0, warmup_frac: float = 0.05,
                 optimizer: OptimizerCallable = _default_optimizer):
        """
        Args:
            num_classes: Number of classes (linked from the data).
            img_size: Image side in pixels (linked from the data).
            patch_size: ViT patch side.
            dim: Model width.
            depth: Transformer blocks (= merging layers, = propagation steps of EP-CAMEx/NAMEx).
            num_heads: Attention heads.
            mlp_ratio: Hidden width of one expert / dim.
            drop: Dropout in attention projection and FFN.
            merge: The FFN layer family and its options (mode dense/smoe/smear/camex/ep_camex/namex ...).
            aux_coef: Weight of the router balancing loss.
            label_smoothing: Cross-entropy label smoothing.
            warmup_frac: Fraction of the steps spent in linear learning-rate warm-up before the cosine decay.
            optimizer: Optimizer factory.
        """
        super().__init__(aux_coef, warmup_frac, optimizer)
        merge = as_options(merge)
        self.save_hyperparameters(ignore=["optimizer"])
        self.merge = merge
        self.net = MoEViT(num_classes, img_size, patch_size, 1, dim, depth, num_heads, mlp_ratio, drop, merge)
        self._test_counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])

    def forward(self, x: Tensor) -> Tensor:
        """Images in [0, 1] (B, 1, H, W) -> logits."""
        return self.net((x - FASHION_MEAN) / FASHION_STD)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        # the routers' noise and dropout: one process's on the global batch under DDP
        with step_rng(self.global_step), batch_samples(len(batch["x"])):
            logits = self(batch["x"])
        ce = F.cross_entropy(logits, batch["y"], label_smoothing=self.hparams.label_smoothing)
        loss = self.add_aux(ce)
        self.log("train/loss", ce, prog_bar=True)
        self.log("train/acc", (logits.argmax(-1) == batch["y"]).float().mean())
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits = self(batch["x"])
        self.log("val/loss", F.cross_entropy(logits, batch["y"]), sync_dist=True)
        self.log("val/acc", (logits.argmax(-1) == batch["y"]).float().mean(), prog_bar=True, sync_dist=True)
        if batch_idx == 0:
            self.log_balance()

    def headline(self) -> Headline:
        # The merging baselines each need their own training run (minutes each), so they come from the card: the
        # complex-momentum ablation and CAMEx / EP-CAMEx in the benchmark's setting, tagged with their split.
        testing = self._trainer is not None and self.trainer.testing
        if testing:  # the paper's robustness claim: zero-shot corrupted accuracy
            table = f"{_CARD}, 'Image accuracy' ({_BENCH})"
            card = {"NAMEx with complex momentum (|beta| 0.9), 3 seeds": CardValue(0.4714, table),
                    "CAMEx (curvature off), 5 seeds": CardValue(0.4789, table),
                    "EP-CAMEx, 3 seeds": CardValue(0.4830, table),
                    "NAMEx (|beta| 0), 5 seeds": CardValue(0.4903, table)}
            return Headline(metric="test/acc_corrupted", higher_is_better=True, card=card, method=_label(self.merge),
                            claim="Nash-weighted merging with propagation keeps more accuracy under zero-shot "
                                  "corruptions than CAMEx and EP-CAMEx", extra=("test/acc_clean",))
        sweep = f"{_CARD}, 'Complex momentum sweep', val acc ({_BENCH})"
        card = {"NAMEx with complex momentum (|beta| 0.9), 3 seeds": CardValue(0.6553, sweep, stage="val"),
                "NAMEx (|beta| 0), 5 seeds": CardValue(0.6800, sweep, stage="val")}
        return Headline(metric="{stage}/acc", higher_is_better=True, card=card, method=_label(self.merge),
                        claim="validation accuracy of this run next to the card's momentum ablation (complex "
                              "momentum lowered accuracy in the sweep, so the default turns it off)")

    def on_test_epoch_start(self) -> None:
        self._test_counts.clear()

    def test_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        correct = (self(batch["x"]).argmax(-1) == batch["y"]).sum()
        counts = self._test_counts[dataloader_idx]
        counts[0] += int(correct)
        counts[1] += len(batch["y"])

    def on_test_epoch_end(self) -> None:
        names = getattr(self.trainer.datamodule, "test_names", None) or ["clean"]
        acc = {names[i]: c / max(n, 1) for i, (c, n) in sorted(self._test_counts.items())}
        for name, a in acc.items():
            self.log(f"test/acc/{name}", a)
        corrupted = [a for name, a in acc.items() if name != "clean"]
        if "clean" in acc:
            self.log("test/acc_clean", acc["clean"])
        if corrupted:
            self.log("test/acc_corrupted", sum(corrupted) / len(corrupted))
            self._plot_robustness(acc)

    def _plot_robustness(self, acc: dict[str, float]) -> None:
        by_kind: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for name, a in acc.items():
            if "/" in name:
                kind, sev = name.split("/")
                by_kind[kind].append((int(sev), a))
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for kind, points in sorted(by_kind.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=kind)
        if "clean" in acc:
            ax.axhline(acc["clean"], color="k", ls="--", lw=1, label="clean")
        ax.set(xlabel="severity", ylabel="accuracy", title=f"{self.merge.mode}: zero-shot corruptions")
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        log_figure(self, "test/robustness", fig)


class PerplexityModule(MergingModule):
    """Next-token training and exact corpus perplexity (summed NLL / token count) for any `token_nll`."""

    def token_nll(self, batch: dict[str, Tensor]) -> Tensor:
        """Per-token next-token NLL (B, T-1), zero on padding."""
        raise NotImplementedError

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        # the routers' noise and dropout: one process's on the global batch under DDP
        with step_rng(self.global_step), batch_samples(len(batch["input_ids"])):
            nll = self.token_nll(batch)
        # the mean over the global batch's tokens: under DDP the denominator is the ranks' token count / world, so
        # DDP's average of the ranks' losses is summed NLL / all tokens, not a mean of per-rank means
        ce = nll.sum() / rank_denominator(batch["attention_mask"][:, 1:].sum(), sync=True, min_total=1.0)
        self.log("train/loss", ce, prog_bar=True)
        return self.add_aux(ce)

    def _accumulate(self, batch: dict[str, Tensor]) -> None:
        nll = self.token_nll(batch)
        self._nll[0] += float(nll.sum())
        self._nll[1] += int(batch["attention_mask"][:, 1:].sum())

    def _log_ppl(self, stage: str) -> None:
        # summed NLL and token count over the ranks (each rank's share of the split), so every token counts once
        sums = self.trainer.strategy.reduce(torch.tensor(self._nll, dtype=torch.float64, device=self.device),
                                            reduce_op="sum") if self._trainer is not None else torch.tensor(self._nll)
        total, count = float(sums[0]), float(sums[1])
        mean = torch.tensor(total / max(count, 1))
        self.log(f"{stage}/loss", mean)
        self.log(f"{stage}/ppl", mean.exp(), prog_bar=stage == "val")
        self._nll = [0.0, 0]

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._accumulate(batch)
        if batch_idx == 0:
            self.log_balance()

    def on_validation_epoch_end(self) -> None:
        self._log_ppl("val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._accumulate(batch)

    def on_test_epoch_end(self) -> None:
        self._log_ppl("test")

    def headline(self) -> Headline:
        return Headline(metric="{stage}/ppl", higher_is_better=False, method=_label(self.merge),
                        claim="corpus perplexity (summed NLL / tokens) with the experts merged per segment")


class NAMExLanguageModel(PerplexityModule):
    """Causal transformer LM with merging FFNs (segment-level merges, routed on the previous segment); perplexity."""

    def __init__(self, vocab_size: int = 4096, max_len: int = 512, dim: int = 64, depth: int = 4, num_heads: int = 4,
                 mlp_ratio: float = 2.0, drop: float = 0.0, merge: MergeOptions | None = None,
                 aux_coef: float = 1e-2, warmup_frac: float = 0.05, optimizer: OptimizerCallable = _default_optimizer):
        """
        Args:
            vocab_size: BPE vocabulary size (linked from the corpus).
            max_len: Longest sequence the learned positions cover (>= the corpus seq_len).
            dim: Model width.
            depth: Transformer blocks (= merging layers).
            num_heads: Attention heads.
            mlp_ratio: Hidden width of one expert / dim.
            drop: Dropout.
            merge: The FFN layer family and its options; `segment` must divide the sequence length.
            aux_coef: Weight of the router balancing loss.
            warmup_frac: Fraction of the steps in linear learning-rate warm-up.
            optimizer: Optimizer factory.
        """
        super().__init__(aux_coef, warmup_frac, optimizer)
        merge = as_options(merge)
        self.save_hyperparameters(ignore=["optimizer"])
        self.merge = merge
        self.net = MoETextTransformer(vocab_size, 0, "lm", max_len, dim, depth, num_heads, mlp_ratio, drop, merge)
        self._nll = [0.0, 0]

    def token_nll(self, batch: dict[str, Tensor]) -> Tensor:
        """Per-token negative log-likelihood of the next token (B, T-1); padding (attention_mask 0) gets 0."""
        ids = batch["input_ids"]
        logits = self.net(ids)[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch["labels"][:, 1:].reshape(-1),
                              reduction="none").view(ids.shape[0], -1)
        return nll * batch["attention_mask"][:, 1:]


    def headline(self) -> Headline:
        old = f"{_CARD}, 'Earlier run, not rerun' (LM test ppl, seed 0)"
        card = {"dense (4x width)": CardValue(318.7, old, stage="test"),
                "CAMEx (curvature off)": CardValue(467.4, old, stage="test"),
                "NAMEx, no momentum": CardValue(500.1, old, stage="test")}
        return Headline(metric="{stage}/ppl", higher_is_better=False, card=card, method=_label(self.merge),
                        claim="perplexity of this run; in the card's LM table the dense FFN beats every merging "
                              "variant at this size (see the card)")


class NAMExTopicClassifier(MergingModule):
    """Bidirectional transformer with merging FFNs (one merge per document) classifying the corpus' 12 topics."""

    def __init__(self, vocab_size: int = 4096, num_topics: int = 12, max_len: int = 512, dim: int = 64, depth: int = 4,
                 num_heads: int = 4, mlp_ratio: float = 2.0, drop: float = 0.1, merge: MergeOptions | None = None,
                 aux_coef: float = 1e-2, warmup_frac: float = 0.05, optimizer: OptimizerCallable = _default_optimizer):
        """
        Args:
            vocab_size: BPE vocabulary size (linked from the corpus).
            num_topics: Number of topic labels (linked from the corpus).
            max_len: Longest document (in tokens) the learned positions cover.
            dim: Model width.
            depth: Transformer blocks (= merging layers).
            num_heads: Attention heads.
            mlp_ratio: Hidden width of one expert / dim.
            drop: Dropout.
            merge: The FFN layer family and its options (segment must be null: one merge per document).
            aux_coef: Weight of the router balancing loss.
            warmup_frac: Fraction of the steps in linear learning-rate warm-up.
            optimizer: Optimizer factory.
        """
        super().__init__(aux_coef, warmup_frac, optimizer)
        merge = as_options(merge)
        self.save_hyperparameters(ignore=["optimizer"])
        self.merge = merge
        self.net = MoETextTransformer(vocab_size, num_topics, "topic", max_len, dim, depth, num_heads, mlp_ratio,
                                      drop, merge)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return self.net(batch["input_ids"], batch["attention_mask"])

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        # the routers' noise and dropout: one process's on the global batch under DDP
        with step_rng(self.global_step), batch_samples(len(batch["input_ids"])):
            logits = self(batch)
        ce = F.cross_entropy(logits, batch["topic"])
        self.log("train/loss", ce, prog_bar=True)
        self.log("train/acc", (logits.argmax(-1) == batch["topic"]).float().mean())
        return self.add_aux(ce)

    def _eval(self, batch: dict[str, Tensor], stage: str) -> None:
        logits = self(batch)
        n = len(batch["topic"])
        self.log(f"{stage}/loss", F.cross_entropy(logits, batch["topic"]), batch_size=n, sync_dist=True)
        self.log(f"{stage}/acc", (logits.argmax(-1) == batch["topic"]).float().mean(), batch_size=n,
                 prog_bar=stage == "val", sync_dist=True)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval(batch, "val")
        if batch_idx == 0:
            self.log_balance()

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval(batch, "test")

    def headline(self) -> Headline:
        old = f"{_CARD}, 'Earlier run, not rerun' (topic acc, 3 seeds)"
        card = {"dense (4x width)": CardValue(0.3674, old, stage="test"),
                "CAMEx (curvature off)": CardValue(0.2526, old, stage="test"),
                "NAMEx, no momentum": CardValue(0.2407, old, stage="test")}
        return Headline(metric="{stage}/acc", higher_is_better=True, card=card, method=_label(self.merge),
                        claim="topic accuracy of this run next to the card's merging variants")


class NAMExHFCausalLM(PerplexityModule):
    """A Hugging Face MoE causal LM (Qwen2-MoE / Qwen1.5-MoE, Mixtral, DeepSeek-MoE) whose MoE blocks merge experts.

    Zero-shot: `test` with a pretrained `checkpoint` (no training). Fine-tune: `fit`; for large models stack
    configs/trainer/fsdp.yaml (Lightning's ModelParallelStrategy): the model is built in `configure_model` and sharded
    there with FSDP2 (`fully_shard` per decoder block, optionally per experts group), on GPUs or on CPU processes.
    Before a run starts the memory plan of the configuration (weights, gradients, optimizer state, activations, merge
    buffers per device) is printed by rank 0.
    """

    def __init__(self, checkpoint: str | None = None, hf_config: str | None = None, arch: str = "qwen2_moe",
                 vocab_size: int = 2048,
                 merge: MergeOptions | None = None, warmup_frac: float = 0.05, activation_checkpointing: bool = False,
                 shard_experts: bool = False, param_dtype: str | None = None, reduce_dtype: str | None = None,
                 optimizer: OptimizerCallable = _default_optimizer):
        """
        Args:
            checkpoint: Local Hugging Face checkpoint folder (safetensors); null builds a tiny random `arch` model
                with the corpus' vocabulary (tests, smoke runs).
            hf_config: Folder holding a published model's config.json (e.g. configs/paper/hf/Qwen1.5-MoE-A2.7B): that
                architecture at full size with random weights (paper-scale configs, `cli.py plan`); `checkpoint` takes
                precedence.
            arch: Tiny architecture when checkpoint is null: qwen2_moe, mixtral, deepseek_v2, deepseek_v3, deepseek.
            vocab_size: Vocabulary of the tiny model (linked from the corpus); a checkpoint keeps its own.
            merge: Merging options (mode smear/camex/ep_camex/namex; `segment` tokens per merge unit).
            warmup_frac: Fraction of the steps in linear learning-rate warm-up.
            activation_checkpointing: Recompute each decoder layer in the backward (non-reentrant; the merging chain's
                state crosses the checkpoints explicitly, so gradients are unchanged).
            shard_experts: Under the FSDP2 strategy, shard each layer's routed experts as their own group as well.
            param_dtype: Under the FSDP2 strategy, the dtype parameters are gathered in (e.g. bfloat16; null: as stored).
            reduce_dtype: Under the FSDP2 strategy, the dtype gradients are reduced in (null: param_dtype).
            optimizer: Optimizer factory.
        """
        super().__init__(0.0, warmup_frac, optimizer)
        merge = as_options(merge)
        self.save_hyperparameters(ignore=["optimizer"])
        self.merge = merge
        self.net: torch.nn.Module | None = None
        self._nll = [0.0, 0]

    def configure_model(self) -> None:
        if self.net is not None:
            return
        from lit_iclr.core.moe import load_pretrained, tiny_model

        from .hf import apply_merging

        hp = self.hparams
        if hp.checkpoint:
            self.net = load_pretrained(hp.checkpoint)
        elif hp.get("hf_config"):
            from lit_iclr.core.moe.published import published_model

            self.net = published_model(hp.hf_config)
        else:
            self.net = tiny_model(hp.arch, vocab_size=hp.vocab_size)
        self.net.train(self.training)
        apply_merging(self.net, self.merge)
        if hp.activation_checkpointing:
            self.net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        from lit_iclr.core.moe.sharding import shard_model, strategy_mesh

        mesh = strategy_mesh(self)
        if mesh is not None:  # configs/trainer/fsdp.yaml: FSDP2 per decoder block
            shard_model(self.net, mesh, hp.param_dtype, hp.reduce_dtype, hp.shard_experts)

    def on_fit_start(self) -> None:
        if self.trainer.is_global_zero and self.net is not None:
            from lit_iclr.core.moe.memory import plan_for_run

            print(plan_for_run(self), flush=True)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.net is not None:
            from .hf import set_merging_train

            set_merging_train(self.net, mode)
        return self

    def token_nll(self, batch: dict[str, Tensor]) -> Tensor:
        logits = self.net(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          use_cache=False).logits[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch["labels"][:, 1:].reshape(-1),
                              reduction="none").view(logits.shape[0], -1)
        return nll * batch["attention_mask"][:, 1:]
