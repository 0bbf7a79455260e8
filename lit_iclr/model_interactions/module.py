"""K entity LMs trained for G generations, each generation one epoch on that generation's (alpha, beta) mix.

Between generations every model samples a synthetic corpus that is published to the pool (`InteractionData.pool_path`)
and scraped by all entities in the next generation. Models keep their weights across generations (each generation
fine-tunes the previous one, as in retraining deployed LMs). Validation after every generation logs the K x K perplexity
matrix (model k on topic j: own = diagonal, cross = off-diagonal), the Jensen-Shannon divergence of the models'
next-token distributions on shared prompts and the linear CKA of their representations (homogenisation).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import nn

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.module import BaseModule

from .data import write_pool
from .homogenisation import pairwise_cka, pairwise_js
from .model import HFEntityLM, TinyLM


class InteractionLM(BaseModule):
    def __init__(self, vocab_size: int, num_entities: int = 2, max_positions: int = 64, d_model: int = 64,
                 num_layers: int = 2, num_heads: int = 4, optimizer: OptimizerCallable = torch.optim.AdamW,
                 synthetic_sequences: int = 128, temperature: float = 1.0, seed: int = 0,
                 hf_models: list[str] | None = None):
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
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        if hf_models is not None:
            if len(hf_models) != num_entities:
                raise ConfigError(f"model.init_args.hf_models names {len(hf_models)} models for {num_entities} entities "
                                  f"(data.init_args.topics): give one model folder per entity")
            self.models = nn.ModuleList(HFEntityLM(p) for p in hf_models)
        else:
            self.models = nn.ModuleList(TinyLM(vocab_size, max_positions, d_model, num_layers, num_heads)
                                        for _ in range(num_entities))
        self.history: list[dict] = []
        self._val: dict = {}

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
        self.log_train({"train/loss": losses.mean(), **{f"train/loss_{k}": v for k, v in enumerate(losses)}},
                       prog_bar=["train/loss"])
        return losses.sum()

    # ------------------------------------------------------------------------------------------------ evaluation
    def on_validation_epoch_start(self):
        K = len(self.models)
        self._val = {"nll": torch.zeros(K, K + 1), "count": torch.zeros(K + 1), "js": [], "reps": [[] for _ in range(K)]}

    def validation_step(self, batch, batch_idx):
        ids, task = batch["input_ids"], batch["task"]
        K = len(self.models)
        onehot = nn.functional.one_hot(task, K + 1).float()  # (B, K+1): sums per topic without a loop over topics
        logits = []
        for k, m in enumerate(self.models):
            h = m.hidden(ids)
            lg = m.head(h)
            nll = nn.functional.cross_entropy(lg[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").mean(1)
            self._val["nll"][k] += (onehot.T @ nll).cpu()
            self._val["reps"][k].append(h.mean(1).cpu())
            logits.append(lg)
        self._val["count"] += onehot.sum(0).cpu()
        self._val["js"].append(pairwise_js(torch.stack(logits)).cpu() * len(ids))

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        K = len(self.models)
        ppl = torch.exp(self._val["nll"][:, :K] / self._val["count"][:K])  # ppl[k, j]: model k on topic j
        eye = torch.eye(K, dtype=torch.bool)
        row = {"generation": int(self.current_epoch), "own_ppl": float(ppl[eye].mean()),
               "cross_ppl": float(ppl[~eye].mean()) if K > 1 else float("nan"),
               "public_ppl": float(torch.exp(self._val["nll"][:, K] / self._val["count"][K]).mean()),
               "js": float(torch.stack(self._val["js"]).sum() / self._val["count"].sum()),
               "cka": float(pairwise_cka(torch.stack([torch.cat(r) for r in self._val["reps"]]))),
               "ppl": ppl.tolist()}
        self.history.append(row)
        for key in ("own_ppl", "cross_ppl", "public_ppl", "js", "cka"):
            self.log(f"val/{key}", row[key], batch_size=1)
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
