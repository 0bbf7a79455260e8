"""Data of interacting entities: private topics and a public topic of real text, plus a pool of synthetic corpora.

Real text is a corpus in the platform's JSONL document format (`{train,validation}.jsonl`, one
`{"title", "text", "topic"}` per line); the default is the offline Wikipedia leads, split by topic label into one
private topic per entity and shared public topics. Every generation's synthetic corpus is a JSONL file
`pool/gen_<g>.jsonl` with one `{"text", "task", "source_model", "generation"}` per sample, the format another
pipeline can produce or consume. Generation g (= training epoch g) trains entity k on `sequences_per_generation` blocks:
(1-alpha) of them real (a share beta private, 1-beta public) and alpha scraped from the pool of generation g-1, an equal
share from every model (generation 0: real only). Blocks are drawn with a generator seeded by (seed, g, k), so a resumed
run rebuilds the same mix.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core.corpus import Document, iter_jsonl, read_jsonl_documents, split_of, wikipedia_documents
from lit_iclr.core.data import BaseDataModule, ensure_generated
from lit_iclr.core.errors import ConfigError, DatasetFormatError
from lit_iclr.core.loader import EveryIndexOnEveryRank, ResumableDataLoader
from lit_iclr.core.tokenizer import EOS_ID, encode_batch, load_tokenizer, train_bpe

from .theory import counts

POOL_FIELDS = ("text", "task", "source_model", "generation")


def read_pool(path: str | Path) -> list[dict]:
    """Read one generation's synthetic corpus; errors name the file and line."""
    path = Path(path)
    rows = []
    for i, obj in iter_jsonl(path):
        missing = [k for k in POOL_FIELDS if not isinstance(obj, dict) or k not in obj]
        if missing or not isinstance(obj["text"], str):
            raise DatasetFormatError(path, f"line {i} lacks {missing or ['text (string)']}",
                                     'each line must be {"text", "task", "source_model", "generation"}')
        rows.append(obj)
    if not rows:
        raise DatasetFormatError(path, "no samples", "delete the file so the generation is sampled again")
    return rows


def write_pool(path: str | Path, rows: list[dict]) -> None:
    """Write a synthetic corpus atomically (temporary file renamed when complete)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in POOL_FIELDS}) + "\n")
    tmp.replace(path)


def stream(tok, texts: list[str]) -> np.ndarray:
    """Flat token stream, each text preceded by EOS."""
    ids = encode_batch(tok, texts) if texts else []
    return np.fromiter((t for doc in ids for t in (EOS_ID, *doc)), dtype=np.int64)


def blocks(s: np.ndarray, seq_len: int) -> torch.Tensor:
    n = len(s) // seq_len
    return torch.from_numpy(s[: n * seq_len].reshape(n, seq_len).copy())


def _draw(src: torch.Tensor, m: int, g: torch.Generator) -> torch.Tensor:
    """m blocks of `src` drawn with replacement."""
    return src[torch.randint(len(src), (m,), generator=g)] if m else src[:0]


class MixDataset(Dataset):
    """Item i: the i-th training block of every entity, (K, T); with `isolation`, also the i-th block of the isolation
    arm's real-only mix of the same generation (`input_ids_isolation`)."""

    def __init__(self, ids: torch.Tensor, isolation: torch.Tensor | None = None):
        self.ids, self.isolation = ids, isolation  # (K, n, T) each

    def __len__(self) -> int:
        return self.ids.shape[1]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"input_ids": self.ids[:, i]}
        if self.isolation is not None:
            item["input_ids_isolation"] = self.isolation[:, i]
        return item


class EvalDataset(Dataset):
    def __init__(self, ids: torch.Tensor, task: torch.Tensor):
        self.ids, self.task = ids, task

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "task": self.task[i]}


class InteractionData(BaseDataModule):
    """Private topic per entity + public real text + the synthetic pool, mixed by (alpha, beta) every generation."""

    default_name = "model_interactions-wikipedia"
    default_version = 1
    # `max_positions` (not `seq_len`, which other DataModules also have) so the link can never reach another method's model
    model_links = {"vocab_size": "vocab_size", "num_entities": "num_entities", "max_positions": "max_positions",
                   "isolation_arm": "isolation_arm"}

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 16, num_workers: int = 0,
                 topics: list[str] = ("Mathematics", "History"), public_topics: list[str] = ("Geography",),
                 alpha: float = 0.5, beta: float = 0.5, sequences_per_generation: int = 512, seq_len: int = 64,
                 vocab_size: int = 512, eval_sequences: int = 32, pool_dir: str | None = None, seed: int = 0,
                 pool_sources: str = "all", isolation_arm: bool = True):
        """
        Args:
            root: Folder with {train,validation}.jsonl documents (title, text, topic); null: offline Wikipedia leads.
            data_dir: Cache folder for the default corpus and the tokenizer.
            batch_size: Blocks per entity per step.
            num_workers: DataLoader workers.
            topics: The private topic of each entity (K = len(topics)).
            public_topics: Topics forming the shared public real set (disjoint from `topics`).
            alpha: Share of scraped synthetic data in every generation t >= 1 (alpha_t, constant).
            beta: Share of private (vs public) data within the real part (beta_t, constant).
            sequences_per_generation: Training blocks per entity per generation (one epoch).
            seq_len: Tokens per block.
            vocab_size: BPE vocabulary trained on the real train text of the chosen topics.
            eval_sequences: Validation blocks per topic (private topics and public prompts).
            pool_dir: Where gen_<g>.jsonl synthetic corpora are kept; null: <run dir>/pool.
            seed: Seed of the mixing draws.
            pool_sources: "all": the scraped share comes equally from every model (interaction, the method); "own":
                the same share comes from entity k's own model only (self-consumption control: same alpha, same amount
                of synthetic data, no exposure to the other entities).
            isolation_arm: Also train, in the same job, the isolation baseline (the paper's comparison): K more models
                from the same initial weights, on real data only (alpha = 0 at the same beta, the same draws a separate
                alpha = 0 run makes), same steps and batch size; its metrics are logged as `val/<metric>/isolation`.
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        topics, public_topics = list(topics), list(public_topics)
        if not topics or set(topics) & set(public_topics):
            raise ConfigError("data.init_args.topics must be non-empty and disjoint from public_topics")
        if not (0 <= alpha <= 1 and 0 <= beta <= 1):
            raise ConfigError(f"alpha and beta must lie in [0, 1], got alpha={alpha}, beta={beta}")
        if pool_sources not in ("all", "own"):
            raise ConfigError(f"data.init_args.pool_sources must be 'all' or 'own', got {pool_sources!r}")
        self.topics, self.public_topics = topics, public_topics
        self.alpha, self.beta = alpha, beta
        self.sequences_per_generation, self.seq_len = sequences_per_generation, seq_len
        self.max_positions = seq_len  # the model's position table (model_links)
        self.vocab_size, self.eval_sequences = vocab_size, eval_sequences
        self.pool_dir, self.seed, self.pool_sources = pool_dir, seed, pool_sources
        self.num_entities = len(topics)
        self.isolation_arm = bool(isolation_arm)
        self.tokenizer = None

    # ------------------------------------------------------------------------------------------------ default data
    def generate_default(self, out_dir: Path) -> None:
        docs = wikipedia_documents()
        by_split: dict[str, list[Document]] = {"train": [], "validation": []}
        for d in docs:
            split = split_of(d.title, d.source)
            by_split["validation" if split in ("validation", "test") else "train"].append(d)
        for split, ds in by_split.items():
            with (out_dir / f"{split}.jsonl").open("w", encoding="utf-8") as f:
                for d in ds:
                    f.write(json.dumps({"title": d.title, "text": d.text, "topic": d.topic}) + "\n")

    def describe(self) -> str:
        return (f"InteractionData: {self.path} ({{train,validation}}.jsonl), private topics {self.topics}, public "
                f"{self.public_topics}; synthetic pools under {self.pool_path()}")

    # ------------------------------------------------------------------------------------------------ reading
    def _texts(self, split: str) -> dict[str, list[str]]:
        docs = read_jsonl_documents(self.path / f"{split}.jsonl")
        wanted = self.topics + self.public_topics
        out = {t: [f"{d.title}\n{d.text}" for d in docs if d.topic == t] for t in wanted}
        for t, texts in out.items():
            if not texts:
                raise DatasetFormatError(self.path / f"{split}.jsonl", f"no documents with topic {t!r}",
                                         "choose topics present in the corpus (data.init_args.topics/public_topics)")
        return out

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        train, val = self._texts("train"), self._texts("validation")
        key = hashlib.sha1(json.dumps([str(self.path.resolve()), sorted(train), self.vocab_size]).encode()).hexdigest()[:10]
        tok_dir = Path(self.data_dir) / f"model_interactions-bpe{self.vocab_size}-{key}"
        ensure_generated(tok_dir, lambda out: train_bpe((x for ts in train.values() for x in ts),
                                                        self.vocab_size).save(str(out / "tokenizer.json")))
        self.tokenizer = load_tokenizer(tok_dir)
        self.tokenizer_key = tok_dir.name
        self._val_texts = val
        T = self.seq_len
        self.private = [blocks(stream(self.tokenizer, train[t]), T) for t in self.topics]
        self.public = blocks(stream(self.tokenizer, [x for t in self.public_topics for x in train[t]]), T)
        # validation: eval_sequences blocks of each private topic (task k) and of the public text (task K: shared prompts)
        ev, task = [], []
        for k, t in enumerate(self.topics + ["__public__"]):
            texts = val[t] if t in val else [x for p in self.public_topics for x in val[p]]
            b = blocks(stream(self.tokenizer, texts), T)[: self.eval_sequences]
            ev.append(b)
            task.append(torch.full((len(b),), k))
        ids, task = torch.cat(ev), torch.cat(task)
        # interleaved by topic (block 0 of every topic, then block 1, ...): any prefix, e.g. `limit_val_batches: 2` of
        # a smoke run, holds every topic, so own / cross perplexity are defined; the full set's metrics do not depend on
        # the order
        rank = torch.cat([torch.arange(len(b)) for b in ev])
        order = torch.argsort(rank * (len(ev) + 1) + task, stable=True)
        self.eval_ids, self.eval_task = ids[order], task[order]

    def base_corpus(self) -> tuple[torch.Tensor, dict[str, torch.Tensor], list]:
        """What a shared base LM is pretrained on: every train block of every topic (private and public), the
        validation blocks per topic, and the identity of both (corpus, topics, tokenizer, block length) for its key."""
        train = torch.cat([*self.private, self.public])
        valid = {t: blocks(stream(self.tokenizer, self._val_texts[t]), self.seq_len)[: self.eval_sequences]
                 for t in self.topics + self.public_topics}
        identity = [str(self.path.resolve()), self.topics, self.public_topics, self.tokenizer_key, self.seq_len,
                    self.eval_sequences]
        return train, valid, identity

    # ------------------------------------------------------------------------------------------------ the pool
    def pool_path(self, generation: int | None = None) -> Path:
        root = Path(self.pool_dir) if self.pool_dir else Path(self.trainer.default_root_dir if self.trainer else ".") / "pool"
        return root if generation is None else root / f"gen_{generation}.jsonl"

    def mix(self, generation: int, alpha: float | None = None) -> torch.Tensor:
        """Training blocks (K, n, T) of every entity for `generation`: counts (private, public, synthetic per model).
        `alpha` overrides the configured share (0: the isolation arm's real-only mix)."""
        K, n = self.num_entities, self.sequences_per_generation
        alpha = (self.alpha if alpha is None else alpha) if generation > 0 else 0.0
        n_priv, n_pub, n_syn = counts(n, alpha, self.beta, K)
        synthetic = []
        if n_syn:
            rows = read_pool(self.pool_path(generation - 1))
            for j in range(K):
                texts = [r["text"] for r in rows if int(r["source_model"]) == j]
                synthetic.append(blocks(stream(self.tokenizer, texts), self.seq_len))
        out = []
        for k in range(K):
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + generation * 1009 + k) % 2**31)
            parts = [_draw(self.private[k], n_priv, g), _draw(self.public, n_pub, g)]
            if self.pool_sources == "own" and n_syn:  # control: the whole synthetic share from entity k's own model
                parts.append(_draw(synthetic[k], K * n_syn, g))
            else:  # interaction: n_syn from every model j (D_t = union of all models' outputs)
                parts += [_draw(s, n_syn, g) for s in synthetic]
            out.append(torch.cat(parts))
        return torch.stack(out)

    # ------------------------------------------------------------------------------------------------ loaders
    def train_dataloader(self):
        generation = self.trainer.current_epoch if self.trainer else 0
        if generation > 0 and self.alpha > 0:
            # Under DDP rank 0 decides whether the previous generation's pool is missing and writes it; the others
            # wait, then read that file. (Each rank used to check the file itself: a rank that looked before rank 0
            # had written it failed to read it, and rank 0 then waited for it in the next collective for good.)
            path, strategy = self.pool_path(generation - 1), self.trainer.strategy
            if strategy.broadcast(not path.exists()) and self.trainer.is_global_zero:
                self.trainer.lightning_module.publish(generation - 1, path)
            strategy.barrier("model_interactions.pool")
        isolation = self.mix(generation, alpha=0.0) if self.isolation_arm else None
        return ResumableDataLoader(MixDataset(self.mix(generation), isolation), batch_size=self.batch_size, shuffle=True,
                                   seed=self.seed, num_workers=self.num_workers)

    def val_dataloader(self):
        # the whole evaluation set on every rank (its CKA needs all representations at once): every rank computes
        # the same metrics, each sample counted once
        data = EvalDataset(self.eval_ids, self.eval_task)
        return DataLoader(data, batch_size=max(self.batch_size, 32), sampler=EveryIndexOnEveryRank(len(data)))
