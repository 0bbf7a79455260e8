"""HEAPr vs baselines on the default Qwen2-MoE LM (offline Wikipedia), cost vs width, pruned vs dense throughput.

    .venv/bin/python benchmarks/heapr.py [--ckpt runs/heapr/<stamp>/checkpoints/last.ckpt] [--quick]

1. A dense model: the `fit` checkpoint given by --ckpt, or trained here with the default config's sizes (cached in
   benchmarks/out/heapr/dense.pt).
2. One calibration pass on the held-out `calib` split (gradients for HEAPr, block inputs for NAEE), shared by all
   methods; then for every ratio and method: prune a copy, measure test perplexity, zero-shot 12-way topic accuracy,
   routed-expert FLOPs per token.
3. Cost: calibration time, Fisher-state bytes and peak process memory vs model width d (fresh process per d).
4. Throughput: dense vs pruned forward tokens/s, the same code path, measured in this run.
Prints markdown tables; writes benchmarks/out/heapr/results.json and the figures seeds/figures/heapr_*.png.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from lit_iclr.core.corpus import CorpusDataModule
from lit_iclr.core.moe import unfuse_experts
from lit_iclr.heapr.calibrate import calibrate, lm_loss_sum
from lit_iclr.heapr.evaluate import perplexity, tokens_per_second, topic_accuracy
from lit_iclr.heapr.model import build_moe_lm
from lit_iclr.heapr.prune import prune_model

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "benchmarks" / "out" / "heapr"
FIG = ROOT / "seeds" / "figures"
SIZES = dict(arch="qwen2_moe", vocab_size=2048, hidden_size=96, num_layers=4, num_heads=4, num_kv_heads=2,
             num_experts=8, top_k=2, expert_width=48, shared_width=96, max_positions=512)
METHODS = [("heapr", "per_token"), ("heapr", "frequency"), ("wanda", "per_token"), ("magnitude", "per_token"),
           ("random", "per_token"), ("frequency", "per_token"), ("naee", "per_token")]


def label(method: str, averaging: str) -> str:
    names = {"heapr": "HEAPr", "wanda": "Wanda-like E[h^2]|w|^2", "magnitude": "magnitude", "random": "random atoms",
             "frequency": "expert drop (frequency)", "naee": "expert drop (NAEE)"}
    return names[method] + (" (freq.-weighted)" if averaging == "frequency" else "")


def train_dense(dm, steps: int, log) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_moe_lm(**SIZES)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / 30, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / steps, 1)))))
    model.train()
    it, t0 = iter(dm.train_dataloader()), time.perf_counter()
    for step in range(steps):
        try:
            b = next(it)
        except StopIteration:
            it = iter(dm.train_dataloader())
            b = next(it)
        out = model(input_ids=b["input_ids"], output_router_logits=True)
        nll, n = lm_loss_sum(out.logits, b["labels"])
        (nll / n + 0.01 * out.aux_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 50 == 0:
            log(f"  train step {step}/{steps} loss {float(nll / n):.3f} ({time.perf_counter() - t0:.0f}s)")
    return model.eval()


def load_dense(args, dm, log) -> torch.nn.Module:
    if args.ckpt:
        state = torch.load(args.ckpt, map_location="cpu", weights_only=True)["state_dict"]
        model = build_moe_lm(**SIZES)
        model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
        return model.eval()
    cache = OUT / f"dense-{args.train_steps}.pt"
    if cache.exists():
        model = build_moe_lm(**SIZES)
        model.load_state_dict(torch.load(cache, weights_only=True))
        return model.eval()
    model = train_dense(dm, args.train_steps, log)
    torch.save(model.state_dict(), cache)
    return model


def quality(args, dm, log) -> tuple[list[dict], dict]:
    dense = unfuse_experts(load_dense(args, dm, log))
    test = dm.test_dataloader()
    topics = dm.topic_choice_dataloader("test", per_class=args.topic_docs)
    t0 = time.perf_counter()
    base = {"ppl": perplexity(dense, test), "acc": topic_accuracy(dense, topics)}
    log(f"dense: ppl {base['ppl']:.2f} acc {base['acc']:.3f} ({time.perf_counter() - t0:.0f}s)")
    calib = calibrate(copy.deepcopy(dense), dm.calibration_dataloader(args.calib_sequences), with_gradients=True,
                      collect_inputs=True)
    log(f"calibration: {calib.tokens} tokens, {calib.seconds:.1f}s, loss {calib.loss:.3f}")
    rows = []
    for ratio in args.ratios:
        for method, averaging in METHODS:
            model = copy.deepcopy(dense)
            rep, _ = prune_model(model, None, ratio, method, averaging, calib=calib)
            row = {"method": method, "averaging": averaging, "ratio": ratio, "achieved": rep.achieved_ratio,
                   "ppl": perplexity(model, test), "acc": topic_accuracy(model, topics),
                   "flops": rep.expert_flops_after / rep.expert_flops_before,
                   "params": rep.params_after / rep.params_before}
            rows.append(row)
            log(f"  {ratio:.2f} {label(method, averaging):34s} ppl {row['ppl']:8.2f} acc {row['acc']:.3f} "
                f"achieved {row['achieved']:.3f} flops {row['flops']:.3f}")
    return rows, {"dense": base, "calib_tokens": calib.tokens}


def cost_worker(d: int, state: str) -> None:
    """Child process: calibration of a random model of width d; prints JSON (time, state bytes, peak RSS growth)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_moe_lm(**{**SIZES, "hidden_size": d, "num_layers": 2, "num_heads": max(d // 32, 1),
                            "num_kv_heads": max(d // 64, 1), "shared_width": d})
    ids = torch.randint(0, 2048, (16, 128), generator=torch.Generator().manual_seed(0))
    batches = [{"input_ids": ids[i: i + 4], "labels": ids[i: i + 4]} for i in range(0, 16, 4)]
    unfuse_experts(model)
    rss0 = _rss_mb()
    calib = calibrate(model, batches, fisher_state=state)
    print(json.dumps({"d": d, "state": state, "seconds": calib.seconds, "state_bytes": calib.state_bytes(),
                      "rss_growth_mb": _rss_mb() - rss0}))  # memory still held while the statistics are alive


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cost(widths: list[int], log) -> list[dict]:
    rows = []
    for d in widths:
        for state in ("full", "atom"):
            out = subprocess.run([sys.executable, __file__, "--cost-worker", str(d), state], capture_output=True,
                                 text=True, check=True).stdout.strip().splitlines()[-1]
            rows.append(json.loads(out))
            log(f"  d={d} {state}: {rows[-1]}")
    return rows


def throughput(args, dm, log) -> list[dict]:
    dense = unfuse_experts(load_dense(args, dm, log))
    ids = next(iter(dm.test_dataloader()))["input_ids"][:8]
    calib_loader = dm.calibration_dataloader(args.calib_sequences)
    calib = calibrate(copy.deepcopy(dense), calib_loader, with_gradients=True)
    fused = load_dense(args, dm, log)
    rows = [{"model": "dense (HF fused experts, eager)", "tok_s": tokens_per_second(fused, ids, args.repeats),
             "flops": 1.0},
            {"model": "dense (per-expert modules)", "tok_s": tokens_per_second(dense, ids, args.repeats), "flops": 1.0}]
    for ratio in (0.25, 0.5):
        model = copy.deepcopy(dense)
        rep, _ = prune_model(model, None, ratio, "heapr", calib=calib)
        rows.append({"model": f"HEAPr {int(ratio * 100)} % (per-expert modules)",
                     "tok_s": tokens_per_second(model, ids, args.repeats),
                     "flops": rep.expert_flops_after / rep.expert_flops_before})
    for r in rows:
        r["speedup"] = r["tok_s"] / rows[1]["tok_s"]
        log(f"  {r['model']:38s} {r['tok_s']:9.0f} tok/s  x{r['speedup']:.2f}  routed FLOPs {r['flops']:.2f}")
    return rows


def figures(rows: list[dict], base: dict, cost_rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIG.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for method, averaging in METHODS:
        sel = sorted((r for r in rows if r["method"] == method and r["averaging"] == averaging),
                     key=lambda r: r["achieved"])
        xs = [0.0] + [r["achieved"] for r in sel]
        style = "-o" if method == "heapr" else "--."
        axes[0].plot(xs, [base["ppl"]] + [r["ppl"] for r in sel], style, label=label(method, averaging))
        axes[1].plot(xs, [base["acc"]] + [r["acc"] for r in sel], style, label=label(method, averaging))
    axes[0].set_yscale("log")
    axes[0].set_ylabel("test perplexity")
    axes[1].set_ylabel("zero-shot topic accuracy (12-way)")
    for ax in axes:
        ax.set_xlabel("fraction of routed-expert parameters removed")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(FIG / "heapr_curves.png", dpi=90)
    plt.close(fig)
    if cost_rows:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        for state in ("full", "atom"):
            sel = [r for r in cost_rows if r["state"] == state]
            name = "d x d Fisher (paper)" if state == "full" else "per-atom (same scores)"
            axes[0].loglog([r["d"] for r in sel], [r["state_bytes"] / 2**20 for r in sel], "-o", label=name)
            axes[1].plot([r["d"] for r in sel], [r["seconds"] for r in sel], "-o", label=name)
        axes[0].set_ylabel("calibration state (MiB)")
        axes[1].set_ylabel("calibration time (s)")
        for ax in axes:
            ax.set_xlabel("model width d")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(FIG / "heapr_cost.png", dpi=90)
        plt.close(fig)


def tables(rows, base, cost_rows, speed) -> str:
    lines = ["| method | " + " | ".join(f"{r:.0%}" for r in sorted({r['ratio'] for r in rows})) + " |",
             "|---|" + "---:|" * len({r["ratio"] for r in rows})]
    ratios = sorted({r["ratio"] for r in rows})
    lines.insert(0, f"Dense: test perplexity {base['ppl']:.2f}, zero-shot topic accuracy {base['acc']:.3f}. "
                    "Cells: perplexity / accuracy (achieved removed fraction if different).\n")
    for method, averaging in METHODS:
        cells = []
        for ratio in ratios:
            r = next(x for x in rows if x["method"] == method and x["averaging"] == averaging and x["ratio"] == ratio)
            extra = f" ({r['achieved']:.0%})" if abs(r["achieved"] - ratio) > 0.01 else ""
            cells.append(f"{r['ppl']:.2f} / {r['acc']:.2f}{extra}")
        lines.append(f"| {label(method, averaging)} | " + " | ".join(cells) + " |")
    lines.append("\nRouted-expert FLOPs per token after HEAPr (fraction of dense): " + ", ".join(
        f"{r['ratio']:.0%}: {r['flops']:.2f}" for r in rows if r["method"] == "heapr" and r["averaging"] == "per_token"))
    if cost_rows:
        lines += ["", "| d | state | Fisher state (MiB) | calibration (s) | RSS growth (MiB) |", "|---:|---|---:|---:|---:|"]
        lines += [f"| {r['d']} | {r['state']} | {r['state_bytes'] / 2**20:.2f} | {r['seconds']:.2f} | "
                  f"{r['rss_growth_mb']:.0f} |" for r in cost_rows]
    if speed:
        lines += ["", "| model | tokens/s | vs dense | routed FLOPs |", "|---|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['tok_s']:.0f} | x{r['speedup']:.2f} | {r['flops']:.2f} |" for r in speed]
    return "\n".join(lines)


def report() -> None:
    """Merge every results*.json of full runs (same dense model), draw the figures and print the tables."""
    runs = [json.loads(f.read_text()) for f in sorted(OUT.glob("results*.json")) if "quick" not in f.name]
    rows = [r for run in runs for r in run["rows"]]
    cost_rows = [c for run in runs for c in run["cost"]]
    speed = [s for run in runs for s in run["speed"]]
    figures(rows, runs[0]["dense"], cost_rows)
    print(tables(rows, runs[0]["dense"], cost_rows, speed))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", default=None, help="a `fit` checkpoint of configs/heapr.yaml (default: train here)")
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.1, 0.2, 0.25, 0.3, 0.4, 0.5])
    p.add_argument("--calib-sequences", type=int, default=128)
    p.add_argument("--eval-blocks", type=int, default=96)
    p.add_argument("--topic-docs", type=int, default=6)
    p.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 512])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="smoke run: few steps, two ratios, small evaluation")
    p.add_argument("--only-quality", action="store_true", help="skip the cost and throughput parts")
    p.add_argument("--tag", default="", help="suffix of the results file (results<tag>.json)")
    p.add_argument("--report", action="store_true", help="merge results*.json, draw the figures, print the tables")
    p.add_argument("--cost-worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cost_worker:
        cost_worker(int(args.cost_worker[0]), args.cost_worker[1])
        return
    if args.report:
        report()
        return
    torch.set_num_threads(1)
    if args.quick:
        args.train_steps, args.ratios, args.calib_sequences, args.eval_blocks = 20, [0.25, 0.5], 8, 8
        args.topic_docs, args.widths, args.repeats = 1, [32, 64], 1
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)

    dm = CorpusDataModule(data_dir=str(ROOT / "data"), batch_size=8, seq_len=128, vocab_size=2048,
                          max_eval_blocks=args.eval_blocks)
    dm.prepare_data()
    dm.setup("fit")
    rows, info = quality(args, dm, log)
    cost_rows, speed = [], []
    if not args.only_quality:
        log("cost vs width")
        cost_rows = cost(args.widths, log)
        log("throughput")
        speed = throughput(args, dm, log)
    results = {"args": vars(args), "dense": info["dense"], "rows": rows, "cost": cost_rows, "speed": speed}
    (OUT / ("results-quick.json" if args.quick else f"results{args.tag}.json")).write_text(json.dumps(results, indent=1))
    if not args.quick:
        figures(rows, info["dense"], cost_rows)
    print(tables(rows, info["dense"], cost_rows, speed))
    log("done")


if __name__ == "__main__":
    main()
