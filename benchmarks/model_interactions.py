"""Data-mediated model interactions: linear-Gaussian theory vs Monte Carlo, and K tiny LMs on Wikipedia topics.

    OMP_NUM_THREADS=1 python benchmarks/model_interactions.py [--lm sweep scale] [--jobs 2] [--results runs.jsonl]

Part 1 (seconds): exact mean/covariance recursions next to a Monte Carlo of the finite-sample process, the alpha x beta
sweep of own-task risk, cross-task risk, inter-model gap and rho(Q) after G generations, and collapse at rho(Q) = 1.
Part 2 (minutes per run): K = 2 LMs (Mathematics / History private, Geography public) for G generations.
`sweep`: alpha x beta in {0, 0.5, 1}^2 plus a self-consumption control (alpha = beta = 0.5, synthetic share from the
entity's own model only), same steps, parameters and tokens in every cell; own / cross perplexity vs isolation
(alpha = 0, same beta), JS divergence, CKA, paired 95% CIs over seeds; heat maps. `scale`: the cross-task gap at
beta = 0.5 as the pool, the width and the steps grow. Every finished run is one line of --results (resumable).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from lit_iclr.core.stats import mean_std, paired_ci  # noqa: E402
from lit_iclr.model_interactions import theory as th  # noqa: E402


def theory_part(out: Path | None, generations: int = 30) -> None:
    p = th.default_problem(K=2, d=8, seed=0)
    rng = np.random.default_rng(0)
    n, G, R = 40, 6, 4000
    print("## Linear-Gaussian theory (K=2, d=8)\n")
    print("Exact recursion vs Monte Carlo of the finite-sample process (fixed designs, n=40, G=6, 4000 replicates):\n")
    print("| alpha | beta | rho(Q) | own risk exact | own risk MC | cross risk exact | cross risk MC | gap exact | gap MC |")
    print("|---|---|---|---|---|---|---|---|---|")
    for alpha, beta in [(0.0, 0.5), (0.5, 0.5), (1.0, 0.5)]:
        d0, d1 = th.draw_designs(p, n, 0.0, beta, rng), th.draw_designs(p, n, alpha, beta, rng)
        m, C, r = th.moments(p, n, alpha, beta, G, d0, d1)
        ex = th.summarize(p, **th.risks(p, m, C))
        theta = th.monte_carlo(p, d0, d1, G, R, rng).reshape(R, G + 1, -1)
        mc_m = theta.mean(0)
        mc_C = np.einsum("rti,rtj->tij", theta - mc_m, theta - mc_m) / (R - 1)
        mc = th.summarize(p, **th.risks(p, mc_m, mc_C))
        print(f"| {alpha} | {beta} | {r.spectral_radius:.3f} | {ex['own'][-1]:.3f} | {mc['own'][-1]:.3f} | "
              f"{ex['cross'][-1]:.3f} | {mc['cross'][-1]:.3f} | {ex['gap'][-1]:.3f} | {mc['gap'][-1]:.3f} |")
    grid = np.linspace(0, 1, 5)
    sw = th.sweep(p, 200, grid, grid, generations)
    total = sw["own"] + sw["cross"]
    print(f"\nPopulation theory after G={generations} generations (n=200); rows alpha, columns beta "
          f"{[round(float(g), 2) for g in grid]}; own + cross risk (lower is better), gap (homogenisation), rho(Q):\n")
    print("| alpha | own+cross risk | gap | rho(Q) |")
    print("|---|---|---|---|")
    for a, alpha in enumerate(grid):
        print(f"| {alpha:.2f} | {' / '.join(f'{v:.2f}' for v in total[a])} | {' / '.join(f'{v:.3f}' for v in sw['gap'][a])} "
              f"| {' / '.join(f'{v:.2f}' for v in sw['rho'][a])} |")
    a, b = np.unravel_index(np.argmin(total), total.shape)
    print(f"\nBest own+cross risk at alpha={grid[a]:.2f}, beta={grid[b]:.2f}.")
    # collapse: at alpha = 1, rho(Q) = 1 and the covariance grows linearly
    growth = []
    for alpha in (0.9, 1.0):
        m, C, r = th.moments(p, 200, alpha, 0.5, 200)
        growth.append((alpha, r.spectral_radius, th.summarize(p, **th.risks(p, m, C))["own"][[10, 50, 200]]))
    for alpha, rho, own in growth:
        print(f"alpha={alpha}: rho(Q)={rho:.4f}, own risk at generations 10/50/200 = "
              f"{own[0]:.3f} / {own[1]:.3f} / {own[2]:.3f}")
    if out is not None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
        for ax, (name, val) in zip(axes, [("own+cross risk", total), ("gap |theta_1-theta_2|^2", sw["gap"]),
                                          ("rho(Q)", sw["rho"])], strict=True):
            im = ax.imshow(val, origin="lower", extent=(0, 1, 0, 1), aspect="auto")
            ax.set_xlabel("beta")
            ax.set_ylabel("alpha")
            ax.set_title(name)
            fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(out / "model_interactions_theory_heatmaps.png", dpi=100)


SWEEP_GRID = [0.0, 0.5, 1.0]
BASE = {"sequences": 256, "d_model": 64, "synthetic": 128, "sources": "all"}
# the cross-task gap (alpha 0.5 vs isolation, beta 0.5) at larger steps, width and pool size, one change at a time
SCALE_ROWS = {"base": {}, "pool x4": {"synthetic": 512}, "width x2": {"d_model": 128}, "steps x2": {"sequences": 512}}


def lm_runs(kind: str, seeds) -> list[dict]:
    """The run list of a table: the alpha x beta sweep (+ the self-consumption control) or the scale table."""
    runs = []
    for seed in seeds:
        if kind == "sweep":
            runs += [{**BASE, "seed": seed, "alpha": a, "beta": b} for b in SWEEP_GRID for a in SWEEP_GRID]
            runs.append({**BASE, "seed": seed, "alpha": 0.5, "beta": 0.5, "sources": "own"})
        else:
            for change in SCALE_ROWS.values():  # isolation never reads the pool: "pool x4" reuses the base isolation runs
                runs += [{**BASE, **change, "seed": seed, "alpha": a, "beta": 0.5}
                         for a in ((0.5,) if "synthetic" in change else (0.0, 0.5))]
    return runs


def lm_run(cfg: dict, generations: int) -> dict:
    """One K=2 run: Mathematics / History private, Geography public; the per-generation history."""
    import lightning as L
    import torch

    from lit_iclr.model_interactions import InteractionData, InteractionLM

    torch.set_num_threads(1)
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="mi_bench_"))
    dm = InteractionData(sequences_per_generation=cfg["sequences"], seq_len=32, vocab_size=512, eval_sequences=64,
                         batch_size=16, alpha=cfg["alpha"], beta=cfg["beta"], seed=cfg["seed"], pool_dir=str(tmp / "pool"),
                         pool_sources=cfg["sources"])
    dm.prepare_data()
    L.seed_everything(cfg["seed"], verbose=False)
    model = InteractionLM(512, 2, 32, cfg["d_model"], 2, 4,
                          optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.01),
                          synthetic_sequences=cfg["synthetic"], seed=cfg["seed"])
    trainer = L.Trainer(accelerator="cpu", max_epochs=generations + 1, reload_dataloaders_every_n_epochs=1,
                        num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, gradient_clip_val=1.0, default_root_dir=str(tmp))
    trainer.fit(model, datamodule=dm)
    return {**cfg, "history": model.history, "seconds": time.time() - t0}


def _key(cfg: dict) -> str:
    return json.dumps({k: cfg[k] for k in ("seed", "alpha", "beta", "sequences", "d_model", "synthetic", "sources")},
                      sort_keys=True)


def _run_and_store(args) -> None:
    cfg, generations, results = args
    row = lm_run(cfg, generations)
    with open(results, "a") as f:  # one line per run, appended whole (resumable: finished runs are skipped)
        f.write(json.dumps(row) + "\n")
    h = row["history"][-1]
    print(f"  {_key(cfg)}: own {h['own_ppl']:.1f} cross {h['cross_ppl']:.1f} js {h['js']:.4f} ({row['seconds']:.0f}s)",
          flush=True)


def run_lm(kinds, seeds, generations: int, results: Path, jobs: int) -> None:
    """All runs of the requested tables, most informative first (beta = 0, no private data, last), each run once."""
    done = {_key(json.loads(x)) for x in results.read_text().splitlines()} if results.exists() else set()
    runs = {_key(c): c for kind in kinds for c in lm_runs(kind, seeds)}
    order = sorted(runs.values(), key=lambda c: (c["beta"] == 0.0, c["d_model"], c["sequences"], c["synthetic"], c["seed"]))
    todo = [(c, generations, str(results)) for c in order if _key(c) not in done]
    print(f"{' + '.join(kinds)}: {len(todo)} runs to do ({len(done)} stored in {results})", flush=True)
    if jobs > 1:
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(jobs) as pool:
            list(pool.imap_unordered(_run_and_store, todo))
    else:
        for t in todo:
            _run_and_store(t)


def _last(rows, **match) -> dict[int, dict]:
    """Final-generation metrics per seed of the runs matching `match`."""
    return {r["seed"]: r["history"][-1] for r in rows if all(r[k] == v for k, v in match.items())}


def _ratio_ci(a: dict[int, dict], b: dict[int, dict], key: str) -> str:
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return "n/a"
    return str(paired_ci([np.log(a[s][key]) for s in seeds], [np.log(b[s][key]) for s in seeds]))


def report_sweep(rows: list[dict], out: Path | None, generations: int) -> None:
    base = dict(BASE)
    print(f"\n## K=2 tiny LMs: alpha x beta sweep ({generations} interacting generations, {base['sequences']} blocks x 32 "
          f"tokens per entity per generation, d_model {base['d_model']}, {base['synthetic']} samples per model per "
          f"generation)\n")
    print("Same steps, parameters and tokens for every cell; isolation = alpha 0 at the same beta. "
          "`own` = self-consumption control (the same alpha of synthetic data, all from the entity's own model).\n")
    print("| alpha | beta | pool | seeds | own ppl | cross ppl | JS (nats) | CKA | log own ppl vs isolation [95% CI] | "
          "log cross ppl vs isolation [95% CI] | JS vs isolation [95% CI] |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    grids = {k: np.full((3, 3), np.nan) for k in ("own", "cross", "js")}
    cells = [(a, b, "all") for b in SWEEP_GRID for a in SWEEP_GRID] + [(0.5, 0.5, "own")]
    for a, b, src in cells:
        cur = _last(rows, alpha=a, beta=b, sources=src, **{k: v for k, v in base.items() if k != "sources"})
        iso = _last(rows, alpha=0.0, beta=b, sources="all", **{k: v for k, v in base.items() if k != "sources"})
        if not cur:
            continue
        seeds = sorted(set(cur) & set(iso))
        v = {k: [cur[s][k] for s in sorted(cur)] for k in ("own_ppl", "cross_ppl", "js", "cka")}
        cis = ["-"] * 3 if a == 0 else [_ratio_ci(cur, iso, "own_ppl"), _ratio_ci(cur, iso, "cross_ppl"),
                                        str(paired_ci([cur[s]["js"] for s in seeds], [iso[s]["js"] for s in seeds]))
                                        if len(seeds) > 1 else "n/a"]
        print(f"| {a} | {b} | {src} | {len(cur)} | {mean_std(v['own_ppl'], 4)} | {mean_std(v['cross_ppl'], 4)} | "
              f"{mean_std(v['js'], 3)} | {mean_std(v['cka'], 3)} | {' | '.join(cis)} |")
        if src == "all" and seeds:
            i, j = SWEEP_GRID.index(a), SWEEP_GRID.index(b)
            grids["own"][i, j] = np.mean([np.log(cur[s]["own_ppl"] / iso[s]["own_ppl"]) for s in seeds])
            grids["cross"][i, j] = np.mean([np.log(cur[s]["cross_ppl"] / iso[s]["cross_ppl"]) for s in seeds])
            grids["js"][i, j] = np.mean(v["js"])
    own = _last(rows, alpha=0.5, beta=0.5, sources="own", **{k: v for k, v in base.items() if k != "sources"})
    mixed = _last(rows, alpha=0.5, beta=0.5, sources="all", **{k: v for k, v in base.items() if k != "sources"})
    if own and mixed:
        print("\nInteraction vs self-consumption at alpha = beta = 0.5 (paired over seeds; log ppl, negative = "
              "interaction better):\n")
        for key in ("own_ppl", "cross_ppl"):
            print(f"- shared pool minus own-model pool, log {key}: {_ratio_ci(mixed, own, key)}")
        seeds = sorted(set(own) & set(mixed))
        js_ci = paired_ci([mixed[s]["js"] for s in seeds], [own[s]["js"] for s in seeds])
        print(f"- shared pool minus own-model pool, JS: {js_ci}")
    if out is not None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
        for ax, (name, key) in zip(axes, [("log own ppl / isolation", "own"), ("log cross ppl / isolation", "cross"),
                                          ("JS divergence (nats)", "js")], strict=True):
            im = ax.imshow(grids[key], origin="lower", extent=(-0.25, 1.25, -0.25, 1.25), aspect="auto")
            ax.set_xticks(SWEEP_GRID)
            ax.set_yticks(SWEEP_GRID)
            ax.set_xlabel("beta")
            ax.set_ylabel("alpha")
            ax.set_title(name)
            fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(out / "model_interactions_lm_heatmaps.png", dpi=100)
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
        for a, src in [(0.0, "all"), (0.5, "all"), (1.0, "all"), (0.5, "own")]:
            hs = [r["history"] for r in rows if r["alpha"] == a and r["beta"] == 0.5 and r["sources"] == src
                  and all(r[k] == v for k, v in base.items() if k != "sources")]
            if not hs:
                continue
            for ax, key in zip(axes, ("own_ppl", "cross_ppl", "js"), strict=True):
                ax.plot(np.mean([[g[key] for g in h] for h in hs], 0), marker="o", label=f"alpha={a} ({src})")
                ax.set_title(f"{key} (beta 0.5)")
                ax.set_xlabel("generation")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(out / "model_interactions_lm_generations.png", dpi=100)


def report_scale(rows: list[dict]) -> None:
    print("\n## Scale: the cross-task gap (alpha 0.5 vs isolation, beta 0.5) as steps, width and pool size grow\n")
    print("| change | seeds | cross ppl isolation | cross ppl alpha 0.5 | log cross ratio [95% CI] | log own ratio [95% CI] "
          "| JS isolation / alpha 0.5 |")
    print("|---|---|---|---|---|---|---|")
    for name, change in SCALE_ROWS.items():
        cfg = {**BASE, **change}
        iso = _last(rows, alpha=0.0, beta=0.5, **cfg)
        mix = _last(rows, alpha=0.5, beta=0.5, **cfg)
        if name == "pool x4":  # isolation never reads the pool: the base isolation runs are the same runs
            iso = _last(rows, alpha=0.0, beta=0.5, **BASE)
        seeds = sorted(set(iso) & set(mix))
        if not seeds:
            continue
        print(f"| {name} ({', '.join(f'{k}={v}' for k, v in cfg.items() if k != 'sources')}) | {len(seeds)} | "
              f"{mean_std([iso[s]['cross_ppl'] for s in seeds], 4)} | {mean_std([mix[s]['cross_ppl'] for s in seeds], 4)} | "
              f"{_ratio_ci(mix, iso, 'cross_ppl')} | {_ratio_ci(mix, iso, 'own_ppl')} | "
              f"{np.mean([iso[s]['js'] for s in seeds]):.4f} / {np.mean([mix[s]['js'] for s in seeds]):.4f} |")


def speed(out_rows: int = 16) -> None:
    """K entity models per step vs one model alone (the reference), same batch."""
    import torch

    from lit_iclr.model_interactions import InteractionData, InteractionLM

    torch.set_num_threads(1)
    dm = InteractionData(sequences_per_generation=256, seq_len=32, vocab_size=512, eval_sequences=64, batch_size=16)
    dm.prepare_data()
    dm.setup()
    model = InteractionLM(dm.vocab_size, dm.num_entities, dm.seq_len)
    ids = dm.mix(0)[:, :out_rows].transpose(0, 1)
    opt = torch.optim.AdamW(model.parameters(), 3e-3)

    def timed(fn, reps=10):
        t = time.perf_counter()
        for _ in range(reps):
            opt.zero_grad()
            fn().backward()
            opt.step()
        return (time.perf_counter() - t) / reps

    t_k = timed(lambda: sum(model.token_nll(m, ids[:, k])[0].mean() for k, m in enumerate(model.models)))
    t_1 = timed(lambda: model.token_nll(model.models[0], ids[:, 0])[0].mean())
    tokens = ids[:, 0].numel()
    k_rate, one_rate = dm.num_entities * tokens / t_k, tokens / t_1
    print(f"\nSpeed: K={dm.num_entities} entity step {t_k * 1e3:.0f} ms ({k_rate:.0f} tok/s), one model alone (reference) "
          f"{t_1 * 1e3:.0f} ms ({one_rate:.0f} tok/s); per-token throughput ratio {k_rate / one_rate:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--out", default="seeds/figures")
    ap.add_argument("--lm", nargs="*", default=["sweep", "scale"], choices=["sweep", "scale"],
                    help="LM tables to run (none: theory only)")
    ap.add_argument("--results", default=str(Path(tempfile.gettempdir()) / "model_interactions_runs.jsonl"),
                    help="one line per finished LM run; finished runs are skipped, so a stopped benchmark resumes")
    ap.add_argument("--jobs", type=int, default=1, help="LM runs in parallel (processes, one thread each)")
    ap.add_argument("--skip_theory", action="store_true")
    ap.add_argument("--report_only", action="store_true", help="print the LM tables from --results without running more")
    args = ap.parse_args()
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    if not args.skip_theory:
        theory_part(out)
    results = Path(args.results)
    if args.lm and not args.report_only:
        run_lm(args.lm, args.seeds, args.generations, results, args.jobs)
    rows = [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []
    if "sweep" in args.lm:
        report_sweep(rows, out, args.generations)
    if "scale" in args.lm:
        report_scale(rows)
    if args.lm:
        speed()


if __name__ == "__main__":
    main()
