"""Data-mediated model interactions: linear-Gaussian theory vs Monte Carlo, and K tiny LMs on Wikipedia topics.

    OMP_NUM_THREADS=1 python benchmarks/model_interactions.py [--lm sweep scale] [--jobs 2] [--results runs.jsonl]

Part 1 (seconds): exact mean/covariance recursions next to a Monte Carlo of the finite-sample process, the alpha x beta
sweep of own-task risk, cross-task risk, inter-model gap and rho(Q) after G generations, and collapse at rho(Q) = 1.
Part 2 (minutes per run): K = 2 LMs (Mathematics / History private, Geography public) for G generations.
`sweep`: alpha x beta in {0, 0.5, 1}^2 plus self-consumption controls (alpha = 0.5 at beta = 1 and 0.5, synthetic
share from the entity's own model only), same steps, parameters and tokens in every cell; own / cross perplexity vs
isolation (alpha = 0, same beta), JS divergence, CKA, paired 95% CIs over seeds; heat maps and per-generation curves.
`scale`: the cross-task gap at beta = 1 as the steps, the width and the pool grow. Every finished run is one line of
--results (resumable; runs go in `_priority` order, so a cut run leaves the claim cells complete first).
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
# the settings of a run; rows stored before a field existed read its default (`_get`)
DEFAULTS = {"sequences": 256, "d_model": 64, "synthetic": 128, "sources": "all", "num_layers": 2, "lr": 3e-3,
            "base_steps": 0}
# `small`: entities from random weights (perplexity ~190 after generation 0: their samples are close to noise);
# `base`: every entity and the isolation arm start from one shared TinyLM (the same d 64, 2 layers) pretrained on all topics
# (`lit_iclr/model_interactions/base.py`), fine-tuned at a lower learning rate (configs/model_interactions_base.yaml)
SETTINGS = {"small": dict(DEFAULTS),
            "base": {**DEFAULTS, "lr": 1e-3, "base_steps": 2000}}
BASE = SETTINGS["small"]
# the scale knob of the base setting: the base's pretraining steps (0 = the base architecture from random weights)
BASE_STEPS_ROWS = (0, 500, 2000)


def _get(row: dict, key: str):
    return row.get(key, DEFAULTS.get(key))
# the cells the claims rest on, most informative first: the cross-task cell (beta = 1) with its isolation and its
# self-consumption control, then the alpha trend at beta = 0.5 with its control; the rest of the grid comes last
CLAIM_CELLS = [(0.0, 1.0, "all"), (0.5, 1.0, "all"), (0.5, 1.0, "own"),
               (0.0, 0.5, "all"), (0.5, 0.5, "all"), (1.0, 0.5, "all"), (0.5, 0.5, "own")]
OTHER_CELLS = [(a, b, "all") for b in SWEEP_GRID for a in SWEEP_GRID if (a, b, "all") not in CLAIM_CELLS]
CONTROL_CELLS = [(a, b) for a, b, src in CLAIM_CELLS if src == "own"]
# the cross-task gap (alpha 0.5 vs isolation) at beta = SCALE_BETA, where the sweep shows it, as steps, width and pool
# size grow, one change at a time
SCALE_BETA = 1.0
SCALE_ROWS = {"base": {}, "steps x2": {"sequences": 512}, "width x2": {"d_model": 128}, "pool x4": {"synthetic": 512}}


def lm_runs(kind: str, seeds) -> list[dict]:
    """The run list of a table: the alpha x beta sweep (+ the self-consumption controls) or the scale table."""
    runs = []
    for seed in seeds:
        if kind == "sweep":
            runs += [{**BASE, "seed": seed, "alpha": a, "beta": b, "sources": src} for a, b, src in CLAIM_CELLS + OTHER_CELLS]
        elif kind == "base_steps":  # beta = 1: isolation, interaction and the own-pool control per base
            runs += [{**BASE, "base_steps": n, "seed": seed, "alpha": a, "beta": SCALE_BETA, "sources": src}
                     for n in BASE_STEPS_ROWS for a, src in ((0.0, "all"), (0.5, "all"), (0.5, "own"))]
        else:
            for change in SCALE_ROWS.values():  # isolation never reads the pool: "pool x4" reuses the base isolation runs
                runs += [{**BASE, **change, "seed": seed, "alpha": a, "beta": SCALE_BETA}
                         for a in ((0.5,) if "synthetic" in change else (0.0, 0.5))]
    return runs


def _priority(c: dict) -> tuple:
    """Run order, so that a cut benchmark leaves the claims complete first: 0 the beta = 1 claim cells (every seed),
    1 the beta = 0.5 claim cells (seeds 0-2), 2 the scale rows of seed 0, 3 the scale rows of seeds 1-2, 4 the rest of
    the grid, 5 anything else; within a stage seed by seed, so paired comparisons complete together."""
    cell = (c["alpha"], c["beta"], c["sources"])
    is_base = all(_get(c, k) == v for k, v in BASE.items() if k != "sources")
    if is_base and cell in CLAIM_CELLS and c["beta"] == 1.0:
        stage = 0
    elif c["seed"] >= 3:
        stage = 5
    elif is_base and cell in CLAIM_CELLS:
        stage = 1
    elif not is_base:
        stage = 2 if c["seed"] == 0 else 3
    else:
        stage = 4
    order = CLAIM_CELLS.index(cell) if cell in CLAIM_CELLS else 0
    return stage, c["seed"], -c["sequences"], -c["d_model"], c["synthetic"], order  # scale: steps, width, pool


def lm_run(cfg: dict, generations: int) -> dict:
    """One K=2 run: Mathematics / History private, Geography public; the per-generation history."""
    import lightning as L
    import torch

    from lit_iclr.model_interactions import InteractionData, InteractionLM

    torch.set_num_threads(1)
    t0, c0 = time.time(), time.process_time()
    tmp = Path(tempfile.mkdtemp(prefix="mi_bench_"))
    dm = InteractionData(sequences_per_generation=cfg["sequences"], seq_len=32, vocab_size=512, eval_sequences=64,
                         isolation_arm=False,
                         batch_size=16, alpha=cfg["alpha"], beta=cfg["beta"], seed=cfg["seed"], pool_dir=str(tmp / "pool"),
                         pool_sources=cfg["sources"])
    dm.prepare_data()
    L.seed_everything(cfg["seed"], verbose=False)
    lr = _get(cfg, "lr")
    model = InteractionLM(512, 2, 32, cfg["d_model"], _get(cfg, "num_layers"), 4,
                          optimizer=lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.01),
                          synthetic_sequences=cfg["synthetic"], seed=cfg["seed"], isolation_arm=False,
                          base_steps=_get(cfg, "base_steps"))
    trainer = L.Trainer(accelerator="cpu", max_epochs=generations + 1, reload_dataloaders_every_n_epochs=1,
                        num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, gradient_clip_val=1.0, default_root_dir=str(tmp))
    trainer.fit(model, datamodule=dm)
    return {**cfg, "history": model.history, "seconds": time.time() - t0, "cpu_seconds": time.process_time() - c0,
            "base_valid_ppl": (model.base_info or {}).get("valid_ppl")}


def _key(cfg: dict) -> str:
    return json.dumps({k: _get(cfg, k) for k in ("seed", "alpha", "beta", *DEFAULTS)}, sort_keys=True)


def _run_and_store(args) -> None:
    cfg, generations, results = args
    row = lm_run(cfg, generations)
    with open(results, "a") as f:  # one line per run, appended whole (resumable: finished runs are skipped)
        f.write(json.dumps(row) + "\n")
    h = row["history"][-1]
    print(f"  {_key(cfg)}: own {h['own_ppl']:.1f} cross {h['cross_ppl']:.1f} js {h['js']:.4f} ({row['cpu_seconds']:.0f} s CPU)",
          flush=True)


def run_lm(kinds, seeds, generations: int, results: Path, jobs: int, betas=None) -> None:
    """All runs of the requested tables in `_priority` order, each run once; finished runs in `results` are skipped;
    `betas`: only the runs at these betas."""
    done = {_key(json.loads(x)) for x in results.read_text().splitlines()} if results.exists() else set()
    runs = {_key(c): c for kind in kinds for c in lm_runs(kind, seeds) if betas is None or c["beta"] in betas}
    order = sorted(runs.values(), key=_priority)
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
    return {r["seed"]: r["history"][-1] for r in rows if all(_get(r, k) == v for k, v in match.items())}


def _ratio_ci(a: dict[int, dict], b: dict[int, dict], key: str) -> str:
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return "n/a"
    return str(paired_ci([np.log(a[s][key]) for s in seeds], [np.log(b[s][key]) for s in seeds]))


def _base_rows(rows: list[dict], **match) -> dict[int, dict]:
    """Final-generation metrics per seed of the base-size runs matching `match` (sources default "all")."""
    return _last(rows, **{"sources": "all", **{k: v for k, v in BASE.items() if k != "sources"}, **match})


def _gen_rows(rows: list[dict], **match) -> dict[int, list[dict]]:
    """Whole per-generation histories per seed of the base-size runs matching `match`."""
    match = {"sources": "all", **{k: v for k, v in BASE.items() if k != "sources"}, **match}
    return {r["seed"]: r["history"] for r in rows if all(_get(r, k) == v for k, v in match.items())}


def _cis(cur: dict[int, dict], ref: dict[int, dict]) -> list[str]:
    """Paired CIs of cur minus ref over their common seeds: log own ppl, log cross ppl, JS."""
    seeds = sorted(set(cur) & set(ref))
    js = str(paired_ci([cur[s]["js"] for s in seeds], [ref[s]["js"] for s in seeds])) if len(seeds) > 1 else "n/a"
    return [_ratio_ci(cur, ref, "own_ppl"), _ratio_ci(cur, ref, "cross_ppl"), js]


def _balance(h: dict) -> float:
    """The own + cross balance of one run's final generation: the log of the geometric mean of own and cross perplexity,
    (log own ppl + log cross ppl) / 2 (lower is better)."""
    return float(np.log(h["own_ppl"]) + np.log(h["cross_ppl"])) / 2


def report_balance(rows: list[dict], ref: tuple[float, float] = (0.5, 0.5)) -> None:
    """The paper's "best balance" claim: the balance (`_balance`) of every grid cell (shared pool), paired over seeds
    against isolation at the same beta and against the `ref` cell (alpha = beta = 0.5)."""
    cells = {(a, b): _base_rows(rows, alpha=a, beta=b) for b in SWEEP_GRID for a in SWEEP_GRID}
    cells = {k: v for k, v in cells.items() if len(v) > 1}
    if len(cells) < 2 or ref not in cells:
        return
    print("\nOwn + cross balance (geometric mean of own and cross ppl at the final generation, lower is better; CIs of "
          "its log, paired over seeds; negative = better than the other arm):\n")
    print(f"| alpha | beta | seeds | sqrt(own ppl x cross ppl) | vs isolation (same beta) [95% CI] | vs alpha = {ref[0]}, "
          f"beta = {ref[1]} [95% CI] |")
    print("|---|---|---|---|---|---|")
    for (a, b), cur in cells.items():
        iso, r = cells.get((0.0, b), {}), cells[ref]

        def ci(other, cur=cur):
            seeds = sorted(set(cur) & set(other))
            if len(seeds) < 2:
                return "n/a"
            return str(paired_ci([_balance(cur[s]) for s in seeds], [_balance(other[s]) for s in seeds]))
        print(f"| {a} | {b} | {len(cur)} | {mean_std([np.exp(_balance(h)) for h in cur.values()], 4)} | "
              f"{'-' if a == 0 else ci(iso)} | {'-' if (a, b) == ref else ci(r)} |")
    best = min(cells, key=lambda k: np.mean([_balance(h) for h in cells[k].values()]))
    print(f"\nBest own + cross balance (lowest mean) at alpha = {best[0]}, beta = {best[1]}.")


def report_sweep(rows: list[dict], out: Path | None, generations: int) -> None:
    base = dict(BASE)
    print(f"\n## K=2 tiny LMs: alpha x beta sweep ({generations} interacting generations, {base['sequences']} blocks x 32 "
          f"tokens per entity per generation, d_model {base['d_model']}, {base['num_layers']} layers, lr {base['lr']}, "
          f"{base['synthetic']} samples per model per generation, "
          + (f"shared base pretrained {base['base_steps']} steps)\n" if base["base_steps"] else "random init)\n"))
    print("Same steps, parameters and tokens for every cell; isolation = alpha 0 at the same beta. "
          "`own` = self-consumption control (the same alpha of synthetic data, all from the entity's own model). "
          "CIs: paired over the seeds both cells have; log ppl ratios (negative = lower perplexity than isolation).\n")
    print("| alpha | beta | pool | seeds | own ppl | cross ppl | JS (nats) | CKA | log own ppl vs isolation [95% CI] | "
          "log cross ppl vs isolation [95% CI] | JS vs isolation [95% CI] |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    grids = {k: np.full((3, 3), np.nan) for k in ("own", "cross", "js")}
    cells = [(a, b, "all") for b in SWEEP_GRID for a in SWEEP_GRID] + [(a, b, "own") for a, b in CONTROL_CELLS]
    for a, b, src in cells:
        cur, iso = _base_rows(rows, alpha=a, beta=b, sources=src), _base_rows(rows, alpha=0.0, beta=b)
        if not cur:
            continue
        seeds = sorted(set(cur) & set(iso))
        v = {k: [cur[s][k] for s in sorted(cur)] for k in ("own_ppl", "cross_ppl", "js", "cka")}
        cis = ["-"] * 3 if a == 0 else _cis(cur, iso)
        print(f"| {a} | {b} | {src} | {len(cur)} | {mean_std(v['own_ppl'], 4)} | {mean_std(v['cross_ppl'], 4)} | "
              f"{mean_std(v['js'], 3)} | {mean_std(v['cka'], 3)} | {' | '.join(cis)} |")
        if src == "all" and seeds:  # heat maps: means over the seeds the cell shares with its isolation
            i, j = SWEEP_GRID.index(a), SWEEP_GRID.index(b)
            grids["own"][i, j] = np.mean([np.log(cur[s]["own_ppl"] / iso[s]["own_ppl"]) for s in seeds])
            grids["cross"][i, j] = np.mean([np.log(cur[s]["cross_ppl"] / iso[s]["cross_ppl"]) for s in seeds])
            grids["js"][i, j] = np.mean(v["js"])
    for a, b in CONTROL_CELLS:
        own, mixed = _base_rows(rows, alpha=a, beta=b, sources="own"), _base_rows(rows, alpha=a, beta=b)
        if len(set(own) & set(mixed)) < 2:
            continue
        print(f"\nInteraction vs self-consumption at alpha = {a}, beta = {b} (shared pool minus own-model pool, paired over "
              f"{len(set(own) & set(mixed))} seeds; negative = the shared pool is better / more homogeneous):\n")
        for name, ci in zip(("log own ppl", "log cross ppl", "JS"), _cis(mixed, own), strict=True):
            print(f"- {name}: {ci}")
    # the cross-task gap by generation at beta = 1: when it opens and whether it lasts as the pool recycles
    print("\nCross-task gap by generation at beta = 1 (log cross ppl minus isolation's, paired over seeds):\n")
    for src in ("all", "own"):
        cur, iso = (_gen_rows(rows, alpha=a, beta=1.0, sources=s) for a, s in ((0.5, src), (0.0, "all")))
        seeds = sorted(set(cur) & set(iso))
        if len(seeds) > 1:
            def log_cross(h, g, seeds=seeds):
                return [np.log(h[s][g]["cross_ppl"]) for s in seeds]
            print(f"- alpha 0.5, {src} pool ({len(seeds)} seeds): " + ", ".join(
                f"g{g}: {paired_ci(log_cross(cur, g), log_cross(iso, g))}" for g in range(1, len(cur[seeds[0]]))))
    report_balance(rows)
    # homogenisation trend: JS at alpha 0.5 and 1 vs 0.5, per beta
    print("\nHomogenisation trend (JS, paired over seeds):\n")
    for b in SWEEP_GRID:
        half, full = _base_rows(rows, alpha=0.5, beta=b), _base_rows(rows, alpha=1.0, beta=b)
        seeds = sorted(set(half) & set(full))
        if len(seeds) > 1:
            ci = paired_ci([full[s]["js"] for s in seeds], [half[s]["js"] for s in seeds])
            print(f"- beta = {b}: JS(alpha 1) - JS(alpha 0.5) = {ci} ({len(seeds)} seeds)")
    print("\nPer generation (mean over seeds; generation 0 is real data only): own ppl / cross ppl / JS\n")
    curves = [(0.0, 0.5, "all"), (0.5, 0.5, "all"), (1.0, 0.5, "all"), (0.5, 0.5, "own"),
              (0.0, 1.0, "all"), (0.5, 1.0, "all"), (0.5, 1.0, "own")]
    mean_curves = {}
    for a, b, src in curves:
        hs = [r["history"] for r in rows if r["alpha"] == a and r["beta"] == b and r["sources"] == src
              and all(_get(r, k) == v for k, v in base.items() if k != "sources")]
        if not hs:
            continue
        mean_curves[a, b, src] = {k: np.mean([[g[k] for g in h] for h in hs], 0) for k in ("own_ppl", "cross_ppl", "js")}
        c = mean_curves[a, b, src]
        print(f"- alpha={a} beta={b} {src} ({len(hs)} seeds): " + ", ".join(
            f"g{g}: {c['own_ppl'][g]:.1f} / {c['cross_ppl'][g]:.1f} / {c['js'][g]:.4f}" for g in range(len(c["js"]))))
    if out is not None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
        for ax, (name, key) in zip(axes, [("log own ppl / isolation", "own"), ("log cross ppl / isolation", "cross"),
                                          ("JS divergence (nats)", "js")], strict=True):
            im = ax.imshow(grids[key], origin="lower", extent=(-0.25, 1.25, -0.25, 1.25), aspect="auto",
                           cmap="RdBu_r" if key != "js" else "viridis",
                           **({"vmin": -np.nanmax(np.abs(grids[key])), "vmax": np.nanmax(np.abs(grids[key]))}
                              if key != "js" else {}))
            for i, alpha in enumerate(SWEEP_GRID):
                for j, beta in enumerate(SWEEP_GRID):
                    if not np.isnan(grids[key][i, j]):
                        ax.text(beta, alpha, f"{grids[key][i, j]:+.3f}" if key != "js" else f"{grids[key][i, j]:.3f}",
                                ha="center", va="center", fontsize=8)
            ax.set_xticks(SWEEP_GRID)
            ax.set_yticks(SWEEP_GRID)
            ax.set_xlabel("beta")
            ax.set_ylabel("alpha")
            ax.set_title(name)
            fig.colorbar(im, ax=ax)
        fig.suptitle("K=2 tiny LMs after 3 interacting generations (mean over seeds; empty = not run)")
        fig.tight_layout()
        fig.savefig(out / "model_interactions_lm_heatmaps.png", dpi=100)
        fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
        for row, b in enumerate((0.5, 1.0)):
            for (a, bb, src), c in mean_curves.items():
                if bb != b:
                    continue
                for ax, key in zip(axes[row], ("own_ppl", "cross_ppl", "js"), strict=True):
                    ax.plot(c[key], marker="o", ls="--" if src == "own" else "-", label=f"alpha={a} ({src} pool)")
                    ax.set_title(f"{key}, beta {b}")
                    ax.set_xlabel("generation")
            axes[row, 0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "model_interactions_lm_generations.png", dpi=100)


def _gap_cell(mix: dict, iso: dict, seeds: list[int], key: str, g: int) -> str:
    """log(mix / iso) of `key` at generation g: paired CI over seeds, or the single value marked as one seed."""
    a, b = [np.log(mix[s][g][key]) for s in seeds], [np.log(iso[s][g][key]) for s in seeds]
    return str(paired_ci(a, b)) if len(seeds) > 1 else f"{a[0] - b[0]:+.3g} (1 seed)"


def report_scale(rows: list[dict]) -> None:
    print(f"\n## Scale: the cross-task gap (alpha 0.5 vs isolation, beta {SCALE_BETA}) as steps, width and pool size grow\n")
    print("| change | seeds | cross ppl isolation | cross ppl alpha 0.5 | log cross ratio, generation 1 [95% CI] | "
          "log cross ratio, generation 3 [95% CI] | log own ratio, generation 3 [95% CI] | JS isolation / alpha 0.5 | "
          "CPU s per run (iso / alpha 0.5) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, change in SCALE_ROWS.items():
        cfg = {**BASE, **change}
        hist = {a: {r["seed"]: r["history"] for r in rows if r["alpha"] == a and r["beta"] == SCALE_BETA
                    and all(_get(r, k) == v for k, v in cfg.items())} for a in (0.0, 0.5)}
        iso, mix = hist[0.0], hist[0.5]
        if name == "pool x4":  # isolation never reads the pool: the base isolation runs are the same runs
            iso = {r["seed"]: r["history"] for r in rows if r["alpha"] == 0.0 and r["beta"] == SCALE_BETA
                   and all(_get(r, k) == v for k, v in BASE.items())}
        seeds = sorted(set(iso) & set(mix))
        if not seeds:
            continue
        cpu = [[r["cpu_seconds"] for r in rows if "cpu_seconds" in r and r["alpha"] == a and r["beta"] == SCALE_BETA
                and all(_get(r, k) == v for k, v in cfg.items())] for a in (0.0, 0.5)]  # runs before CPU timing have none
        cpu = [f"{np.mean(c):.0f}" if c else "n/a" for c in cpu]
        print(f"| {name} ({', '.join(f'{k}={v}' for k, v in cfg.items() if k != 'sources')}) | {len(seeds)} | "
              f"{mean_std([iso[s][-1]['cross_ppl'] for s in seeds], 4)} | "
              f"{mean_std([mix[s][-1]['cross_ppl'] for s in seeds], 4)} | "
              f"{_gap_cell(mix, iso, seeds, 'cross_ppl', 1)} | {_gap_cell(mix, iso, seeds, 'cross_ppl', -1)} | "
              f"{_gap_cell(mix, iso, seeds, 'own_ppl', -1)} | "
              f"{np.mean([iso[s][-1]['js'] for s in seeds]):.4f} / {np.mean([mix[s][-1]['js'] for s in seeds]):.4f} | "
              f"{cpu[0]} / {cpu[1]} |")


def report_base_steps(rows: list[dict]) -> None:
    """The beta = 1 claim cells as the shared base's pretraining grows (the scale knob of the `base` setting)."""
    print(f"\n## The gap as the shared base's pretraining grows (beta {SCALE_BETA}; d_model {BASE['d_model']}, "
          f"{BASE['num_layers']} layers, fine-tuning lr {BASE['lr']})\n")
    print("CIs paired over seeds: log ppl of alpha 0.5 (shared pool) minus isolation, and shared minus own pool "
          "(negative = lower perplexity / more alike).\n")
    print("| base steps | base valid ppl (Math / History / Geography) | seeds | own ppl iso / shared / own-pool | "
          "cross ppl iso / shared / own-pool | log cross, shared vs isolation, g1 [95% CI] | "
          "log cross, shared vs isolation, g3 [95% CI] | log own, shared vs isolation, g3 [95% CI] | "
          "log cross, shared vs own pool, g3 [95% CI] | JS iso / shared |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in BASE_STEPS_ROWS:
        cfg = {**BASE, "base_steps": n}

        def hist(a, src, cfg=cfg):
            return {r["seed"]: r for r in rows if r["alpha"] == a and r["beta"] == SCALE_BETA
                    and all(_get(r, k) == v for k, v in {**cfg, "sources": src}.items())}
        iso, mix, own = hist(0.0, "all"), hist(0.5, "all"), hist(0.5, "own")
        seeds = sorted(set(iso) & set(mix))
        if not seeds:
            continue
        h = {k: {s: r["history"] for s, r in d.items()} for k, d in (("iso", iso), ("mix", mix), ("own", own))}
        base_ppl = next((r.get("base_valid_ppl") for r in mix.values() if r.get("base_valid_ppl")), None)
        base_ppl = " / ".join(f"{v:.1f}" for v in base_ppl.values()) if base_ppl else "- (random init)"
        o_seeds = sorted(set(own) & set(mix))

        def means(key, seeds=seeds, o_seeds=o_seeds, h=h):
            vals = [np.mean([h[a][s][-1][key] for s in (o_seeds if a == "own" else seeds)]) if
                    (o_seeds if a == "own" else seeds) else float("nan") for a in ("iso", "mix", "own")]
            return " / ".join(f"{v:.1f}" for v in vals)
        own_ci = _gap_cell(h["mix"], h["own"], o_seeds, "cross_ppl", -1) if o_seeds else "-"
        print(f"| {n} | {base_ppl} | {len(seeds)} | {means('own_ppl')} | {means('cross_ppl')} | "
              f"{_gap_cell(h['mix'], h['iso'], seeds, 'cross_ppl', 1)} | "
              f"{_gap_cell(h['mix'], h['iso'], seeds, 'cross_ppl', -1)} | "
              f"{_gap_cell(h['mix'], h['iso'], seeds, 'own_ppl', -1)} | {own_ci} | "
              f"{np.mean([h['iso'][s][-1]['js'] for s in seeds]):.4f} / {np.mean([h['mix'][s][-1]['js'] for s in seeds]):.4f} |")


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
        t = time.process_time()  # CPU time: the machine is shared, wall time is not the cost
        for _ in range(reps):
            opt.zero_grad()
            fn().backward()
            opt.step()
        return (time.process_time() - t) / reps

    t_k = timed(lambda: sum(model.token_nll(m, ids[:, k])[0].mean() for k, m in enumerate(model.models)))
    t_1 = timed(lambda: model.token_nll(model.models[0], ids[:, 0])[0].mean())
    tokens = ids[:, 0].numel()
    k_rate, one_rate = dm.num_entities * tokens / t_k, tokens / t_1
    print(f"\nSpeed: K={dm.num_entities} entity step {t_k * 1e3:.0f} ms CPU ({k_rate:.0f} tok per CPU s), one model "
          f"alone (reference) {t_1 * 1e3:.0f} ms CPU ({one_rate:.0f} tok per CPU s); per-token throughput ratio "
          f"{k_rate / one_rate:.2f}")


def main() -> None:
    global BASE, OTHER_CELLS, BASE_STEPS_ROWS
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--out", default="seeds/figures")
    ap.add_argument("--lm", nargs="*", default=["sweep", "scale"], choices=["sweep", "scale", "base_steps"],
                    help="LM tables to run (none: theory only); base_steps: the gap as the base's pretraining grows")
    ap.add_argument("--setting", default="small", choices=sorted(SETTINGS),
                    help="small: entities from random weights; base: from one shared pretrained base")
    ap.add_argument("--base_steps_rows", type=int, nargs="+", default=list(BASE_STEPS_ROWS),
                    help="the base's pretraining steps of the base_steps table")
    ap.add_argument("--cells", default="all", choices=["all", "claims"],
                    help="claims: only the claim cells of the sweep (CLAIM_CELLS), not the rest of the grid")
    ap.add_argument("--betas", type=float, nargs="+", default=None,
                    help="run only the sweep cells at these betas (e.g. 0.5); the report still shows every stored cell")
    ap.add_argument("--results", default=str(Path(tempfile.gettempdir()) / "model_interactions_runs.jsonl"),
                    help="one line per finished LM run; finished runs are skipped, so a stopped benchmark resumes")
    ap.add_argument("--jobs", type=int, default=1, help="LM runs in parallel (processes, one thread each)")
    ap.add_argument("--skip_theory", action="store_true")
    ap.add_argument("--report_only", action="store_true", help="print the LM tables from --results without running more")
    args = ap.parse_args()
    BASE, BASE_STEPS_ROWS = SETTINGS[args.setting], tuple(args.base_steps_rows)
    if args.cells == "claims":
        OTHER_CELLS = []
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    if not args.skip_theory:
        theory_part(out)
    results = Path(args.results)
    if args.lm and not args.report_only:
        run_lm(args.lm, args.seeds, args.generations, results, args.jobs, args.betas)
    rows = [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []
    if "sweep" in args.lm:
        report_sweep(rows, out, args.generations)
    if "scale" in args.lm:
        report_scale(rows)
    if "base_steps" in args.lm:
        report_base_steps(rows)
    if args.lm:
        speed()


if __name__ == "__main__":
    main()
