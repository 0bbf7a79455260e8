"""Share checkpoints on the Hugging Face hub: `python cli.py hub export|upload|download|load`.

A hub folder holds `config.yaml` (the model's class and init arguments, plus the run's full config under `run`),
`model.safetensors` (weights only, no pickle) and `README.md` (a model card with the exact command, git sha, package
versions, final metrics, and the SHA-256 of the other two files in its front matter). Loading never unpickles: weights
come through safetensors and arguments through YAML; the checksums are verified and the model class must pass the
allow-list of `core/classes.py` (`lit_iclr.`, or a prefix the user trusts through LIT_ICLR_TRUSTED_MODULES) before any
module is imported.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from .classes import resolve_class, trusted_prefixes  # noqa: F401 - trusted_prefixes: re-export
from .data import atomic_dir
from .dist_ckpt import is_distributed_checkpoint, read_distributed_checkpoint
from .errors import CheckpointError, LitIclrError
from .module import BaseModule, class_path
from .runinfo import git_sha, package_versions


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint loaded with `weights_only=True`, or a `CheckpointError` that says what is wrong."""
    path = Path(path)
    if is_distributed_checkpoint(path):  # a sharded FSDP2 checkpoint folder: consolidated into full tensors
        return read_distributed_checkpoint(path)
    if not path.is_file():
        raise CheckpointError(path, "no such checkpoint file", "pass the path of a .ckpt file (e.g. <run>/checkpoints/last.ckpt)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same thing to the user
        raise CheckpointError(path, f"cannot be read safely ({type(e).__name__}: {str(e).splitlines()[0][:200]})",
                              "only checkpoints holding tensors and plain values are accepted") from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(path, "is not a Lightning checkpoint (no state_dict)", "export a .ckpt written by `fit`")
    return ckpt


def final_metrics(run_dir: Path) -> dict[str, float]:
    """The last logged value of every metric in the run's metrics.csv."""
    out: dict[str, float] = {}
    f = run_dir / "metrics.csv"
    if not f.exists():
        return out
    with open(f, newline="") as fh:
        for row in csv.DictReader(fh):
            for k, v in row.items():
                if k not in ("epoch", "step") and v not in ("", None):
                    out[k] = float(v)
    return out


HASHED_FILES = ("model.safetensors", "config.yaml")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def card_checksums(card: Path) -> dict[str, str]:
    """The `sha256:` mapping in the model card's YAML front matter ({} when there is none)."""
    text = card.read_text() if card.is_file() else ""
    if not text.startswith("---"):
        return {}
    try:
        front = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return {}
    sums = front.get("sha256") if isinstance(front, dict) else None
    return {str(k): str(v) for k, v in sums.items()} if isinstance(sums, dict) else {}


def verify_folder(folder: Path) -> None:
    """Raise `CheckpointError` unless model.safetensors and config.yaml match the SHA-256 recorded in README.md."""
    sums = card_checksums(folder / "README.md")
    if not sums:
        raise CheckpointError(folder / "README.md", "records no SHA-256 of model.safetensors and config.yaml",
                              "load folders written by `cli.py hub export` (re-export older ones)")
    for name in HASHED_FILES:
        f = folder / name
        if not f.is_file():
            raise CheckpointError(f, "is missing from the hub folder", "download or export the folder again")
        if sha256(f) != sums.get(name):
            raise CheckpointError(f, "does not match the SHA-256 in README.md (truncated, corrupted or modified)",
                                  "download or export the folder again")


def _model_card(model_cfg: dict, info: dict, metrics: dict[str, float], source: Path,
                sums: dict[str, str] | None = None) -> str:
    metric_rows = "\n".join(f"| {k} | {v:.6g} |" for k, v in sorted(metrics.items())) or "| (none logged) | |"
    versions = "\n".join(f"- {k}: {v}" for k, v in info.get("versions", package_versions()).items())
    name = model_cfg["class_path"].rsplit(".", 1)[-1]
    return f"""---
library_name: lit-iclr
tags: [lit-iclr, pytorch-lightning, {name.lower()}]
sha256:
{"".join(f"  {k}: {v}{chr(10)}" for k, v in (sums or {}).items())}---
# {name}

Trained with lit-iclr. Load it with:

```python
from lit_iclr.core.hub import load_model
model = load_model("<this folder or repo id>")
```

## How it was trained

```
{info.get("command", "unknown")}
```

- git sha: `{info.get("git_sha", git_sha())}`
- checkpoint: `{source.name}` (step {info.get("global_step", "?")})

## Final metrics

| metric | value |
|---|---|
{metric_rows}

## Package versions

{versions}
"""


def export(ckpt_path: str | Path, out_dir: str | Path) -> Path:
    """Write a hub folder for a checkpoint written by `fit` (atomically: a failed export leaves nothing)."""
    ckpt_path = Path(ckpt_path)
    ckpt = read_checkpoint(ckpt_path)
    cls = ckpt.get("lit_iclr_class")
    hparams = ckpt.get("hyper_parameters")
    if cls is None or hparams is None:
        raise CheckpointError(ckpt_path, "does not record its model class and init arguments",
                              "export checkpoints of lit-iclr modules that call self.save_hyperparameters()")
    run_dir = ckpt_path.parent.parent
    info = json.loads((run_dir / "run_info.json").read_text()) if (run_dir / "run_info.json").exists() else {}
    info["global_step"] = ckpt.get("global_step")
    run_cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else None
    # LightningCLI adds `_class_path`/`_instantiator` to the hyperparameters; the class is recorded separately.
    init_args = {k: v for k, v in dict(hparams).items() if not k.startswith("_")}
    model_cfg = {"class_path": cls, "init_args": _plain(init_args)}
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise LitIclrError(f"{out_dir} already exists: choose another --out or remove it")
    with atomic_dir(out_dir) as tmp:
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous().clone() for k, v in ckpt["state_dict"].items()}
        save_file(state, str(tmp / "model.safetensors"), metadata={"class_path": cls})
        (tmp / "config.yaml").write_text(yaml.safe_dump({"model": model_cfg, "run": run_cfg}, sort_keys=False))
        sums = {name: sha256(tmp / name) for name in HASHED_FILES}
        (tmp / "README.md").write_text(_model_card(model_cfg, info, final_metrics(run_dir), ckpt_path, sums))
    return out_dir


def _plain(value: Any) -> Any:
    """Hyperparameters as YAML-safe values (tuples -> lists, paths -> str); anything else is dropped with a note."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if _is_plain(v)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _is_plain(value: Any) -> bool:
    if isinstance(value, (str, int, float, bool, type(None), Path)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_is_plain(v) for v in value.values())
    return False


def load_model(folder_or_repo: str | Path, revision: str | None = None) -> BaseModule:
    """Instantiate the model of a hub folder (or repo id, downloaded first) and load its safetensors weights."""
    folder = Path(folder_or_repo)
    if not folder.is_dir():
        folder = download(str(folder_or_repo), revision=revision)
    cfg_file = folder / "config.yaml"
    if not cfg_file.exists():
        raise CheckpointError(cfg_file, "hub folder has no config.yaml", "point at a folder written by `hub export`")
    verify_folder(folder)
    model_cfg = (yaml.safe_load(cfg_file.read_text()) or {}).get("model") or {}
    # nothing is imported before the class passes the allow-list: importing runs a module's code
    cls = resolve_class(model_cfg.get("class_path"), BaseModule, cfg_file, "load only lit-iclr exports")
    init_args = model_cfg.get("init_args") or {}
    if not isinstance(init_args, dict):
        raise CheckpointError(cfg_file, "model.init_args is not a mapping", "download or export the folder again")
    model = cls(**init_args)
    model.configure_model()
    from safetensors.torch import load_file

    try:
        state = load_file(str(folder / "model.safetensors"))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for truncated/garbled headers
        raise CheckpointError(folder / "model.safetensors", f"cannot be read as safetensors ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:160] if str(e) else ''})", "download or export the folder again") from e
    model.on_load_checkpoint({"state_dict": state, "lit_iclr_class": class_path(cls), "_path": str(folder)})
    model.load_state_dict(state, strict=True)
    return model.eval()


def upload(folder: str | Path, repo_id: str, private: bool = False, revision: str | None = None,
           message: str = "Upload lit-iclr checkpoint") -> str:
    """Create the repo if needed and upload the folder; returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True)
    info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), revision=revision, commit_message=message)
    return str(getattr(info, "commit_url", info))


def download(repo_id: str, revision: str | None = None, out_dir: str | Path | None = None) -> Path:
    """Snapshot a hub repo at a pinned revision (honours HF_HUB_OFFLINE: then only the local cache is used)."""
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    try:
        path = snapshot_download(repo_id, revision=revision, local_dir=out_dir,
                                 allow_patterns=["config.yaml", "model.safetensors", "README.md"])
    except Exception as e:  # noqa: BLE001 - hub errors differ by version; the user needs one sentence
        why = type(e).__name__
        if offline:
            raise LitIclrError(
                f"cannot download {repo_id!r}{f'@{revision}' if revision else ''}: HF_HUB_OFFLINE is set and it is not "
                f"in the local cache ({why}). Unset HF_HUB_OFFLINE on a machine with network, or copy the exported "
                "folder here and pass its path") from e
        raise LitIclrError(f"cannot download {repo_id!r}{f'@{revision}' if revision else ''} ({why}: "
                           f"{str(e).splitlines()[0][:200]}). Check the repo id, the revision and your token") from e
    return Path(path)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="cli.py hub", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("export", help="checkpoint -> hub folder (config.yaml, model.safetensors, README.md)")
    p.add_argument("ckpt", help="a .ckpt written by fit, e.g. runs/storm/<id>/checkpoints/last.ckpt")
    p.add_argument("--out", required=True, help="folder to create")
    p = sub.add_parser("upload", help="upload a hub folder")
    p.add_argument("folder")
    p.add_argument("--repo_id", required=True)
    p.add_argument("--private", action="store_true")
    p.add_argument("--revision", default=None, help="branch to commit to")
    p = sub.add_parser("download", help="download a hub folder at a pinned revision")
    p.add_argument("repo_id")
    p.add_argument("--revision", default=None, help="commit sha or tag to pin (recommended)")
    p.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        if args.action == "export":
            print(export(args.ckpt, args.out))
        elif args.action == "upload":
            print(upload(args.folder, args.repo_id, private=args.private, revision=args.revision))
        else:
            print(download(args.repo_id, revision=args.revision, out_dir=args.out))
    except LitIclrError as e:
        print(f"lit-iclr: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
