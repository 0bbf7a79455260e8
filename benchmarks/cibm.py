"""IB-CBM benchmark: CBM families with and without the concepts' information bottleneck on the default CUB-format data.

For each family (joint, sequential, independent, CEM, ProbCBM) three variants with the same heads, data, optimiser and
epochs: the family as published (deterministic; ProbCBM is stochastic by construction), + IB_B, + IB_E; plus the black-box
reference, the stochastic joint CBM without IB term (beta = 0, the I_hat comparator) and IB_B with the dual step's sign
flipped (beta_lr = +0.01, a diagnostic). Reported per variant (mean +- std over seeds): task and concept accuracy, OIS and
NIS (x100), class leakage (probe on soft minus hard concepts, points), I_hat(X;C) on the test set, intervention AUC and
whether the random-order and uncertainty-order curves are monotone, and training throughput relative to the deterministic
family. Paired 95% CIs (t over seeds) of IB - none for accuracy, OIS, NIS and leakage. Runs made with this version also
record I_hat(X;C) at M = 32, 400, 1000 test points and sigma against the spread of mu (the estimator's log M ceiling).

    python benchmarks/cibm.py --seeds 0 --out runs/cibm_bench        # one process per seed (they may run in parallel)
    python benchmarks/cibm.py --report --out runs/cibm_bench         # table + figures from every seed's results
    python benchmarks/cibm.py --seeds 0 1 2 --epochs 16 --only joint:none joint:IB_B --out runs/cibm_scale16  # scale row
    python benchmarks/cibm.py --report --no-figures --out runs/cibm_scale16
    python benchmarks/cibm.py --diagnostics                          # NIS ordering; I_hat vs closed-form MI and M
    python benchmarks/cibm.py --testbed leakage --seeds 0 1 2 --epochs 20 --only joint:none joint:stoch_noIB \
        joint:IB_B --out runs/cibm_leakage                           # the leakage testbed (configs/cibm_leakage.yaml)

`--testbed leakage` takes the data and the model settings of `configs/cibm_leakage.yaml` (16 classes on 8 concept
prototypes told apart only by a background level no concept describes; IB_B with the Gaussian variational bound and
the penalising dual sign); each variant overrides only what it names.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from lit_iclr.core.stats import paired_ci

VARIANTS = {  # name -> CIBM overrides
    "none": {"ib": "none", "stochastic": False},
    "IB_B": {"ib": "B"},
    "IB_E": {"ib": "E"},
}
EXTRA = {
    ("blackbox", "none"): {"family": "blackbox", "ib": "none", "stochastic": False},
    ("joint", "stoch_noIB"): {"family": "joint", "ib": "none", "stochastic": True},
    ("joint", "IB_B_flipped"): {"family": "joint", "ib": "B", "beta_lr": 0.01},
}
FAMILIES = ("joint", "sequential", "independent", "cem", "probcbm")


def configs(families) -> list[tuple[str, str, dict]]:
    out = []
    for fam in families:
        for name, kw in VARIANTS.items():
            kw = dict(kw)
            if fam == "probcbm" and name == "none":
                kw = {"ib": "none", "stochastic": True}  # ProbCBM is probabilistic by design
            out.append((fam, name, {"family": fam, **kw}))
    out += [(f, v, kw) for (f, v), kw in EXTRA.items() if f in families or f == "blackbox"]
    return out


TESTBEDS = {"default": None, "leakage": Path(__file__).resolve().parents[1] / "configs" / "cibm_leakage.yaml"}
DEFAULT_MODEL = {"hidden": 128, "mi_samples": 100, "leakage_metrics": True, "leakage_samples": 400}


def testbed_args(testbed: str) -> tuple[dict, dict]:
    """(data kwargs, model kwargs) of a testbed: the default data and the benchmark's heads, or a config's init_args."""
    path = TESTBEDS[testbed]
    if path is None:
        return {"batch_size": 64}, dict(DEFAULT_MODEL)
    import yaml

    cfg = yaml.safe_load(path.read_text())
    data = {k: v for k, v in cfg["data"]["init_args"].items() if k not in ("root", "data_dir")}
    # the variants set the family and IB; the vanilla CBM the fit trains beside the model is a benchmark row here
    drop = ("optimizer", "family", "ib", "vanilla_baseline")
    model = {k: v for k, v in cfg["model"]["init_args"].items() if k not in drop}
    return data, {**model, "vanilla_baseline": False}


def run(seed: int, out: Path, epochs: int, families, data_dir: str, only: list[str] | None = None,
        testbed: str = "default", overrides: dict | None = None) -> None:
    import lightning as L
    import torch

    from lit_iclr.cibm import CIBM, CUBConcepts

    torch.set_num_threads(1)
    data_kw, model_kw = testbed_args(testbed)
    overrides = overrides or {}
    dm = CUBConcepts(data_dir=data_dir, **data_kw)
    dm.prepare_data()
    dm.setup("fit")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"seed{seed}.jsonl"
    todo = configs(families)
    if only:
        todo = [t for t in configs(FAMILIES) if f"{t[0]}:{t[1]}" in only]
    for fam, variant, kw in todo:
        label = variant + ("@" + ",".join(f"{k}={v}" for k, v in overrides.items()) if overrides else "")
        done = {(r["family"], r["variant"]) for r in map(json.loads, path.read_text().splitlines())} if path.exists() else set()
        if (fam, label) in done:  # re-read each time: several processes may share a seed's file
            continue
        kw, variant = {**kw, **overrides}, label  # a `--set` knob: the rows carry the setting in their name
        L.seed_everything(seed, verbose=False)
        model = CIBM(input_shape=dm.input_shape, num_concepts=dm.num_concepts, num_classes=dm.num_classes,
                     concept_groups=dm.concept_groups, **{**model_kw, **kw})
        trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
        t0 = time.perf_counter()
        trainer.fit(model, datamodule=dm)
        fit_s = time.perf_counter() - t0
        trainer.test(model, datamodule=dm, verbose=False)
        res = {k: v for k, v in model.test_results.items()}
        res.update(family=fam, variant=variant, seed=seed, fit_s=fit_s, steps=trainer.global_step,
                   steps_per_s=trainer.global_step / fit_s)
        with open(path, "a") as f:
            f.write(json.dumps(res) + "\n")
        print(f"seed {seed} {fam:11s} {variant:12s} acc {res['acc']:.3f} ois {res.get('ois', float('nan')):.3f} "
              f"leak {res.get('leakage', float('nan')):+.3f} mi {res.get('mi_xc', float('nan')):.2f} fit {fit_s:.0f}s",
              flush=True)


def fmt(vals, scale=1.0, digits=1) -> str:
    vals = [v for v in vals if v is not None and np.isfinite(v)]
    if not vals:
        return "-"
    v = np.asarray(vals) * scale
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}" if len(v) > 1 else f"{v.mean():.{digits}f}"


def report(out: Path, fig_dir: Path | None) -> None:
    rows = [json.loads(line) for p in sorted(out.glob("seed*.jsonl")) for line in p.read_text().splitlines()]
    by: dict[tuple[str, str], list[dict]] = {}
    seen = set()
    for r in rows:
        key = (r["family"], r["variant"], r["seed"])
        if key not in seen:  # a config repeated by an interrupted and resumed process counts once
            seen.add(key)
            by.setdefault((r["family"], r["variant"]), []).append(r)
    order = [(f, v) for f, v, _ in configs(FAMILIES) if (f, v) in by]
    order += [k for k in sorted(by) if k not in order]  # `--set` variants
    seeds = sorted({r["seed"] for r in rows})
    print(f"seeds: {seeds}; {len(seen)} runs\n")
    print("| family | variant | task acc % | concept acc % | OIS x100 | NIS x100 | class leakage (pts) | I_hat(X;C) nats "
          "| TTI AUC % (random) | monotone random / uncert. | all groups fixed % | beta end | steps/s (x det.) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f, v in order:
        rs = sorted(by[(f, v)], key=lambda r: r["seed"])
        ref = {r["seed"]: r["steps_per_s"] for r in by.get((f, "none"), [])}
        speed = [r["steps_per_s"] / ref[r["seed"]] for r in rs if r["seed"] in ref]
        mono = (f"{sum(r.get('tti_random_monotone', 0) for r in rs):.0f}/{len(rs)} / "
                f"{sum(r.get('tti_uncertainty_monotone', 0) for r in rs):.0f}/{len(rs)}") if f != "blackbox" else "-"
        print(f"| {f} | {v} | {fmt([r['acc'] for r in rs], 100)} | {fmt([r.get('concept_acc') for r in rs], 100)} "
              f"| {fmt([r.get('ois') for r in rs], 100)} | {fmt([r.get('nis') for r in rs], 100)} "
              f"| {fmt([r.get('leakage') for r in rs], 100)} | {fmt([r.get('mi_xc') for r in rs], 1, 2)} "
              f"| {fmt([r.get('tti_random_auc') for r in rs], 100)} | {mono} "
              f"| {fmt([r.get('tti_random_full') for r in rs], 100)} | {fmt([r.get('beta') for r in rs], 1, 2)} "
              f"| {fmt(speed, 1, 2)} |")
    print("\nPaired differences IB - none (same seed), mean [95% CI] (paired t over seeds):\n")
    print("| family | IB | task acc (pts) | OIS (x100) | NIS (x100) | class leakage (pts) |")
    print("|---|---|---|---|---|---|")
    for f in FAMILIES:
        base = {r["seed"]: r for r in by.get((f, "none"), [])}
        for v in ("IB_B", "IB_E", "IB_B_flipped", "stoch_noIB"):
            rs = [r for r in by.get((f, v), []) if r["seed"] in base]
            if not rs:
                continue
            cells = []
            for key in ("acc", "ois", "nis", "leakage"):
                cells.append(str(paired_ci([100 * r[key] for r in rs], [100 * base[r["seed"]][key] for r in rs])))
            print(f"| {f} | {v} | " + " | ".join(cells) + " |")
    # the IB term alone: IB_B (and its `--set` variants) against the same stochastic joint model without it
    stoch = {r["seed"]: r for r in by.get(("joint", "stoch_noIB"), [])}
    for (f, v), runs in sorted(by.items()):
        rs = [r for r in runs if r["seed"] in stoch]
        if f != "joint" or not v.startswith("IB_B") or v == "IB_B_flipped" or not rs:
            continue
        cells = [str(paired_ci([100 * r[key] for r in rs], [100 * stoch[r["seed"]][key] for r in rs]))
                 for key in ("acc", "ois", "nis", "leakage")]
        print(f"| joint | {v} - stoch_noIB | " + " | ".join(cells) + " |")
    mi_table(by, order)
    if fig_dir is not None:
        figures(by, fig_dir)


def mi_table(by, order) -> None:
    """I_hat(X;C) on the test set at several subsample sizes M (ceiling log M) and sigma against the spread of mu."""
    rows = [(f, v) for f, v in order if any("mi_xc_m400" in r for r in by[(f, v)])]
    if not rows:
        return
    ms = (32, 100, 400, 1000)
    print("\nI_hat(X;C) on the test set vs subsample size M (log M = " + ", ".join(f"{np.log(m):.2f}" for m in ms) + "):\n")
    print("| family | variant | " + " | ".join(f"M={m}" for m in ms) + " | median sigma | mean sd(mu) |")
    print("|---|---|" + "---|" * (len(ms) + 2))
    for f, v in rows:
        rs = by[(f, v)]
        cells = [fmt([r.get("mi_xc" if m == 100 else f"mi_xc_m{m}") for r in rs], 1, 2) for m in ms]
        print(f"| {f} | {v} | " + " | ".join(cells) + f" | {fmt([r.get('sigma_median') for r in rs], 1, 3)} "
              f"| {fmt([r.get('mu_std') for r in rs], 1, 2)} |")


def figures(by, fig_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lit_iclr.cibm.plots import information_plane

    fig_dir.mkdir(parents=True, exist_ok=True)
    fams = [f for f in FAMILIES if (f, "none") in by]
    fig, axes = plt.subplots(1, len(fams), figsize=(3.2 * len(fams), 3), sharey=True, squeeze=False)
    for ax, f in zip(axes[0], fams, strict=True):
        for v in ("none", "IB_B", "IB_E"):
            rs = by.get((f, v), [])
            if rs:
                curve = 100 * np.mean([r["curves"]["random"] for r in rs], axis=0)
                ax.plot(np.arange(len(curve)), curve, marker="o", ms=3, label=v)
        ax.set_title(f, fontsize=9)
        ax.set_xlabel("intervened groups")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("task accuracy (%)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(fig_dir / "cibm_interventions.png", dpi=120)
    plt.close(fig)
    planes = {f"joint {v}": by[("joint", v)][0]["plane"] for v in ("stoch_noIB", "IB_B", "IB_E", "IB_B_flipped")
              if ("joint", v) in by and by[("joint", v)][0].get("plane")}
    if planes:
        fig = information_plane(planes)
        fig.savefig(fig_dir / "cibm_information_plane.png", dpi=120)
        plt.close(fig)


def diagnostics() -> None:
    """Two estimator checks on synthetic data with known answers: NIS's ordering, and I_hat(X;C) against closed-form MI."""
    import math

    import torch

    from lit_iclr.cibm.ib import est_mi
    from lit_iclr.cibm.leakage import niche_impurity_score

    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    c = (rng.random((300, 4)) > 0.5).astype(np.float32)
    reps = {"pure (c + noise)": c + rng.normal(0, 0.1, c.shape),
            "mixed (0.4 c + 0.6 mean(c) + noise)": 0.4 * c + 0.6 * c.mean(1, keepdims=True) + rng.normal(0, 0.1, c.shape)}
    print("NIS on 300 synthetic points, 4 concepts (higher = more impure):\n")
    print("| representation | NIS refit (default) | NIS reference code |")
    print("|---|---|---|")
    for name, x in reps.items():
        print(f"| {name} | {niche_impurity_score(x, c):.3f} | {niche_impurity_score(x, c, mode='reference'):.3f} |")
    d, ms = 15, (32, 100, 400, 1600)
    print(f"\nI_hat(X;C) (logsumexp) for mu ~ N(0, I_{d}), z = mu + sigma eps, 5 draws; "
          "grad = |d I_hat / d(mu, log sigma)| at M=100:\n")
    print("| sigma / sd(mu) | closed-form I(X;C) | " + " | ".join(f"M={m} (log M {math.log(m):.2f})" for m in ms)
          + " | grad norm M=100 | Jensen I_hat M=100 |")
    print("|---|---|" + "---|" * (len(ms) + 2))
    for sigma in (0.03, 0.1, 0.3, 1.0, 3.0):
        cells, grad, jensen = [], [], []
        for m in ms:
            vals = []
            for rep in range(5):
                g = torch.Generator().manual_seed(rep)
                mu = torch.randn(m, d, generator=g).requires_grad_()
                log_s = torch.full((m, d), math.log(sigma), requires_grad=True)
                z = mu + log_s.exp() * torch.randn(m, d, generator=g)
                mi = est_mi(mu, log_s.exp(), z=z)
                vals.append(mi.item())
                if m == 100:
                    grad.append(torch.cat([gr.flatten() for gr in torch.autograd.grad(mi, [mu, log_s])]).norm().item())
                    jensen.append(est_mi(mu, log_s.exp(), jensen=True, z=z).item())
            cells.append(fmt(vals, 1, 2))
        true = d / 2 * math.log(1 + 1 / sigma**2)
        print(f"| {sigma} | {true:.2f} | " + " | ".join(cells) + f" | {np.mean(grad):.1e} | {np.mean(jensen):.3g} |")


def parse_set(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: write KEY=VALUE, e.g. --set mi_const=30")
        out[key] = yaml.safe_load(value)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--families", nargs="+", default=list(FAMILIES))
    p.add_argument("--data-dir", default="data")
    p.add_argument("--out", type=Path, default=Path("runs/cibm_bench"))
    p.add_argument("--figures", type=Path, default=Path("seeds/figures"))
    p.add_argument("--only", nargs="+", help="run only these family:variant configs (e.g. blackbox:none joint:IB_B)")
    p.add_argument("--report", action="store_true", help="print the table and draw the figures from --out")
    p.add_argument("--diagnostics", action="store_true", help="NIS ordering and I_hat vs closed-form MI on synthetic data")
    p.add_argument("--no-figures", action="store_true", help="with --report: tables only (keep the figures of another run)")
    p.add_argument("--testbed", choices=sorted(TESTBEDS), default="default",
                   help="leakage: the data and model settings of configs/cibm_leakage.yaml")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="CIBM init args for every variant run (a scale knob, e.g. mi_const=30); values read as YAML")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.diagnostics:
        diagnostics()
        return
    if args.report:
        report(args.out, None if args.no_figures else args.figures)
        return
    for s in args.seeds:
        run(s, args.out, args.epochs, args.families, args.data_dir, args.only, args.testbed, parse_set(args.set))


if __name__ == "__main__":
    main()
