"""T-Tamer: recall vs no-recall exit policies on the synthetic family and on real exit tables.

    .venv/bin/python benchmarks/ttamer.py              # nested: 5 seeded networks, cascade: 3 (2000 images)
    .venv/bin/python benchmarks/ttamer.py --quick      # synthetic family + 2 nested networks

1. The doubling family (policies/synthetic.py): optimal no-recall / optimal recall objective as the number of stages
   grows, from the dynamic programs, checked against brute force over every stopping rule where that is feasible.
2. Real exit tables (a multi-exit timm network and a cascade of timm models trained on Fashion-MNIST): every policy's
   mean accuracy over the cost range (area under its accuracy-cost hull / range). Seed s trains its own network(s)
   (initialisation and data order from s; cached in data/ keyed by the training settings) and then re-splits its
   10,000 exit rows into calibration and test halves with seed s, so the CIs hold training and split variance. The
   Laplace smoothing is chosen per seed on the calibration half (`ExitPolicies(smoothing=None)`), never the test half.
   The cascade trains on fewer images for one epoch (`--cascade_images`, `--cascade_epochs`) to keep it in minutes.
3. Speed: policy fit time and per-query decision time vs the threshold rule.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from lit_iclr.core.stats import mean_std, paired_ci
from lit_iclr.ttamer import ExitPolicies, ExitTableData
from lit_iclr.ttamer.curves import mean_accuracy
from lit_iclr.ttamer.exits import ExitTable, overthinking_rate
from lit_iclr.ttamer.policies import dp_policy, expected_value, threshold_policy
from lit_iclr.ttamer.synthetic import doubling_instance, enumerate_optimum


def synthetic_table() -> None:
    print("## No-recall vs recall optimum on the doubling family (lambda = 1, cost 1e-3 per stage)\n")
    print("| stages S | recall optimum | no-recall optimum | ratio | 2/(S+1) | brute force agrees |")
    print("|---|---|---|---|---|---|")
    for s in (2, 3, 4, 8, 16, 32):
        model = doubling_instance(s, eps=1e-3 * 2.0 ** -(s - 1))   # costs scaled with the values
        r, n = expected_value(model, 1.0, True), expected_value(model, 1.0, False)
        check = "-"
        if s <= 4:
            ok = abs(enumerate_optimum(model, 1.0, True) - r) < 1e-12 and abs(enumerate_optimum(model, 1.0, False) - n) < 1e-12
            check = "yes" if ok else "NO"
        print(f"| {s} | {r:.4g} | {n:.4g} | {n / r:.4f} | {2 / (s + 1):.4f} | {check} |")


def resplit(cal: ExitTable, test: ExitTable, seed: int) -> tuple[ExitTable, ExitTable]:
    logits, labels = torch.cat([cal.logits, test.logits]), torch.cat([cal.labels, test.labels])
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    half = len(labels) // 2
    pick = lambda idx: ExitTable(logits[idx], labels[idx], cal.cost, cal.kind, cal.latency)  # noqa: E731
    return pick(perm[:half]), pick(perm[half:])


def real_table(source: str, seeds: list[int], train_images: int, epochs: int) -> dict[str, list[float]]:
    """One seeded network (or cascade) per seed, re-split with the same seed; returns {policy: [area per seed]}."""
    nested = source == "nested"
    results: dict[str, list[float]] = {}
    acc, anyr, over, chosen = [], [], [], []
    for seed in seeds:
        dm = ExitTableData(source=source, seed=seed, train_images=train_images, epochs=epochs)
        dm.prepare_data()  # trains the network(s) of this seed once
        dm.setup("fit")
        cal, test = resplit(dm.calibration, dm.test, seed)
        correct = torch.cat([cal.correct(), test.correct()])
        acc.append(correct.float().mean(0))
        anyr.append(float(correct.any(1).float().mean()))
        over.append(overthinking_rate(test))
        m = ExitPolicies(stages=dm.stages)  # smoothing: null, chosen on `cal` alone
        m.fit_policies(cal.logits, cal.labels, cal.cost)
        chosen.append(float(m.smoothing_used))
        curves = m.curves(test.logits, test.labels, nested)
        lo, hi = float(cal.cost[0]), float(cal.cost.sum())
        for k, v in curves.items():
            results.setdefault(k, []).append(mean_accuracy(v, lo, hi))
        print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in results.items())
              + f" (smoothing {chosen[-1]:g})", flush=True)
    accs = torch.stack(acc)
    print(f"\n## {source} exit tables ({', '.join(dm.backbones)}; {dm.stages} stages; {train_images} training "
          f"images x {epochs} epochs; stage costs {', '.join(f'{c:.3g}' for c in dm.calibration.cost.tolist())} "
          f"x stage 1's FLOPs; seeds {', '.join(map(str, seeds))})\n")
    print(f"Accuracy per stage (mean ± std over networks): "
          f"{', '.join(mean_std(accs[:, k].tolist(), 3) for k in range(accs.shape[1]))}; any stage right: "
          f"{mean_std(anyr, 3)}; overthinking (a later stage wrong where an earlier one was right): "
          f"{mean_std(over, 3)} of test queries; Laplace smoothing chosen on calibration: "
          f"{', '.join(f'{c:g}' for c in chosen)}\n")
    print("| policy | mean accuracy over the cost range (area / range) |")
    print("|---|---|")
    for k, v in results.items():
        print(f"| {k} | {mean_std(v, 4)} |")
    n = len(seeds)
    print(f"\nrecall - no-recall (paired over {n} seeded networks, 95% CI): "
          f"{paired_ci(results['recall'], results['no_recall'])}")
    print(f"recall - threshold: {paired_ci(results['recall'], results['threshold'])}")
    print(f"no-recall - threshold: {paired_ci(results['no_recall'], results['threshold'])}")
    if not nested:
        print(f"pandora - recall (fixed order): {paired_ci(results['pandora'], results['recall'])}")
    return results


def speed(train_images: int, epochs: int) -> None:
    dm = ExitTableData(source="nested", train_images=train_images, epochs=epochs)  # seed 0's network
    dm.prepare_data()
    dm.setup("fit")
    m = ExitPolicies(stages=dm.stages)
    t0 = time.perf_counter()
    m.fit_policies(dm.calibration.logits, dm.calibration.labels, dm.calibration.cost)
    fit = time.perf_counter() - t0
    from lit_iclr.ttamer.calibrate import calibrated_probs
    probs = calibrated_probs(dm.test.logits, m.temperatures)
    bins = m._bins(probs)
    conf = probs.max(-1).values
    model = m.markov()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        dp_policy(model, bins, 0.01, True)
    t_dp = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        threshold_policy(conf, model.cost, 0.9)
    t_th = (time.perf_counter() - t0) / reps
    n = len(bins)
    print(f"\n## Speed\n\nFit (temperatures, Markov model, recall stop tables) on {len(dm.calibration.labels)} queries: "
          f"{fit * 1000:.0f} ms. Recall DP policy (solve + decide, all {n} test queries at once): {t_dp * 1e6 / n:.2f} us "
          f"per query, {t_dp / t_th:.1f}x the threshold rule ({t_th * 1e6 / n:.3f} us per query).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="nested networks")
    ap.add_argument("--cascade_seeds", type=int, nargs="+", default=[0, 1, 2])
    # smaller than the config's 8000 images x 2 epochs so that 5 + 3 seeded trainings fit in minutes on 2 CPU cores
    ap.add_argument("--images", type=int, default=2000, help="training images of the nested network")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--cascade_images", type=int, default=2000)
    ap.add_argument("--cascade_epochs", type=int, default=1)
    ap.add_argument("--skip", nargs="*", default=[], choices=("synthetic", "nested", "cascade", "speed"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    np.set_printoptions(precision=4)
    if "synthetic" not in args.skip:
        synthetic_table()
    if "nested" not in args.skip:
        real_table("nested", args.seeds[:2] if args.quick else args.seeds, args.images, args.epochs)
    if not args.quick and "cascade" not in args.skip:
        real_table("cascade", args.cascade_seeds, args.cascade_images, args.cascade_epochs)
    if "speed" not in args.skip:
        speed(args.images, args.epochs)


if __name__ == "__main__":
    main()
