"""K entity LMs trained for G generations, each generation one epoch on that generation's (alpha, beta) mix.

Between generations every model samples a synthetic corpus that is published to the pool (`InteractionData.pool_path`)
and scraped by all entities in the next generation. Models keep their weights across generations (each generation
fine-tunes the previous one, as in retraining deployed LMs). Validation after every generation logs the K x K perplexity
matrix (model k on topic j: own = diagonal, cross = off-diagonal), the Jensen-Shannon divergence of the models'
next-token distributions on shared prompts and the linear CKA of their representations (homogenisation).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import nn

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.module import BaseModule
from lit_iclr.core.summary import Headline

from .data import write_pool
from .homogenisation import pairwise_cka, pairwise_js
from .model import HFEntityLM, TinyLM


class InteractionLM(BaseModule):
    def __init__(self, vocab_size: int, num_entities: int = 2, max_positions: int = 64, d_model: int = 64,
                 num_layers: int = 2, num_heads: int = 4, optimizer: OptimizerCallable = torch.optim.AdamW,
                 synthetic_sequences: int = 128, temperature: float = 1.0, seed: int = 0,
                 hf_models: list[str] | None = None, isolation_arm: bool = False, base_steps: int = 0,
                 base_lr: float = 3e-3, base_batch_size: int = 32, base_seed: int = 0):
        """
        Args:
            vocab_size: Tokenizer size (linked from the data).
            num_entities: K, one LM per entity (linked from the data's topics).
            max_positions: Longest block (linked from the data's seq_len).
            d_model: Width of every entity LM.
            num_layers: Transformer layers per LM.
            num_heads: Attention heads.
            optimizer: Optimizer over all K models (their losses are summed; the models share no parameters).
            synthetic_sequences: Samples every model publishes after each generation.
            temperature: Sampling temperature of the published samples.
            seed: Seed of the sampling generator (with the generation index, so a resumed run samples the same corpus).
            hf_models: One Hugging Face model folder per entity (the paper's OPT-350M and Llama-3.2-1B) instead of the
                tiny LMs (d_model, num_layers, num_heads unused); a folder with only config.json builds the architecture
                on the meta device (`cli.py plan`). Token ids must lie below every model's vocabulary.
            isolation_arm: Linked from the data: also train K isolation models (copies of the initial weights, real
                data only, batch key `input_ids_isolation`), the baseline of the run's headline.
            base_steps: 0: every entity starts from fresh random weights (the small default). > 0: every entity and
                the isolation arm start from one shared base LM pretrained for this many steps on the real train text
                of all topics (`base.py`, cached under the data's `data_dir`, keyed by its settings), as the paper's
                entities start from pretrained LLMs.
            base_lr: Peak learning rate of the base's pretraining (AdamW, warm-up + cosine).
            base_batch_size: Blocks per pretraining step.
            base_seed: Seed of the base's initial weights and batches (one base shared by every run seed, as one
                public pretrained model would be).
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        if base_steps and hf_models is not None:
            raise ConfigError("model.init_args.base_steps pretrains a TinyLM base; with hf_models the entities already "
                              "start from pretrained models: set base_steps: 0")
        if hf_models is not None:
            if len(hf_models) != num_entities:
                raise ConfigError(f"model.init_args.hf_models names {len(hf_models)} models for {num_entities} entities "
                                  f"(data.init_args.topics): give one model folder per entity")
            self.models = nn.ModuleList(HFEntityLM(p) for p in hf_models)
        else:
            self.models = nn.ModuleList(TinyLM(vocab_size, max_positions, d_model, num_layers, num_heads)
                                        for _ in range(num_entities))
        # the isolation baseline: the same initial weights (paired), trained on the real-only mix in the same steps
        self.isolated = copy.deepcopy(self.models) if isolation_arm and hf_models is None else None
        self.history: list[dict] = []
        self._val: dict = {}
        self.base_info: dict | None = None

    def setup(self, stage: str) -> None:
        """With `base_steps` > 0: load the shared base (pretrained on first use) into every entity and isolation model.
        A resumed run's checkpoint weights are restored after this and replace it."""
        hp = self.hparams
        if not hp.base_steps or self.base_info is not None:
            return
        from .base import ensure_base, load_base

        dm = self.trainer.datamodule
        model_kw = {"vocab_size": hp.vocab_size, "max_positions": hp.max_positions, "d_model": hp.d_model,
                    "num_layers": hp.num_layers, "num_heads": hp.num_heads}
        train, valid, identity = dm.base_corpus()
        settings = {"version": 1, "data": identity, "model_kw": model_kw, "steps": hp.base_steps, "lr": hp.base_lr,
                    "batch_size": hp.base_batch_size, "seed": hp.base_seed}
        folder = ensure_base(dm.data_dir, settings, train, valid)
        state = load_base(folder)
        for m in [*self.models, *(self.isolated or [])]:
            m.load_state_dict(state)
        self.base_info = json.loads((folder / "base.json").read_text())

    def configure_optimizers(self):
        return self.optimizer(self.parameters())

    @staticmethod
    def token_nll(model: TinyLM | HFEntityLM, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token next-token NLL (B, T-1) and the logits (B, T, V)."""
        logits = model(ids)
        nll = nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        return nll, logits

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"]  # (B, K, T): entity k's own mix
        losses = torch.stack([self.token_nll(m, ids[:, k])[0].mean() for k, m in enumerate(self.models)])
        logs = {"train/loss": losses.mean(), **{f"train/loss_{k}": v for k, v in enumerate(losses)}}
        total = losses.sum()
        if self.isolated is not None:  # the models share no parameters: each arm's gradients are its own
            iso = batch["input_ids_isolation"]
            iso_losses = torch.stack([self.token_nll(m, iso[:, k])[0].mean() for k, m in enumerate(self.isolated)])
            logs["train/loss/isolation"] = iso_losses.mean()
            total = total + iso_losses.sum()
        self.log_train(logs, prog_bar=["train/loss"])
        return total

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        """Clip each arm's gradients on their own, so the isolation arm's updates are those of a separate alpha = 0 run
        (one global norm over both arms would couple them)."""
        if self.isolated is None or not gradient_clip_val:
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        for arm in (self.models, self.isolated):
            params = [p for p in arm.parameters() if p.grad is not None]
            if gradient_clip_algorithm == "value":
                nn.utils.clip_grad_value_(params, gradient_clip_val)
            else:
                nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def headline(self) -> Headline:
        return Headline(
            metric="{stage}/cross_ppl", higher_is_better=False, method="interaction (shared pool)",
            baselines={"isolation (real data only, same steps)": "{stage}/cross_ppl/isolation"},
            claim="models that scrape each other's outputs see the other entity's topic: lower perplexity on it than "
                  "models trained in isolation (at a cost on their own topic, and more alike: lower JS)",
            extra=("{stage}/own_ppl", "{stage}/own_ppl/isolation", "{stage}/js", "{stage}/js/isolation"))

    # ------------------------------------------------------------------------------------------------ evaluation
    def _arms(self) -> dict[str, nn.ModuleList]:
        """Logged-key suffix -> the arm's K models: the interacting models and, when built, the isolation arm."""
        return {"": self.models, **({"/isolation": self.isolated} if self.isolated is not None else {})}

    def on_validation_epoch_start(self):
        K = len(self.models)
        self._val = {arm: {"nll": torch.zeros(K, K + 1), "count": torch.zeros(K + 1), "js": [], "reps": [[] for _ in range(K)]}
                     for arm in self._arms()}

    def validation_step(self, batch, batch_idx):
        ids, task = batch["input_ids"], batch["task"]
        K = len(self.models)
        onehot = nn.functional.one_hot(task, K + 1).float()  # (B, K+1): sums per topic without a loop over topics
        for arm, models in self._arms().items():
            acc, logits = self._val[arm], []
            for k, m in enumerate(models):
                h = m.hidden(ids)
                lg = m.head(h)
                nll = nn.functional.cross_entropy(lg[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").mean(1)
                acc["nll"][k] += (onehot.T @ nll).cpu()
                acc["reps"][k].append(h.mean(1).cpu())
                logits.append(lg)
            acc["count"] += onehot.sum(0).cpu()
            acc["js"].append(pairwise_js(torch.stack(logits)).cpu() * len(ids))

    def _row(self, acc: dict) -> dict:
        K = len(self.models)
        ppl = torch.exp(acc["nll"][:, :K] / acc["count"][:K])  # ppl[k, j]: model k on topic j
        eye = torch.eye(K, dtype=torch.bool)
        return {"own_ppl": float(ppl[eye].mean()), "cross_ppl": float(ppl[~eye].mean()) if K > 1 else float("nan"),
                "public_ppl": float(torch.exp(acc["nll"][:, K] / acc["count"][K]).mean()),
                "js": float(torch.stack(acc["js"]).sum() / acc["count"].sum()),
                "cka": float(pairwise_cka(torch.stack([torch.cat(r) for r in acc["reps"]]))), "ppl": ppl.tolist()}

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        row = {"generation": int(self.current_epoch), **self._row(self._val[""])}
        if "/isolation" in self._val:
            row["isolation"] = self._row(self._val["/isolation"])
        self.history.append(row)
        for arm, values in (("", row), ("/isolation", row.get("isolation"))):
            for key in ("own_ppl", "cross_ppl", "public_ppl", "js", "cka") if values else ():
                self.log(f"val/{key}{arm}", values[key], batch_size=1)
        # `trainer.log_dir` is a broadcast from rank 0 under DDP: every rank reads it. (Read only on rank 0, after
        # `is_global_zero and ...`, it left rank 0 waiting in that broadcast for good after the first generation.)
        log_dir = self.trainer.log_dir
        if self.trainer.is_global_zero and log_dir:
            with (Path(log_dir) / "interactions.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")

    # ------------------------------------------------------------------------------------------------ the pool
    @torch.no_grad()
    def publish(self, generation: int, path: str | Path) -> None:
        """Every model samples `synthetic_sequences` texts; written as gen_<g>.jsonl (text, task, source_model, generation).

        Rank 0 only (the others read the file it writes): it has no collective, so no rank waits for another here."""
        if not self.trainer.is_global_zero:
            return
        dm = self.trainer.datamodule
        tok, T = dm.tokenizer, self.hparams.max_positions
        g = torch.Generator(device=self.device).manual_seed(self.hparams.seed * 100_003 + generation)
        rows = []
        was_training = self.training
        self.eval()
        for k, m in enumerate(self.models):
            ids = m.sample(self.hparams.synthetic_sequences, T - 1, bos_id=0, temperature=self.hparams.temperature,
                           generator=g)
            for text in tok.decode_batch(ids.tolist(), skip_special_tokens=True):
                rows.append({"text": text, "task": dm.topics[k], "source_model": k, "generation": generation})
        self.train(was_training)
        write_pool(path, rows)

    def on_train_end(self):
        """Keep the last generation's corpus too (every generation's corpus is kept)."""
        dm = self.trainer.datamodule
        last = self.current_epoch - 1 if self.trainer.fit_loop.epoch_loop.done else self.current_epoch
        path = dm.pool_path(max(last, 0))
        if not path.exists():
            self.publish(max(last, 0), path)
