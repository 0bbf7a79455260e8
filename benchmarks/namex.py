"""NAMEx benchmark: the merging-FFN family on Fashion-MNIST (clean + zero-shot corruptions), Wikipedia LM perplexity and
topic accuracy, mean +- std over seeds; the paper's three claims; and the layers' forward+backward speed.

    .venv/bin/python benchmarks/namex.py            # full run (~10 min on 2 CPU cores), writes seeds/figures/namex_*.png
    .venv/bin/python benchmarks/namex.py --quick    # smoke run (tiny sizes, 1 seed)

Training uses the package's models and DataModules in a plain loop (same loss, optimizer and schedule as the
LightningModules) so that 7 variants x 3 seeds x 3 tasks fit the CPU budget; two worker processes, one thread each.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lit_iclr.core.figures import plt
from lit_iclr.core.stats import paired_ci
from lit_iclr.namex.ffn import MergeOptions, MergingFFN
from lit_iclr.namex.model import MoETextTransformer, MoEViT, aux_loss, contribution_spread
from lit_iclr.namex.module import FASHION_MEAN, FASHION_STD
from lit_iclr.namex.propagation import Chain

HERE, ROOT = Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]

BETA = dict(beta_abs=0.9, beta_phase=math.pi / 8)  # Lorraine et al.'s |beta|, arg(beta)
VARIANTS = {
    "dense": MergeOptions(mode="dense"),  # one FFN num_experts (4) times as wide: equal parameters, 4x the FFN compute
    # compute-matched: one FFN of a single expert's width, the per-token FFN work of every merging variant (one
    # merged expert per unit); fewer parameters
    "dense (one expert's width)": MergeOptions(mode="dense", num_experts=1),
    "smoe (top-2)": MergeOptions(mode="smoe", top_k=2),
    "smear": MergeOptions(mode="smear"),
    # curvature_rank 0 is M_i = I (Euclidean merging, what the table up to this label measured); rank 1 is CAMEx's
    # Kronecker curvature, identity at init (its curvature-on configuration)
    "camex (curvature off)": MergeOptions(mode="camex", curvature_rank=0),
    "camex (curvature on)": MergeOptions(mode="camex", curvature_rank=1),
    "ep-camex": MergeOptions(mode="ep_camex"),
    "namex (no momentum)": MergeOptions(mode="namex", beta_abs=0.0),
    "namex (complex momentum)": MergeOptions(mode="namex", **BETA),
}
# complex momentum's step size gamma and |beta| (arg(beta) = pi/8), swept on the image task (ranked by validation accuracy);
# "namex (complex momentum)" and "namex (no momentum)" above are its points gamma 0.5, |beta| 0.9 and 0
SWEEP = {f"namex (gamma {g}, |beta| {b})": MergeOptions(mode="namex", gamma=g, beta_abs=b, beta_phase=math.pi / 8)
         for g in (0.25, 0.5) for b in (0.0, 0.3, 0.6, 0.9) if (g, b) not in ((0.5, 0.0), (0.5, 0.9))}
ALL_VARIANTS = {**VARIANTS, **SWEEP}
FIG = ROOT / "seeds" / "figures"
OUT = ROOT / "benchmarks" / "out" / "namex"  # one JSON per (task, variant, seed): runs can be split and resumed
LEGACY = {"camex": "camex (curvature off)"}  # results stored before the label said that its curvature was off


def schedule(opt, total: int, warmup_frac: float = 0.05):
    warmup = max(int(warmup_frac * total), 1)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup))))


def train(net, batches, loss_fn, steps: int, lr: float, aux_coef: float = 1e-2) -> list[float]:
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.05)
    sched = schedule(opt, steps)
    losses = []
    net.train()
    for step in range(steps):
        loss = loss_fn(net, batches(step))
        opt.zero_grad(set_to_none=True)
        (loss + aux_coef * aux_loss(net)).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


# ------------------------------------------------------------------------------------------------------------- tasks
def image_task(variant: str, seed: int, cfg: dict) -> dict:
    from lit_iclr.namex.data import FashionMNISTData

    dm = FashionMNISTData(train_size=cfg["train_size"], val_size=500, test_size=cfg["test_size"],
                          corruptions=None, severities=cfg["severities"])
    dm.setup("fit")
    dm.setup("test")
    torch.manual_seed(seed)
    net = MoEViT(10, 28, 7, 1, cfg["dim"], cfg["depth"], 4, 2.0, 0.0, ALL_VARIANTS[variant])
    x, y = dm.train_set.images, dm.train_set.labels
    per_epoch = len(y) // cfg["batch"]
    g = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(len(y), generator=g) for _ in range(cfg["epochs"])])

    def batch(step):
        idx = order[step * cfg["batch"]: (step + 1) * cfg["batch"]]
        return (x[idx] - FASHION_MEAN) / FASHION_STD, y[idx]

    t0 = time.perf_counter()
    losses = train(net, batch, lambda n, b: F.cross_entropy(n(b[0]), b[1]), per_epoch * cfg["epochs"], 2e-3)
    seconds = time.perf_counter() - t0
    net.eval()
    acc = {}
    with torch.no_grad():
        val = dm.val_set  # model selection (the momentum sweep) reads this, never the test sets
        acc_val = float((net((val.images - FASHION_MEAN) / FASHION_STD).argmax(-1) == val.labels).float().mean())
        for name, ds in zip(dm.test_names, dm.test_sets, strict=True):
            logits = torch.cat([net((ds.images[i: i + 500] - FASHION_MEAN) / FASHION_STD)
                                for i in range(0, len(ds), 500)])
            acc[name] = float((logits.argmax(-1) == ds.labels).float().mean())
            if name == "clean":
                spread = contribution_spread(net)
    corrupted = [a for k, a in acc.items() if k != "clean"]
    return {"acc_val": acc_val, "acc_clean": acc["clean"], "acc_corrupted": float(np.mean(corrupted)), "per_corruption": acc,
            "losses": losses, "spread": spread, "train_s": seconds,
            "params": sum(p.numel() for p in net.parameters())}


def lm_task(variant: str, seed: int, cfg: dict) -> dict:
    from lit_iclr.core.corpus import CorpusDataModule

    dm = CorpusDataModule(data_dir=str(ROOT / "data"), seq_len=cfg["seq_len"], vocab_size=cfg["vocab"],
                          max_eval_blocks=cfg["eval_blocks"])
    dm.setup()
    train_blocks = dm.lm_dataset("train").blocks
    torch.manual_seed(seed)
    opts = VARIANTS[variant]
    opts = MergeOptions(**{**opts.__dict__, "segment": cfg["segment"]})
    net = MoETextTransformer(cfg["vocab"], 0, "lm", cfg["seq_len"], cfg["dim"], cfg["depth"], 4, 2.0, 0.0, opts)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(train_blocks), generator=g)

    def batch(step):
        return train_blocks[order[step * cfg["batch"]: (step + 1) * cfg["batch"]]]

    def lm_loss(n, ids):
        logits = n(ids)[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    losses = train(net, batch, lm_loss, cfg["lm_steps"], 2e-3)
    net.eval()
    with torch.no_grad():
        test = dm.lm_dataset("test", cfg["eval_blocks"]).blocks
        nll = float(np.mean([float(lm_loss(net, test[i: i + 50])) for i in range(0, len(test), 50)]))
    return {"ppl": math.exp(nll), "losses": losses, "params": sum(q.numel() for q in net.parameters())}


def topic_task(variant: str, seed: int, cfg: dict) -> dict:
    from lit_iclr.namex.data import CorpusTopicData

    dm = CorpusTopicData(data_dir=str(ROOT / "data"), seq_len=cfg["seq_len"], vocab_size=cfg["vocab"],
                         batch_size=32, train_per_class=cfg["per_class"], seed=seed)
    dm.setup()
    torch.manual_seed(seed)
    net = MoETextTransformer(cfg["vocab"], dm.num_topics, "topic", cfg["seq_len"], cfg["dim"], cfg["depth"], 4, 2.0,
                             0.1, VARIANTS[variant])
    train_batches = [b for _ in range(cfg["topic_epochs"]) for b in dm.train_dataloader()]
    loss = lambda n, b: F.cross_entropy(n(b["input_ids"], b["attention_mask"]), b["topic"])
    train(net, lambda s: train_batches[s], loss, len(train_batches), 2e-3)
    net.eval()
    hits = total = 0
    with torch.no_grad():
        for b in dm.test_dataloader():
            hits += int((net(b["input_ids"], b["attention_mask"]).argmax(-1) == b["topic"]).sum())
            total += len(b["topic"])
    return {"topic_acc": hits / total}


TASKS = {"image": image_task, "lm": lm_task, "topic": topic_task}


def job_file(task: str, variant: str, seed: int) -> Path:
    return OUT / f"{task}-{variant.replace(' ', '_').replace('(', '').replace(')', '')}-seed{seed}.json"


def run_job(job):
    torch.set_num_threads(1)
    task, variant, seed, cfg = job
    t0 = time.perf_counter()
    out = TASKS[task](variant, seed, cfg)
    out["seconds"] = time.perf_counter() - t0
    job_file(task, variant, seed).write_text(json.dumps({"task": task, "variant": variant, "seed": seed, **out}))
    return task, variant, seed, out


def load_results(tasks) -> dict:
    """Every stored job result of `tasks` (from this run and earlier ones): {task: {variant: {seed: result}}}."""
    results: dict = {}
    for f in sorted(OUT.glob("*.json")):
        r = json.loads(f.read_text())
        r["variant"] = LEGACY.get(r["variant"], r["variant"])
        if r["task"] in tasks and r["variant"] in ALL_VARIANTS:
            results.setdefault(r["task"], {}).setdefault(r["variant"], {})[r["seed"]] = r
    return results


# ------------------------------------------------------------------------------------------------------------- speed
def time_layers(reps: int, B=16, T=128, D=128, H=256, N=4) -> dict[str, float]:
    """Forward+backward seconds of a 2-layer stack of each FFN variant (2 layers so propagation is exercised)."""
    torch.set_num_threads(1)
    x = torch.randn(B, T, D, requires_grad=True)
    out = {}
    cases = {"dense (one expert's width)": MergeOptions(mode="dense", num_experts=1),
             "dense (4x width, equal params)": MergeOptions(mode="dense", num_experts=N), **VARIANTS}
    cases.pop("dense")
    for name, opts in cases.items():
        chain = Chain()
        layers = torch.nn.ModuleList(MergingFFN(D, H, options=opts, chain=chain) for _ in range(2))
        times = []
        for r in range(reps + 2):
            t0 = time.perf_counter()
            h = x
            for m in layers:
                h = h + m(h)
            h.square().mean().backward()
            if r >= 2:
                times.append(time.perf_counter() - t0)
        out[name] = float(np.median(times))
    return out


def steps_to_reach(losses: list[float], threshold: float, ema: float = 0.9) -> int:
    """First step whose exponential moving average of the training loss is <= threshold (len+1 if never)."""
    avg = None
    for i, loss in enumerate(losses):
        avg = loss if avg is None else ema * avg + (1 - ema) * loss
        if avg <= threshold:
            return i + 1
    return len(losses) + 1


def ema_curve(losses, ema=0.9):
    out, avg = [], None
    for loss in losses:
        avg = loss if avg is None else ema * avg + (1 - ema) * loss
        out.append(avg)
    return np.array(out)


def fmt(values, scale=1.0, digits=2):
    v = np.asarray(values, dtype=float) * scale
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}" if len(v) > 1 else f"{v.mean():.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (1 seed, a few steps)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--lm-seeds", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of variant names to run")
    ap.add_argument("--resume", action="store_true", help="skip jobs whose result is already in benchmarks/out/namex")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sweep", action="store_true", help="also run the momentum grid (image task) and print its table")
    ap.add_argument("--sweep-seeds", type=int, default=3)
    ap.add_argument("--no-speed", action="store_true", help="skip the layer timing table")
    ap.add_argument("--tasks", default="image,lm,topic", help="comma list of image, lm, topic (speed always runs)")
    args = ap.parse_args()
    cfg = dict(train_size=5000, test_size=1000, severities=[3], dim=48, depth=4, batch=64, epochs=2,
               seq_len=64, segment=16, vocab=2048, eval_blocks=200, lm_steps=150, per_class=100, topic_epochs=3)
    if args.quick:
        cfg.update(train_size=256, test_size=128, epochs=1, lm_steps=4, eval_blocks=8, per_class=4, topic_epochs=1)
        args.seeds = args.lm_seeds = 1
    tasks = [t for t in args.tasks.split(",") if t in TASKS]  # e.g. --tasks speed: only the timing table
    sep = ";" if ";" in args.variants else ","  # the sweep's names hold commas: list them with ";"
    variants = [v for v in args.variants.split(sep) if v in ALL_VARIANTS]
    if args.sweep:
        variants += [v for v in SWEEP if v not in variants]
    OUT.mkdir(parents=True, exist_ok=True)
    def n_seeds(t, v):
        return args.lm_seeds if t == "lm" else args.sweep_seeds if v in SWEEP else args.seeds

    jobs = [(t, v, s, cfg) for t in tasks for v in variants for s in range(n_seeds(t, v))
            if (t == "image" or v not in SWEEP) and not (args.resume and job_file(t, v, s).exists())]
    jobs.sort(key=lambda j: j[2])  # seed-major: every variant gets seed 0 before any gets seed 1
    if "lm" in tasks or "topic" in tasks:  # build the corpus cache once, before the workers race for it
        from lit_iclr.core.corpus import CorpusDataModule
        CorpusDataModule(data_dir=str(ROOT / "data"), seq_len=cfg["seq_len"], vocab_size=cfg["vocab"]).prepare_data()
    t0 = time.perf_counter()
    if jobs:
        with mp.get_context("spawn").Pool(max(1, min(args.workers, len(jobs)))) as pool:
            for task, variant, seed, out in pool.imap_unordered(run_job, jobs):
                print(f"  {task:5s} {variant:26s} seed {seed}: "
                      + ", ".join(f"{k}={v:.4f}" for k, v in out.items() if isinstance(v, float)), flush=True)
    wall = time.perf_counter() - t0
    results = load_results(args.tasks.split(","))
    speed = {} if args.no_speed else time_layers(3 if args.quick else 10)

    # ---- main table
    print(f"\n## Accuracy / perplexity (mean ± std over seeds; this invocation {wall / 60:.1f} min, "
          f"{args.workers} workers)\n")
    print("| variant | params (ViT) | clean acc % | corrupted acc % | LM test ppl | topic acc % |")
    print("|---|---|---|---|---|---|")
    for v in VARIANTS:
        img = results.get("image", {}).get(v, {})
        lm = results.get("lm", {}).get(v, {})
        top = results.get("topic", {}).get(v, {})
        cells = [f"{next(iter(img.values())).get('params', 0):,}" if img else "-",
                 fmt([r["acc_clean"] for r in img.values()], 100) if img else "-",
                 fmt([r["acc_corrupted"] for r in img.values()], 100) if img else "-",
                 fmt([r["ppl"] for r in lm.values()], 1, 1) if lm else "-",
                 fmt([r["topic_acc"] for r in top.values()], 100) if top else "-"]
        print(f"| {v} | " + " | ".join(cells) + " |")

    if "image" in results:
        headline(results["image"])
        if any(v in results["image"] for v in SWEEP):
            sweep_table(results["image"])
    if "lm" in results:
        lm_headline(results["lm"])

    # ---- claim (ii): complex momentum reaches a training loss in fewer steps
    print("\n## Steps to reach a training loss (EMA 0.9); threshold = loss NAMEx-without-momentum reaches at 50 % "
          "of training\n")
    print("| task | threshold | " + " | ".join(VARIANTS) + " |")
    print("|---|---|" + "---|" * len(VARIANTS))
    for task in ("image", "lm"):
        if task not in results:
            continue
        res = {v: {k: r for k, r in runs.items() if r.get("losses")} for v, runs in results[task].items()}
        ref = res.get("namex (no momentum)")
        if not ref:
            continue
        th = float(np.mean([ema_curve(r["losses"])[len(r["losses"]) // 2] for r in ref.values()]))
        row = [fmt([steps_to_reach(r["losses"], th) for r in res[v].values()], 1, 1) if res.get(v) else "-"
               for v in VARIANTS]
        print(f"| {task} | {th:.3f} | " + " | ".join(row) + " |")

    # ---- claim (iii): Nash weights balance the experts' contributions
    if "image" in results:
        print("\n## Expert-contribution spread (trained ViT, clean test images): CV across experts of "
              "||alpha_i tau_i|| (Nash) vs ||tau_i|| (uniform weights)\n")
        print("| variant | CV Nash | CV uniform |")
        print("|---|---|---|")
        for v in ("namex (no momentum)", "namex (complex momentum)"):
            sp = [r["spread"] for r in results["image"].get(v, {}).values() if r.get("spread")]
            if not sp:
                continue
            print(f"| {v} | {fmt([s[0] for s in sp], 1, 3)} | {fmt([s[1] for s in sp], 1, 3)} |")

    # ---- speed
    if speed:
        print("\n## Forward+backward of a 2-layer FFN stack (B=16, T=128, D=128, expert H=256, 4 experts; 1 thread)\n")
        ref_dense, ref_smoe = speed["dense (one expert's width)"], speed["smoe (top-2)"]
        print("| layer | ms | / dense (one expert) | / SMoE top-2 |")
        print("|---|---|---|---|")
        for name, s in speed.items():
            print(f"| {name} | {s * 1e3:.1f} | {s / ref_dense:.2f} | {s / ref_smoe:.2f} |")

    if not args.quick:
        plot(results, cfg)


HEADLINE = "namex (no momentum)"


def headline(img: dict) -> None:
    """NAMEx minus each baseline, per seed, on clean and corrupted accuracy: paired 95% t intervals."""
    print(f"\n## Paired differences, {HEADLINE} minus baseline (accuracy points, 95% CI over the seeds both ran)\n")
    print("| baseline | seeds | Δ clean acc | Δ corrupted acc |")
    print("|---|---|---|---|")
    ref = img.get(HEADLINE, {})
    for v in [v for v in VARIANTS if v != HEADLINE] + [v for v in SWEEP if v in img]:
        common = sorted(set(ref) & set(img.get(v, {})))
        if len(common) < 2:
            continue
        cells = [str(paired_ci([100 * ref[s][k] for s in common], [100 * img[v][s][k] for s in common]))
                 for k in ("acc_clean", "acc_corrupted")]
        print(f"| {v} | {len(common)} | " + " | ".join(cells) + " |")


def lm_headline(lm: dict) -> None:
    """NAMEx minus each variant on LM test perplexity, per seed: paired 95% t intervals (negative = NAMEx better)."""
    print(f"\n## Paired differences, {HEADLINE} minus variant (LM test perplexity, 95% CI over the seeds both ran)\n")
    print("| variant | seeds | Δ test ppl |")
    print("|---|---|---|")
    ref = lm.get(HEADLINE, {})
    for v in [v for v in VARIANTS if v != HEADLINE]:
        common = sorted(set(ref) & set(lm.get(v, {})))
        if len(common) >= 2:
            print(f"| {v} | {len(common)} | {paired_ci([ref[s]['ppl'] for s in common], [lm[v][s]['ppl'] for s in common])} |")


def sweep_table(img: dict) -> None:
    """Complex momentum's gamma and |beta| (arg pi/8), ranked by seed-0 validation accuracy (every point ran seed 0;
    model selection reads the validation images only)."""
    grid = {"namex (no momentum)": VARIANTS["namex (no momentum)"],
            "namex (complex momentum)": VARIANTS["namex (complex momentum)"], **SWEEP}
    rows = []
    for v, o in grid.items():
        runs = img.get(v, {})
        if 0 in runs and "acc_val" in runs[0]:
            acc = {k: [100 * r[k] for r in runs.values() if k in r] for k in ("acc_val", "acc_clean", "acc_corrupted")}
            rows.append((100 * runs[0]["acc_val"], v, o, acc, len(runs)))
    print("\n## Momentum sweep (image task; ranked by seed-0 validation accuracy, 500 held-out training images)\n")
    print("| variant | gamma | abs(beta) | val acc % (seed 0) | seeds | val acc % | clean acc % | corrupted acc % |")
    print("|---|---|---|---|---|---|---|---|")
    for val0, v, o, acc, n in sorted(rows, key=lambda r: -r[0]):
        print(f"| {v} | {o.gamma} | {o.beta_abs} | {val0:.1f} | {n} | " + " | ".join(
            fmt(acc[k]) if acc[k] else "-" for k in ("acc_val", "acc_clean", "acc_corrupted")) + " |")


def plot(results, cfg):
    """Training-loss curves of the propagating variants and per-corruption accuracy (runs that stored them)."""
    FIG.mkdir(parents=True, exist_ok=True)
    tasks = [t for t in ("image", "lm") if any(r.get("losses") for v in results.get(t, {}).values()
                                                 for r in v.values())]
    if tasks:
        fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.2), squeeze=False)
        for ax, task in zip(axes[0], tasks, strict=True):
            for v in ("ep-camex", "namex (no momentum)", "namex (complex momentum)"):
                runs = [r for r in results[task].get(v, {}).values() if r.get("losses")]
                if runs:
                    ax.plot(np.stack([ema_curve(r["losses"]) for r in runs]).mean(0), label=f"{v} (n={len(runs)})")
            ax.set(xlabel="step", ylabel="training loss (EMA 0.9)", title=f"{task}: propagation and momentum")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(FIG / "namex_momentum.png", dpi=90)
        plt.close(fig)
    runs = {v: [r for r in results.get("image", {}).get(v, {}).values() if r.get("per_corruption")] for v in VARIANTS}
    runs = {v: r for v, r in runs.items() if r}
    if runs:
        names = list(next(iter(runs.values()))[0]["per_corruption"])
        fig, ax = plt.subplots(figsize=(9, 3.2))
        width = 0.8 / len(runs)
        for j, (v, rs) in enumerate(runs.items()):
            acc = np.array([[r["per_corruption"][n] for n in names] for r in rs]).mean(0)
            ax.bar(np.arange(len(names)) + j * width, acc * 100, width, label=f"{v} (n={len(rs)})")
        ax.set_xticks(np.arange(len(names)) + 0.4, names, rotation=30, fontsize=7)
        ax.set(ylabel="accuracy %", title=f"Fashion-MNIST, zero-shot corruptions (severity {cfg['severities']})")
        ax.legend(fontsize=6, ncol=4)
        fig.tight_layout()
        fig.savefig(FIG / "namex_corruptions.png", dpi=90)
        plt.close(fig)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
