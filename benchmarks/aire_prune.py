"""AIRE-Prune benchmark: accuracy vs. fraction of states pruned (no retraining) for AIRE, LAST, magnitude and random,
for S5 (MIMO) and S4D (SISO) classifiers on sequential Fashion-MNIST and LRA ListOps; plus the throughput of the
sliced model next to the fraction of state compute removed.

    python benchmarks/aire_prune.py            # the card's numbers (CPU, tens of minutes on 2 shared cores)
    python benchmarks/aire_prune.py --quick    # smoke run on tiny data (a minute)

Prints markdown tables; writes seeds/figures/aire_prune_curves.png and runs/benchmarks/aire_prune.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import lightning as L
import torch

from lit_iclr.aire_prune import (
    AIREPruneClassifier,
    ListOpsData,
    SequentialImageData,
    aire,
)
from lit_iclr.aire_prune.plots import accuracy_curves_figure

RATIOS = [round(0.1 * i, 1) for i in range(10)]  # 0 .. 90 %
QUANTILES = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0])

# Model sizes: small enough to train on a CPU in minutes, large enough to have redundant states.
MODELS = {
    "S5": dict(layer_type="s5", d_model=64, n_layers=4, state_size=32, blocks=2, ssm_init="hippo"),
    "S4D": dict(layer_type="s4d", d_model=64, n_layers=4, state_size=16, ssm_init="s4d_lin"),
}


def tasks(quick: bool) -> dict:
    if quick:
        return {
            "sFMNIST": dict(make=lambda: SequentialImageData(dataset="digits", downsample=1, batch_size=64),
                            epochs=2, bidirectional=False),
            "ListOps": dict(make=lambda: ListOpsData(data_dir="data", batch_size=64, num_train=400, num_val=100,
                                                     num_test=100), epochs=1, bidirectional=True),
        }
    return {
        # 14x14 = 196 steps; a subset of the training split keeps a model at a few CPU minutes.
        "sFMNIST": dict(make=lambda: SequentialImageData(downsample=2, batch_size=64, train_size=8000,
                                                         val_size=500, test_size=1000),
                        epochs=2, bidirectional=False),
        # LRA's generator with short trees (20-100 tokens) instead of 500-2000.
        "ListOps": dict(make=lambda: ListOpsData(data_dir="data", batch_size=64, num_train=6000, num_val=500,
                                                 num_test=1000),
                        epochs=4, bidirectional=True),
    }


def train(spec: dict, dm, arch: dict, bidirectional: bool) -> tuple[AIREPruneClassifier, float]:
    L.seed_everything(0, verbose=False)
    module = AIREPruneClassifier(d_input=dm.d_input, vocab_size=dm.vocab_size, num_classes=dm.num_classes,
                                 bidirectional=bidirectional, dropout=0.1, warmup_steps=50, **arch)
    trainer = L.Trainer(max_epochs=spec["epochs"], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    t0 = time.perf_counter()
    trainer.fit(module, dm)
    return module.eval(), time.perf_counter() - t0


@torch.no_grad()
def accuracy(model, batches) -> float:
    model.eval()
    correct = total = 0
    for b in batches:
        pred = model(b["x"], b.get("x_mask")).argmax(-1)
        correct += int((pred == b["y"]).sum())
        total += len(b["y"])
    return 100.0 * correct / total


@torch.no_grad()
def throughput(dense, pruned, batch: dict, repeats: int = 7) -> tuple[float, float]:
    """Sequences per second of both models on the same batch, timed alternately so machine load hits both alike."""
    times = {"dense": [], "pruned": []}
    for m in (dense, pruned):  # warm-up
        m(batch["x"], batch.get("x_mask"))
    for _ in range(repeats):
        for name, m in (("dense", dense), ("pruned", pruned)):
            t0 = time.perf_counter()
            m(batch["x"], batch.get("x_mask"))
            times[name].append(time.perf_counter() - t0)
    n = len(batch["y"])
    return n / statistics.median(times["dense"]), n / statistics.median(times["pruned"])


def sweep(model, batches, methods) -> dict:
    out = {}
    for method, bidir in methods:
        pts, layer_fr = [], []
        for r in RATIOS:
            smaller, p = aire.prune(model, r, method.split("_")[0], bidir)
            pts.append((p.pruned_fraction, accuracy(smaller, batches)))
            layer_fr.append([round(f, 3) for f in p.layer_fractions])
        out[method] = {"points": pts, "layer_fractions": layer_fr}
    return out


def max_within(points, tol=1.0) -> tuple[float, float]:
    """Largest fraction pruned before the accuracy first falls more than `tol` points below the unpruned model,
    and the accuracy change there (points, negative = lost)."""
    base, best = points[0][1], (0.0, 0.0)
    for f, a in points:
        if a < base - tol:
            break
        best = (f, a - base)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny data, for a smoke run")
    ap.add_argument("--out", default="runs/benchmarks/aire_prune.json")
    ap.add_argument("--figure", default="seeds/figures/aire_prune_curves.png")
    ap.add_argument("--tasks", default="sFMNIST,ListOps", help="comma-separated subset of the tasks")
    ap.add_argument("--wide", action="store_true",
                    help="2x the states (S5 P=64, S4D N=32): a more over-parameterised state, closer to the paper's models")
    ap.add_argument("--speed_only", action="store_true",
                    help="no training: throughput of sliced vs. unpruned models at 30/50/70/90%% (weights do not "
                         "change the compute, only which states go)")
    args = ap.parse_args()
    if args.wide:
        MODELS["S5"]["state_size"], MODELS["S4D"]["state_size"] = 64, 32
    torch.set_num_threads(1)  # the machine is shared; one thread also makes timings steadier
    if args.speed_only:
        speed_table(tasks(args.quick), args.tasks.split(","))
        return
    results, curves = {}, {}
    for task, spec in tasks(args.quick).items():
        if task not in args.tasks.split(","):
            continue
        dm = spec["make"]()
        dm.prepare_data()
        dm.setup("fit")
        batches = list(dm.test_dataloader())
        for name, arch in MODELS.items():
            model, train_s = train(spec, dm, arch, spec["bidirectional"])
            net = model.model
            methods = [("aire", "intended"), ("last", "intended"), ("magnitude", "intended"), ("random", "intended")]
            if spec["bidirectional"]:
                methods.append(("aire_quirk", "quirk"))
            res = sweep(net, batches, methods)
            f_aire = max_within(res["aire"]["points"])[0]
            speed_ratio = f_aire if f_aire > 0 else 0.5
            smaller, p = aire.prune(net, speed_ratio, "aire")
            big = _stack_batches(batches[:4])
            dense_sps, pruned_sps = throughput(net, smaller, big)
            lam = torch.cat([s.modal_terms()["lam_abs"] for s in net.ssms()])
            results.setdefault(task, {})[name] = {
                "train_seconds": round(train_s, 1), "params": sum(p.numel() for p in net.parameters()),
                "states": sum(net.state_counts()),
                "lam_abs_quantiles": [round(float(q), 4) for q in torch.quantile(lam, QUANTILES)],
                "sweep": res, "speed": {"fraction": p.pruned_fraction, "dense_seq_per_s": dense_sps,
                                        "pruned_seq_per_s": pruned_sps,
                                        "state_macs_removed": 1 - smaller.state_macs_per_step() / net.state_macs_per_step(),
                                        "layer_fractions": p.layer_fractions},
            }
            curves.setdefault(task, {})[name] = {m: v["points"] for m, v in res.items()}
            print(f"[{task}/{name}] trained in {train_s:.0f}s, unpruned acc {res['aire']['points'][0][1]:.2f}",
                  flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=1))  # after every model: a crash keeps the rest
    fig = accuracy_curves_figure(curves)
    Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.figure, dpi=110)
    print_tables(results)


def speed_table(specs: dict, names: list[str]) -> None:
    """Throughput of sliced AIRE-pruned models against the unpruned one, for each task's shapes (untrained weights)."""
    print("\n### Speed: sliced AIRE-pruned model vs. unpruned (forward, 256 test sequences, 1 CPU thread)\n")
    print("| task | model | states pruned | state MACs removed | dense seq/s | pruned seq/s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for task, spec in specs.items():
        if task not in names:
            continue
        dm = spec["make"]()
        dm.prepare_data()
        dm.setup("test")
        batch = _stack_batches(list(dm.test_dataloader())[:4])
        for name, arch in MODELS.items():
            torch.manual_seed(0)
            net = AIREPruneClassifier(d_input=dm.d_input, vocab_size=dm.vocab_size, num_classes=dm.num_classes,
                                      bidirectional=spec["bidirectional"], **arch).model.eval()
            for ratio in (0.3, 0.5, 0.7, 0.9):
                smaller, p = aire.prune(net, ratio, "aire")
                dense, pruned = throughput(net, smaller, batch)
                removed = 1 - smaller.state_macs_per_step() / net.state_macs_per_step()
                print(f"| {task} | {name} | {100 * p.pruned_fraction:.0f}% | {100 * removed:.0f}% | {dense:.0f} | "
                      f"{pruned:.0f} | {pruned / dense:.2f}x |", flush=True)


def _stack_batches(batches: list[dict]) -> dict:
    """One bigger batch for timing (token batches are re-padded to the longest)."""
    if "x_mask" not in batches[0]:
        return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    length = max(b["x"].shape[1] for b in batches)
    pad = lambda t: torch.nn.functional.pad(t, (0, length - t.shape[1]))
    return {"x": torch.cat([pad(b["x"]) for b in batches]), "x_mask": torch.cat([pad(b["x_mask"]) for b in batches]),
            "y": torch.cat([b["y"] for b in batches])}


def print_tables(results: dict) -> None:
    print("\n### Test accuracy (%) vs. fraction of states pruned, no retraining\n")
    header = "| task | model | method | " + " | ".join(f"{int(100 * r)}%" for r in RATIOS) + " |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for task, models in results.items():
        for name, r in models.items():
            for method, v in r["sweep"].items():
                accs = " | ".join(f"{a:.1f}" for _, a in v["points"])
                print(f"| {task} | {name} | {method} | {accs} |")
    print("\n### Largest fraction pruned before the accuracy drops by more than 1 point (change in points)\n")
    methods = list(dict.fromkeys(m for models in results.values() for r in models.values() for m in r["sweep"]))
    print("| task | model | unpruned acc | " + " | ".join(methods) + " | AIRE per-layer pruned % there |")
    print("|---|---|---|" + "---|" * (len(methods) + 1))
    summary = {m: [] for m in methods}
    for task, models in results.items():
        for name, r in models.items():
            cells = []
            for method in methods:
                if method not in r["sweep"]:
                    cells.append("-")
                    continue
                f, change = max_within(r["sweep"][method]["points"])
                summary[method].append((f, change))
                cells.append(f"{100 * f:.0f}% ({change:+.2f})")
            pts = r["sweep"]["aire"]["points"]
            idx = [p[0] for p in pts].index(max_within(pts)[0])
            layers = ", ".join(f"{100 * x:.0f}" for x in r["sweep"]["aire"]["layer_fractions"][idx])
            print(f"| {task} | {name} | {pts[0][1]:.2f} | " + " | ".join(cells) + f" | {layers} |")
    means = " | ".join(f"{100 * statistics.mean(f for f, _ in v):.1f}% ({statistics.mean(c for _, c in v):+.2f})"
                       for v in summary.values())
    print(f"| mean | | | {means} | |")
    print("\n### Speed: sliced AIRE-pruned model vs. unpruned (same run, same batch, CPU)\n")
    print("| task | model | states pruned | state MACs removed | dense seq/s | pruned seq/s | speed-up | train s |")
    print("|---|---|---|---|---|---|---|---|")
    for task, models in results.items():
        for name, r in models.items():
            s = r["speed"]
            print(f"| {task} | {name} | {100 * s['fraction']:.0f}% | {100 * s['state_macs_removed']:.0f}% | "
                  f"{s['dense_seq_per_s']:.0f} | {s['pruned_seq_per_s']:.0f} | "
                  f"{s['pruned_seq_per_s'] / s['dense_seq_per_s']:.2f}x | {r['train_seconds']:.0f} |")


if __name__ == "__main__":
    main()
