"""Prune a saved checkpoint layer by layer and write the smaller model (safetensors shards + config.json).

    python -m lit_iclr.aire_prune.prune runs/aire_prune/<run>/checkpoints/last.ckpt --ratio 0.6 --out pruned/


The checkpoint is memory-mapped, so only one layer's tensors are materialised at a time: pass 1 scores each layer,
the global threshold is chosen, pass 2 slices each layer and writes it to its own shard. `load_pruned(out_dir)`
rebuilds the sliced `SSMClassifier` from `config.json` and the shards.
"""
from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lit_iclr.core import CheckpointError

from . import aire
from .model import S4DSSM, S5SSM, SSMClassifier

PREFIX = "model."  # where AIREPruneClassifier keeps its SSMClassifier


def _load_checkpoint(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(path, "checkpoint file not found", "pass the path of a .ckpt written by `fit`")
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # not a zip checkpoint, or a pickle holding more than tensors and plain values
        raise CheckpointError(path, f"cannot be read as a checkpoint ({type(e).__name__}: {str(e)[:120]})",
                              "pass a checkpoint written by `python cli.py fit --config configs/aire_prune*.yaml`") from e


def model_config(hparams: dict) -> dict:
    """The `SSMClassifier` arguments among a module's hyperparameters."""
    names = set(inspect.signature(SSMClassifier.__init__).parameters) - {"self"}
    return {k: v for k, v in hparams.items() if k in names}


def build_ssm(config: dict, n_states: int):
    """An SSM layer of the checkpoint's kind with `n_states` stored states (values are loaded afterwards)."""
    c = config
    if c.get("layer_type", "s5") == "s5":
        return S5SSM(c["d_model"], c["state_size"], c.get("blocks", 1), c.get("conj_sym", True),
                     c.get("bidirectional", False), c.get("ssm_init", "hippo"), c.get("dt_min", 1e-3),
                     c.get("dt_max", 1e-1), c.get("clip_eigs", True), c.get("mode", "fft"), n_states=n_states, seed=0)
    return S4DSSM(c["d_model"], c["state_size"], c.get("bidirectional", False), c.get("ssm_init", "s4d_lin"),
                  c.get("dt_min", 1e-3), c.get("dt_max", 1e-1), c.get("mode", "fft"), n_states=n_states, seed=0)


def _layer_ssm(state: dict, config: dict, i: int):
    """Materialise layer i's SSM from the (memory-mapped) state dict."""
    head = f"{PREFIX}layers.{i}.ssm."
    params = {k[len(head):]: v for k, v in state.items() if k.startswith(head)}
    n = (params["Lambda_re"] if "Lambda_re" in params else params["log_A_real"]).shape[0]
    ssm = build_ssm(config, n)
    ssm.load_state_dict(params)
    return ssm


def prune_checkpoint(ckpt_path: str | Path, out_dir: str | Path, ratio: float, method: str = "aire",
                     bidir: str = "intended", seed: int = 0) -> aire.PrunePlan:
    """Score, choose and slice the states of a fit checkpoint layer by layer; write the smaller model to out_dir."""
    ckpt_path, out_dir = Path(ckpt_path), Path(out_dir)
    ckpt = _load_checkpoint(ckpt_path)
    if "state_dict" not in ckpt or "hyper_parameters" not in ckpt:
        raise CheckpointError(ckpt_path, "has no state_dict/hyper_parameters", "pass a Lightning checkpoint from `fit`")
    state, config = ckpt["state_dict"], model_config(dict(ckpt["hyper_parameters"]))
    n_layers = config.get("n_layers", 0)
    if f"{PREFIX}layers.0.ssm.D" not in state:
        raise CheckpointError(ckpt_path, "holds no SSM layers", "pass a checkpoint of AIREPruneClassifier")
    gen = torch.Generator().manual_seed(seed)
    raw = [aire.layer_scores(_layer_ssm(state, config, i), method, bidir, gen) for i in range(n_layers)]  # pass 1
    p = aire.plan_from_scores(raw, ratio, method)
    out_dir.mkdir(parents=True, exist_ok=True)
    for i, keep in enumerate(p.keep):  # pass 2: one layer in memory at a time
        ssm = _layer_ssm(state, config, i).keep_states(keep)
        head = f"{PREFIX}layers.{i}."
        tensors = {f"layers.{i}.ssm.{k}": v.contiguous() for k, v in ssm.state_dict().items()}
        tensors.update({k[len(PREFIX):]: v.clone() for k, v in state.items()
                        if k.startswith(head) and not k.startswith(head + "ssm.")})
        save_file(tensors, out_dir / f"layer_{i:03d}.safetensors")
    rest = {k[len(PREFIX):]: v.clone() for k, v in state.items()
            if k.startswith(PREFIX) and not k.startswith(f"{PREFIX}layers.")}
    save_file(rest, out_dir / "rest.safetensors")
    config["state_counts"] = p.kept_counts
    meta = {"model": config, "pruning": {"method": method, "ratio": ratio, "bidir": bidir, "seed": seed,
                                         "pruned_fraction": p.pruned_fraction, "layer_fractions": p.layer_fractions,
                                         "threshold": p.threshold, "source": str(ckpt_path)}}
    (out_dir / "config.json").write_text(json.dumps(meta, indent=2))
    return p


def save_pruned(model: SSMClassifier, out_dir: str | Path, pruning: dict | None = None) -> None:
    """Write an in-memory (sliced) model in the same layout as `prune_checkpoint`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for i in range(len(model.layers)):
        save_file({k: v for k, v in state.items() if k.startswith(f"layers.{i}.")}, out_dir / f"layer_{i:03d}.safetensors")
    save_file({k: v for k, v in state.items() if not k.startswith("layers.")}, out_dir / "rest.safetensors")
    config = dict(model.config, state_counts=model.state_counts())
    (out_dir / "config.json").write_text(json.dumps({"model": config, "pruning": pruning or {}}, indent=2))


def load_pruned(out_dir: str | Path) -> SSMClassifier:
    """Rebuild a pruned `SSMClassifier` from `config.json` and its safetensors shards."""
    out_dir = Path(out_dir)
    cfg_file = out_dir / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(cfg_file, "no config.json", "pass a folder written by prune_checkpoint/save_pruned")
    config = json.loads(cfg_file.read_text())["model"]
    model = SSMClassifier(**config)
    state = {}
    for shard in sorted(out_dir.glob("*.safetensors")):
        state.update(load_file(shard))
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(out_dir, f"shards do not fit config.json ({str(e).splitlines()[0]})",
                              "write the folder again with prune_checkpoint") from e
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", help="checkpoint (.ckpt) written by fit")
    ap.add_argument("--ratio", type=float, required=True, help="fraction of states to prune, in [0, 1)")
    ap.add_argument("--method", default="aire", choices=aire.METHODS)
    ap.add_argument("--bidir", default="intended", choices=("intended", "quirk"))
    ap.add_argument("--seed", type=int, default=0, help="seed of the random baseline")
    ap.add_argument("--out", required=True, help="output folder (safetensors shards + config.json)")
    args = ap.parse_args(argv)
    try:
        p = prune_checkpoint(args.ckpt, args.out, args.ratio, args.method, args.bidir, args.seed)
    except CheckpointError as e:
        raise SystemExit(f"lit-iclr: error: {e}") from None
    counts = ", ".join(f"{k}/{n}" for k, n in zip(p.kept_counts, p.sizes, strict=True))
    print(f"{args.method}: pruned {p.pruned_fraction:.1%} of the states (kept per layer {counts}) -> {args.out}")


if __name__ == "__main__":
    main()
