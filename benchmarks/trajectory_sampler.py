"""Trajectory sampler benchmark: annealing across training checkpoints vs final-model MCMC, temperature annealing and
parallel tempering at the same evaluation budget (K checkpoints x m steps per chain), on the default tasks.

    .venv/bin/python benchmarks/trajectory_sampler.py                 # 5 seeds, every task (~1 h on 2 heavily shared cores)
    .venv/bin/python benchmarks/trajectory_sampler.py --quick          # smoke run: 1 seed, short fits
    .venv/bin/python benchmarks/trajectory_sampler.py --jobs 2         # seeds in 2 processes (1 thread each)
    .venv/bin/python benchmarks/trajectory_sampler.py --tasks modes    # one task; per-seed results land in the out folder
    .venv/bin/python benchmarks/trajectory_sampler.py --report         # tables from the per-seed result files

Per seed the predictor is fitted with Lightning and `ModelCheckpoint(save_top_k=-1, every_n_train_steps)`; the folder
is read back with `load_trajectory` (the sampler's own loader). Tasks:
- boolean16: n = 16 rugged + deceptive needle; TV of the chains' end states to the exact target exp(beta f_final)
  (2^16 states enumerated; "floor" = TV of as many exact i.i.d. draws), needle rate, hit rate, evaluations to first hit.
- needle: boolean16 with the training data's share of needle positives swept (`--needle-fractions`, 0 = uniform
  inputs, where the needle appears by chance 2^-8 of the time): where trajectory annealing wins and where it loses.
- boolean32: n = 32, hit rate and time to first hit of the needle.
- modes: 2-D ring of 8 sharp Gaussians regressed by an MLP, MALA; modes covered, chains in a mode, mode-histogram TV.
- dna: PWM motifs + epistatic pairs on one-hot DNA (L = 24), GWG; best and mean true affinity of the designs.
- counterfactual: binarised Fashion-MNIST CNN (one fit; the 5 seeds vary the chains), ankle boot -> sneaker, edit
  budget 60 pixels; success rate and edited pixels.
- walsh: n = 12 landscape, fraction of each Walsh degree's energy recovered by every checkpoint (figure).
- speed: chain-steps/s of one GWG / MALA step on a chain batch, relative to one value-and-gradient evaluation.
Prints markdown tables and writes benchmarks/out/trajectory_sampler/{<tag>.json,walsh.png}.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_iclr.core.stats import paired_ci as core_paired_ci
from lit_iclr.trajectory_sampler import (
    BooleanLandscapeData,
    FashionMNISTCounterfactualData,
    ImageClassifier,
    LandscapePredictor,
    PointLandscapeData,
    SequenceAffinityData,
)
from lit_iclr.trajectory_sampler.annealing import SAMPLERS, Kernel, sample
from lit_iclr.trajectory_sampler.data import mode_stats
from lit_iclr.trajectory_sampler.landscapes import all_binary
from lit_iclr.trajectory_sampler.mcmc import init_state
from lit_iclr.trajectory_sampler.trajectory import as_score, load_trajectory
from lit_iclr.trajectory_sampler.walsh import recovered_per_degree

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out" / "trajectory_sampler"
DATA = ROOT / "data"


def fit(model, dm, steps: int, every: int, seed: int, folder: Path):
    """Fit with Lightning, keeping every `every`-th step's checkpoint; return the loaded (steps, models) trajectory."""
    L.seed_everything(seed, verbose=False)
    ck = ModelCheckpoint(dirpath=folder, every_n_train_steps=every, save_top_k=-1, filename="{step:05d}")
    trainer = L.Trainer(max_steps=steps, logger=False, callbacks=[ck], enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", devices=1, limit_val_batches=0, num_sanity_val_steps=0)
    t = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    fit_s = time.perf_counter() - t
    return (*load_trajectory(folder), fit_s)


def bits_score(f, penalty=None):
    """A score on bits as a score on one-hot chains (C, n, 2), minus an optional penalty on the chains."""
    if penalty is None:
        return lambda x: f(x[..., 1])
    return lambda x: f(x[..., 1]) - penalty(x)


def onehot_bits(x):
    return F.one_hot(x.long(), 2).float()


def run_methods(scores, x0, beta, m, kernel, seed, hit=None, groups=1, **kw):
    out = {}
    for method in SAMPLERS:
        g = torch.Generator().manual_seed(1000 + seed)
        t = time.perf_counter()
        state, trace = sample(method, scores, x0, beta, m, kernel, hit=hit, groups=groups, generator=g, **kw)
        out[method] = (state, trace, time.perf_counter() - t)
    return out


def task_boolean(seed, args, n, tmp, needle_fraction=0.2):
    dm = BooleanLandscapeData(data_dir=str(DATA), n_bits=n, num_samples=args.samples * (n // 16), batch_size=128,
                              needle_fraction=needle_fraction)
    dm.prepare_data()
    dm.setup("fit")
    f = dm.landscape()
    model = LandscapePredictor(input_dim=n, hidden=128, depth=2)
    steps, models, fit_s = fit(model, dm, args.steps, args.steps // args.K, seed, tmp / f"bool{n}-{needle_fraction}")
    scores = [bits_score(as_score(mm)) for mm in models]
    g = torch.Generator().manual_seed(seed)
    x0 = onehot_bits(torch.randint(0, 2, (args.chains, n), generator=g))
    res = run_methods(scores, x0, args.beta, args.m, Kernel("gwg"), seed, hit=lambda x: f.in_needle(x[..., 1]),
                      beta_min=0.1)
    rows = {}
    if n <= 16:
        X = all_binary(n)
        with torch.no_grad():
            pi = torch.softmax(args.beta * models[-1](X), 0)
            pi_true = torch.softmax(args.beta * f(X), 0)
        floor = tv_counts(torch.multinomial(pi, args.chains, replacement=True, generator=g), pi)
        needle_mass = float(pi[f.in_needle(X)].sum())  # the exact target's mass on the needle
        start_tv = tv_counts((x0[..., 1].long() << torch.arange(n)).sum(-1), pi)  # the uniform start states' TV
    for method, (state, trace, secs) in res.items():
        x = state.x[..., 1]
        hit = trace.first_hit >= 0
        r = {"needle_rate": float(f.in_needle(x).float().mean()), "hit_rate": float(hit.float().mean()),
             "first_hit_median": float(trace.first_hit[hit].float().median()) if hit.any() else float("nan"),
             "acceptance": trace.accepted, "evaluations": trace.evaluations, "seconds": secs}
        if n <= 16:
            idx = (x.long() << torch.arange(n)).sum(-1)
            r["tv"] = tv_counts(idx, pi)
            r["tv_true"] = tv_counts(idx, pi_true)
            r["tv_floor"] = floor
            r["target_needle_mass"] = needle_mass
            r["tv_start"] = start_tv
        rows[method] = r
    return {"rows": rows, "fit_s": fit_s, "checkpoints": len(steps)}


def tv_counts(idx, pi):
    p = torch.bincount(idx, minlength=len(pi)).float() / len(idx)
    return 0.5 * float((p - pi).abs().sum())


def task_modes(seed, args, tmp):
    dm = PointLandscapeData(data_dir=str(DATA), batch_size=128)
    dm.prepare_data()
    dm.setup("fit")
    f = dm.landscape()
    model = LandscapePredictor(input_dim=2, hidden=128, depth=3, activation="silu")
    steps, models, fit_s = fit(model, dm, int(1.5 * args.steps), int(1.5 * args.steps) // args.K, seed, tmp / "modes")
    scores = [as_score(mm) for mm in models]
    x0 = torch.randn(args.chains, 2, generator=torch.Generator().manual_seed(seed))
    res = run_methods(scores, x0, 1.0, args.m, Kernel("mala", step_size=args.step_size), seed, beta_min=0.1)
    rows = {m: {**mode_stats(f, st.x), "acceptance": tr.accepted, "evaluations": tr.evaluations, "seconds": s}
            for m, (st, tr, s) in res.items()}
    return {"rows": rows, "fit_s": fit_s, "checkpoints": len(steps)}


def task_dna(seed, args, tmp):
    dm = SequenceAffinityData(data_dir=str(DATA), batch_size=128, num_samples=args.samples)
    dm.prepare_data()
    dm.setup("fit")
    f = dm.landscape()
    model = LandscapePredictor(input_dim=dm.input_dim, hidden=128, depth=2)
    steps, models, fit_s = fit(model, dm, args.steps, args.steps // args.K, seed, tmp / "dna")
    scores = [as_score(mm) for mm in models]
    x0 = dm.chain_starts(torch.Generator().manual_seed(seed))[: args.chains // 2]
    res = run_methods(scores, x0, 2.0, args.m, Kernel("gwg"), seed, beta_min=0.1)
    rows = {}
    for m, (st, tr, s) in res.items():
        y = f(st.x)
        rows[m] = {"true_best": float(y.max()), "true_mean": float(y.mean()),
                   "unique": int(len(torch.unique(st.x.argmax(-1), dim=0))), "acceptance": tr.accepted,
                   "evaluations": tr.evaluations, "seconds": s}
    rows["training data"] = {"true_best": float(dm.y.max()), "true_mean": float(dm.y.mean())}
    return {"rows": rows, "fit_s": fit_s, "checkpoints": len(steps)}


def counterfactual_trajectory(args, tmp):
    dm = FashionMNISTCounterfactualData(max_train=args.cf_train, num_queries=args.cf_queries)
    dm.setup("fit")
    model = ImageClassifier(width=16, optimizer=lambda p: torch.optim.Adam(p, lr=2e-3))
    steps, models, fit_s = fit(model, dm, args.cf_steps, args.cf_steps // args.K, 0, tmp / "cf")
    with torch.no_grad():
        acc = float((models[-1](dm.val[0]).argmax(-1) == dm.val[1]).float().mean())
    return dm, steps, models, fit_s, acc


def task_counterfactual(seed, args, cf):
    dm, steps, models, fit_s, acc = cf
    R, budget, lam = args.cf_chains, args.cf_budget, args.cf_penalty
    ref = onehot_bits(dm.queries.repeat_interleave(R, 0))
    target = torch.full((len(ref),), dm.target_class)

    def allowed(x):
        changed = (x != ref).any(-1)
        full = changed.sum(-1) >= budget
        return ~(full[:, None] & ~changed)[..., None].expand_as(x)

    edits = lambda x: (x != ref).any(-1).sum(-1).float()
    scores = [bits_score(as_score(mm, target), lambda x: lam * edits(x)) for mm in models]
    res = run_methods(scores, ref.clone(), args.cf_beta, args.cf_m, Kernel("gwg", allowed=allowed), seed,
                      groups=len(dm.queries), beta_min=0.1)
    rows = {}
    for m, (st, tr, s) in res.items():
        with torch.no_grad():
            pred = models[-1](st.x[..., 1]).argmax(-1)
        ok = pred == target
        e = edits(st.x)
        per_query = ok.reshape(-1, R).any(-1).float().mean()
        rows[m] = {"success": float(ok.float().mean()), "queries_solved": float(per_query),
                   "edits_success": float(e[ok].mean()) if ok.any() else float("nan"), "acceptance": tr.accepted,
                   "evaluations": tr.evaluations, "seconds": s}
    return {"rows": rows, "fit_s": fit_s, "checkpoints": len(steps), "val_acc": acc}


def task_walsh(args, tmp):
    n = 12
    # uniform inputs (the Walsh expansion's measure); a strong order-6 needle puts energy in every degree up to 6
    dm = BooleanLandscapeData(data_dir=str(DATA), n_bits=n, needle_size=6, needle_height=40.0, deception=0.0,
                              num_samples=4096, needle_fraction=0.0, batch_size=128)
    dm.prepare_data()
    dm.setup("fit")
    f = dm.landscape()
    model = LandscapePredictor(input_dim=n, hidden=128, depth=2)
    steps, models, _ = fit(model, dm, args.steps, max(args.steps // 40, 1), 0, tmp / "walsh")
    X = all_binary(n)
    with torch.no_grad():
        target = f(X).double()
        rec = torch.stack([recovered_per_degree(mm(X).double(), target) for mm in models])  # (T, n+1)
    return steps, rec


def speed(args):
    n, C = 16, args.chains
    model = LandscapePredictor(input_dim=n, hidden=128, depth=2).net.requires_grad_(False)
    f = lambda x: model(x[..., 1])
    x = onehot_bits(torch.randint(0, 2, (C, n)))
    out = {}
    mlp2 = LandscapePredictor(input_dim=2, hidden=128, depth=3, activation="silu").net.requires_grad_(False)
    for name, kernel, x0, fn in [("GWG (n=16 bits)", Kernel("gwg"), x, f),
                                 ("MALA (2-D)", Kernel("mala", step_size=0.05), torch.randn(C, 2), mlp2)]:
        st = init_state(fn, x0)
        t = time.perf_counter()
        reps = 0
        while time.perf_counter() - t < 2.0:
            init_state(fn, x0)
            reps += 1
        eval_s = (time.perf_counter() - t) / reps
        t = time.perf_counter()
        steps = 0
        while time.perf_counter() - t < 3.0:
            st, _ = kernel(st, fn)
            steps += 1
        step_s = (time.perf_counter() - t) / steps
        out[name] = {"chain_steps_per_s": C / step_s, "step_over_eval": step_s / eval_s}
    return out


def one_seed(seed: int, args_dict: dict) -> dict:
    torch.set_num_threads(1)
    args = argparse.Namespace(**args_dict)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for task in args.tasks:
            t = time.perf_counter()
            if task == "boolean16":
                out[task] = task_boolean(seed, args, 16, tmp)
            elif task == "boolean32":
                out[task] = task_boolean(seed, args, 32, tmp)
            elif task == "modes":
                out[task] = task_modes(seed, args, tmp)
            elif task == "needle":  # the training data's share of needle positives, swept
                for frac in args.needle_fractions:
                    key = f"needle{frac:g}"
                    out[key] = task_boolean(seed, args, 16, tmp, needle_fraction=frac)
                    (OUT / f"seed{seed}-{key}.json").write_text(json.dumps(out[key]))
                    print(f"  seed {seed} {key}: " + json.dumps({m: round(r["tv"], 3) for m, r in out[key]["rows"].items()}),
                          flush=True)
                continue
            elif task == "dna":
                out[task] = task_dna(seed, args, tmp)
            else:
                continue
            (OUT / f"seed{seed}-{task}.json").write_text(json.dumps(out[task]))  # kept even if a later task is cut short
            print(f"  seed {seed} {task}: {time.perf_counter() - t:.0f}s " + json.dumps(
                {m: {k: round(v, 3) for k, v in r.items() if k in ("tv", "hit_rate", "modes_covered", "true_best")}
                 for m, r in out[task]["rows"].items()}), flush=True)
    return out


def fmt(vals):
    vals = [v for v in vals if v == v]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.3g}"
    return f"{statistics.mean(vals):.3g} ± {statistics.stdev(vals):.2g}"


def paired_ci(a, b) -> str:
    ci = core_paired_ci(a, b, finite_only=True)
    return "n/a" if ci.n < 2 else str(ci)


def table(results, task, cols, headline):
    seeds = sorted(s for s in results if task in results[s])
    methods = list(results[seeds[0]][task]["rows"])
    print(f"\n### {task}\n\n| sampler | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for m in methods:
        cells = [fmt([results[s][task]["rows"][m].get(c, float("nan")) for s in seeds]) for c in cols]
        print(f"| {m} | " + " | ".join(cells) + " |")
    print()
    for m in methods:
        if m in ("trajectory", "training data"):
            continue
        a = [results[s][task]["rows"]["trajectory"][headline] for s in seeds]
        b = [results[s][task]["rows"][m][headline] for s in seeds]
        print(f"- {headline}, trajectory - {m}: {paired_ci(a, b)} (paired over {len(seeds)} seeds, 95% t-CI)")


def needle_table(results, fractions):
    """TV to the exact target per training needle share: where trajectory annealing wins and where it loses."""
    print("\n### needle_fraction sweep (n = 16; TV of the chains' end states to exp(beta f_final), 2^16 states exact)\n")
    base = [m for m in SAMPLERS if m != "trajectory"]
    print("| needle_fraction | target's needle mass | start (uniform) | " + " | ".join(SAMPLERS) + " | "
          + " | ".join(f"trajectory - {m} (95% CI)" for m in base) + " |")
    print("|---|---|---|" + "---|" * (len(SAMPLERS) + len(base)))
    for frac in fractions:
        key = f"needle{frac:g}"
        seeds = sorted(s for s in results if key in results[s])
        if not seeds:
            continue
        def rows(m, c, key=key, seeds=seeds):
            return [results[s][key]["rows"][m].get(c, float("nan")) for s in seeds]

        label = f"{frac:g}" if frac > 0 else "0 (uniform: 2^-8 by chance)"
        cells = [fmt(rows("trajectory", "target_needle_mass")), fmt(rows("trajectory", "tv_start"))]
        cells += [fmt(rows(m, "tv")) for m in SAMPLERS]
        cells += [paired_ci(rows("trajectory", "tv"), rows(m, "tv")) for m in base]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\nneedle rate of the chains (share ending inside the needle):\n")
    print("| needle_fraction | " + " | ".join(SAMPLERS) + " |\n|---|" + "---|" * len(SAMPLERS))
    for frac in fractions:
        key = f"needle{frac:g}"
        seeds = sorted(s for s in results if key in results[s])
        if seeds:
            print(f"| {frac:g} | " + " | ".join(fmt([results[s][key]["rows"][m]["needle_rate"] for s in seeds])
                                             for m in SAMPLERS) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tasks", default="boolean16,needle,boolean32,modes,dna,counterfactual,walsh,speed")
    p.add_argument("--steps", type=int, default=800, help="predictor training steps (modes: 1.5x)")
    p.add_argument("--K", type=int, default=20, help="checkpoints kept (every steps/K)")
    p.add_argument("--m", type=int, default=15, help="MCMC steps per checkpoint")
    p.add_argument("--chains", type=int, default=128)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--step-size", type=float, default=0.1, help="MALA epsilon (modes)")
    p.add_argument("--cf-train", type=int, default=12000)
    p.add_argument("--cf-steps", type=int, default=600)
    p.add_argument("--cf-m", type=int, default=10)
    p.add_argument("--cf-beta", type=float, default=4.0)
    p.add_argument("--cf-budget", type=int, default=100, help="pixels that may differ from the query image")
    p.add_argument("--cf-penalty", type=float, default=0.05, help="lambda per edited pixel")
    p.add_argument("--cf-queries", type=int, default=8)
    p.add_argument("--cf-chains", type=int, default=4, help="chains per query image")
    p.add_argument("--cf-seeds", type=int, default=3, help="sampler seeds over the one classifier trajectory")
    p.add_argument("--needle-fractions", default="0,0.02,0.1,0.2",
                   help="needle task: shares of training inputs with every needle bit set (0: uniform inputs, 2^-8 by chance)")
    p.add_argument("--seed-list", default=None, help="comma-separated seeds (overrides --seeds)")
    p.add_argument("--report", action="store_true", help="only print the tables from the per-seed files in the out folder")
    p.add_argument("--tag", default="results", help="results file name: benchmarks/out/trajectory_sampler/<tag>.json")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.steps, args.chains, args.m, args.cf_steps, args.cf_train = 1, 400, 128, 10, 100, 2000
    args.tasks = args.tasks.split(",")
    args.needle_fractions = [float(v) for v in str(args.needle_fractions).split(",")]
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    seeds = [int(v) for v in args.seed_list.split(",")] if args.seed_list else list(range(args.seeds))
    if args.jobs > 1 and not args.report:
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
            results = dict(zip(seeds, ex.map(one_seed, seeds, [vars(args)] * len(seeds)), strict=True))
    else:
        results = {s: one_seed(s, vars(args)) for s in seeds} if not args.report else {}
    if args.report:  # tables from the per-seed files earlier (possibly parallel, per-task) runs left in OUT
        for f in sorted(OUT.glob("seed*-*.json")):
            seed, task = f.stem[4:].split("-", 1)
            wanted = task in args.tasks or ("needle" in args.tasks and task.startswith("needle"))
            if wanted and int(seed) in seeds:
                results.setdefault(int(seed), {})[task] = json.loads(f.read_text())
        seeds = sorted(results)
    extra = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if "counterfactual" in args.tasks and not args.report:
            cf = counterfactual_trajectory(args, tmp)
            for s in seeds[: args.cf_seeds]:
                results.setdefault(s, {})["counterfactual"] = task_counterfactual(s, args, cf)
                (OUT / f"seed{s}-counterfactual.json").write_text(json.dumps(results[s]["counterfactual"]))
                print(f"  seed {s} counterfactual: " + json.dumps(
                    {m: round(r["success"], 3) for m, r in results[s]["counterfactual"]["rows"].items()}), flush=True)
        if "walsh" in args.tasks and not args.report:
            steps, rec = task_walsh(args, tmp)
            extra["walsh"] = {"steps": steps, "recovered": rec.tolist()}
            walsh_figure(steps, rec, OUT / "walsh.png")
            (OUT / "walsh.json").write_text(json.dumps(extra["walsh"]))
    if "speed" in args.tasks and not args.report:
        extra["speed"] = speed(args)
        (OUT / "speed.json").write_text(json.dumps(extra["speed"]))
    for name in ("walsh", "speed"):
        if args.report and name in args.tasks and (OUT / f"{name}.json").exists():
            extra[name] = json.loads((OUT / f"{name}.json").read_text())
    (OUT / f"{args.tag}.json").write_text(json.dumps({"args": vars(args), "seeds": results, **extra}, indent=1))

    print(f"\n## trajectory sampler benchmark ({args.seeds} seeds, K={args.K} checkpoints x m={args.m} steps, "
          f"{args.chains} chains; total {time.perf_counter() - t0:.0f}s)")
    if any("boolean16" in r for r in results.values()):
        table(results, "boolean16", ["tv", "tv_floor", "tv_true", "needle_rate", "hit_rate", "first_hit_median", "acceptance"],
              "tv")
    if "needle" in args.tasks:
        needle_table(results, args.needle_fractions)
    if any("boolean32" in r for r in results.values()):
        table(results, "boolean32", ["needle_rate", "hit_rate", "first_hit_median", "acceptance"], "hit_rate")
    if any("modes" in r for r in results.values()):
        table(results, "modes", ["modes_covered", "in_mode_rate", "mode_tv", "acceptance"], "mode_tv")
    if any("dna" in r for r in results.values()):
        table(results, "dna", ["true_best", "true_mean", "unique", "acceptance"], "true_mean")
    if any("counterfactual" in r for r in results.values()):
        val_acc = next(r for r in results.values() if "counterfactual" in r)["counterfactual"]["val_acc"]
        print(f"\nclassifier val accuracy (binarised): {val_acc:.3f}; "
              f"{args.cf_queries} ankle-boot queries x {args.cf_chains} chains, budget {args.cf_budget} pixels, "
              f"lambda {args.cf_penalty}, beta {args.cf_beta}")
        table(results, "counterfactual", ["success", "queries_solved", "edits_success", "acceptance"], "success")
    if "walsh" in extra:
        steps, rec = extra["walsh"]["steps"], torch.tensor(extra["walsh"]["recovered"])
        print("\n### Walsh energy recovered per degree (n = 12), first checkpoint step reaching 50% / 90%\n")
        print("| degree | " + " | ".join(str(d) for d in range(rec.shape[1]) if not torch.isnan(rec[:, d]).all()) + " |")
        keep = [d for d in range(rec.shape[1]) if not torch.isnan(rec[:, d]).all()]
        print("|---|" + "---|" * len(keep))
        for thr in (0.5, 0.9):
            cells = []
            for d in keep:
                hit = (rec[:, d] >= thr).nonzero()
                cells.append(str(steps[int(hit[0])]) if len(hit) else "never")
            print(f"| {int(thr * 100)}% | " + " | ".join(cells) + " |")
    if "speed" in extra:
        print("\n### speed (one chain batch, 1 thread)\n")
        print("| kernel | chain-steps/s | step time / one value+grad eval |\n|---|---|---|")
        for k, v in extra["speed"].items():
            print(f"| {k} | {v['chain_steps_per_s']:.0f} | {v['step_over_eval']:.2f} |")


def walsh_figure(steps, rec, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for d in range(rec.shape[1]):
        if torch.isnan(rec[:, d]).all() or d == 0:
            continue
        ax.plot(steps, rec[:, d].clamp(-0.2, 1).numpy(), label=f"degree {d}", color=plt.cm.viridis(d / rec.shape[1]))
    ax.set_xscale("log")
    ax.set_xlabel("training step (checkpoint)")
    ax.set_ylabel("fraction of f*'s degree-d energy recovered")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Walsh-Fourier degrees learned over training (n = 12)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
