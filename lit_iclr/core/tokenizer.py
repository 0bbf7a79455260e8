"""A byte-level BPE tokenizer trained with Hugging Face `tokenizers`, saved as one `tokenizer.json`.

API
---
- `train_bpe(texts, vocab_size) -> tokenizers.Tokenizer`: byte-level BPE (GPT-2 style pre-tokenisation, so merges never
  cross word boundaries and any byte string is encodable); the special tokens are `EOS_TOKEN` (id 0, also used as BOS and
  document separator) and `PAD_TOKEN` (id 1).
- `load_tokenizer(path) -> tokenizers.Tokenizer`: read a `tokenizer.json` (ours or a Hugging Face checkpoint's), with a
  clear `DatasetNotFoundError`/`DatasetFormatError` naming the file.
- `to_hf_tokenizer(tok)`: wrap it as a `transformers.PreTrainedTokenizerFast` (for `save_pretrained` next to an exported
  model, so `AutoTokenizer.from_pretrained(dir)` works).
- `encode_batch(tok, texts) -> list[list[int]]`: fast batched encoding (Rust, parallel).
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .errors import DatasetFormatError, DatasetNotFoundError

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
EOS_ID, PAD_ID = 0, 1


def train_bpe(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2):
    """Train a byte-level BPE with exactly `vocab_size` entries (special tokens first: EOS=0, PAD=1)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 260:
        raise ValueError(f"vocab_size must be >= 260 (256 bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(path: str | Path):
    """Read a `tokenizer.json` file (or a folder holding one)."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.exists():
        raise DatasetNotFoundError(path, "tokenizer file not found",
                                   "rebuild the corpus cache (delete its folder under data/) or point at a checkpoint "
                                   "folder that holds tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a bare Exception on malformed JSON
        raise DatasetFormatError(path, f"not a Hugging Face tokenizer.json ({e})",
                                 "delete the file so it is rebuilt, or use the checkpoint's own tokenizer.json") from e


def encode_batch(tok, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens."""
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def to_hf_tokenizer(tok):
    """`transformers.PreTrainedTokenizerFast` around `tok` with EOS/PAD set, for `save_pretrained`."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   unk_token=None)
