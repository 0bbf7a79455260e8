"""A competent shared base: one TinyLM pretrained on the real train text of every topic, the start of every entity.

The paper's entities fine-tune pretrained LLMs (OPT-350M, Llama-3.2-1B) that already model text well, so the samples
they publish are text-like. Entities trained from scratch for a few hundred steps publish samples close to noise. Here
one base LM is pretrained on all topics (private and public, train split only) and every entity model and the isolation
arm start from its weights. The base is cached like a generated dataset: `<data_dir>/model_interactions-base-<key>/`
holds `base.pt` (the state dict, read with `weights_only=True`) and `base.json` (its settings and its validation
perplexity per topic); the key hashes every setting that changes the weights, so two configs never share a wrong base.
"""
from __future__ import annotations

import hashlib
import json
import math
import pickle
from pathlib import Path

import torch
from torch import nn

from lit_iclr.core.data import ensure_generated
from lit_iclr.core.errors import CheckpointError

from .model import TinyLM


def base_folder(data_dir: str | Path, settings: dict) -> Path:
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Path(data_dir) / f"model_interactions-base-{key}"


@torch.no_grad()
def perplexity(model: TinyLM, ids: torch.Tensor, batch_size: int = 64) -> float:
    """exp(mean next-token NLL) over the blocks `ids` (N, T)."""
    total, count = 0.0, 0
    for i in range(0, len(ids), batch_size):
        b = ids[i:i + batch_size]
        logits = model(b)
        nll = nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), b[:, 1:], reduction="sum")
        total, count = total + float(nll), count + b[:, 1:].numel()
    return math.exp(total / count)


def pretrain(train: torch.Tensor, model_kw: dict, steps: int, lr: float, batch_size: int, seed: int) -> TinyLM:
    """AdamW on random blocks of `train` (N, T) for `steps` steps: linear warm-up over the first 5%, cosine decay to 10%
    of `lr`, gradient norm clipped at 1 (the usual LM recipe); deterministic given `seed`."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = TinyLM(**model_kw)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    model.train()
    for _ in range(steps):
        b = train[torch.randint(len(train), (batch_size,), generator=g)]
        loss = nn.functional.cross_entropy(model(b)[:, :-1].transpose(1, 2), b[:, 1:])
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return model.eval()


def ensure_base(data_dir: str | Path, settings: dict, train: torch.Tensor, valid: dict[str, torch.Tensor]) -> Path:
    """The cached base for `settings` (model_kw, steps, lr, batch_size, seed and the data's identity), pretrained on
    `train` on first use; `valid` (topic -> blocks) is measured and written to base.json."""
    def generate(out: Path) -> None:
        model = pretrain(train, settings["model_kw"], settings["steps"], settings["lr"], settings["batch_size"],
                         settings["seed"])
        torch.save(model.state_dict(), out / "base.pt")
        ppl = {t: perplexity(model, v) for t, v in valid.items()}
        (out / "base.json").write_text(json.dumps({**settings, "train_blocks": len(train), "valid_ppl": ppl}, indent=1))

    return ensure_generated(base_folder(data_dir, settings), generate)


def load_base(folder: Path) -> dict[str, torch.Tensor]:
    path = Path(folder) / "base.pt"
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise CheckpointError(path, f"cannot read the cached base LM ({str(e).splitlines()[0][:120]})",
                              "delete the folder; the base is pretrained again on the next run") from None
