"""3DCS scoring speed: the project's GCE metrics (lit_iclr/three_dcs) against the authors' `three_dbench` (ComDec/3DCS,
release 0.1.0) on the same embeddings and reference arrays, measured in one run.

Both sides read one npz of groups written by the driver (seeded numpy): torsion scans (reference RMSD matrix D, torsion
angles, embeddings), stereoisomer sets (labels, embeddings) and energy windows (energies, embeddings), and score every
group with the metrics both codes compute, under the definitions of the released code (the project's `release` preset):

    geometry   Delta = 1 - cos; Spearman, Kendall, RBF-CKA, LIE@10, isotonic R^2, Torsion-SP, AS
    chirality  Delta = Euclidean; ES-AUC, NN@1, SCI, Davies-Bouldin, Hopkins, best-k KMeans silhouette (k <= 10)
    energy     Delta = (1 - cos)/2 in float32 stored as float16; Spearman, Kendall, CKA, isotonic R^2, EJS(5 lambdas),
               EJS-ROC-AUC, TS, Smoothness, KS, W1

What differs: the official side calls the package's functions one by one, as its per-group loops do
(`rotation.evaluation.compute_all_geometry_metrics`, `chirality.evaluation.evaluate_en_separation`,
`traj.evaluation._one_sample_worker`), leaving out the metrics the project does not compute (geometry: distance
correlation, Mantel test with 199 permutations, Kruskal stress, 100k triplets; chirality: the two boundary-clarity
scores; energy: distance correlation). Its EJS-ROC-AUC call also returns PR-AUC (one function, not separable). The
project side is `lit_iclr.three_dcs` (`geometry_metrics`, `chirality_metrics`, `energy_metrics` with their distances),
as `evaluate.score` runs them per group.

Each side runs in its own single-threaded process (OMP/MKL/OpenBLAS at 1 thread), pinned to one core (`--core`);
one block = one pass over all groups; blocks of the sides are interleaved in an order that rotates every round, with
an A/A control (a second project process). The first pass (imports warm, caches filled) is reported apart. The
per-block ratio against the official block of the same round gives the paired 95% CI; run the script several times
(`--runs`) for the spread across runs.

The official code is never fetched or installed by this script (and never used by the tests). To get it:

    git clone https://github.com/ComDec/3DCS ~/src/3dcs          # tested at 06dee1c
    python3.11 -m venv /tmp/dcsvenv && /tmp/dcsvenv/bin/pip install numpy scipy pandas scikit-learn tqdm lmdb rdkit
    /tmp/dcsvenv/bin/pip install --no-deps -e ~/src/3dcs           # three_dbench without its data/plot extras

    .venv/bin/python benchmarks/three_dcs_speed.py --vs-official ~/src/3dcs --official-python /tmp/dcsvenv/bin/python
    .venv/bin/python benchmarks/three_dcs_speed.py --score-npz f.npz --vs-official ~/src/3dcs \
        --official-python /tmp/dcsvenv/bin/python                    # both sides' per-group values of one npz, as JSON
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------------- shared data
def groups_of(path: str) -> dict[str, list[dict]]:
    """{axis: [group arrays]} from an npz with keys `<axis>/<k>/<array>` (arrays: D, deg, Z / y, Z / E, Z)."""
    out: dict[str, dict[int, dict]] = {}
    with np.load(path) as f:
        for key in f.files:
            axis, k, name = key.split("/")
            out.setdefault(axis, {}).setdefault(int(k), {})[name] = f[key]
    return {axis: [g[k] for k in sorted(g)] for axis, g in out.items()}


def write_groups(path: Path, n_scans: int, scan_len: int, n_stereo: int, n_windows: int, window: int, dim: int,
                 seed: int = 0) -> Path:
    """Synthetic groups of the published sizes (scans of 15-degree steps, ~13 conformers per stereo parent, MD windows):
    embeddings that follow the reference distance partly, so no metric sits at a degenerate value."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for k in range(n_scans):
        deg = np.arange(scan_len) * (360.0 / scan_len)
        phi = np.deg2rad(deg)
        coords = np.stack([np.cos(phi), np.sin(phi)], 1) + 0.05 * rng.normal(size=(scan_len, 2))
        D = np.sqrt(((coords[:, None] - coords[None]) ** 2).sum(-1))
        base = rng.normal(size=(2, dim))
        arrays |= {f"geometry/{k}/D": D, f"geometry/{k}/deg": deg,
                   f"geometry/{k}/Z": 1.0 + coords @ base + 0.3 * rng.normal(size=(scan_len, dim))}
    for k in range(n_stereo):
        n_iso = 2 + k % 3
        y = np.repeat(np.arange(n_iso), rng.integers(3, 6, size=n_iso))
        centres = rng.normal(size=(n_iso, dim))
        arrays |= {f"chirality/{k}/y": y, f"chirality/{k}/Z": 0.5 * centres[y] + rng.normal(size=(len(y), dim))}
    for k in range(n_windows):
        state = np.cumsum(rng.normal(size=(window, 3)), 0) / np.sqrt(window)
        E = 3.0 * np.sin(state).sum(1) + 0.1 * rng.normal(size=window)
        arrays |= {f"energy/{k}/E": E,
                   f"energy/{k}/Z": 1.0 + state @ rng.normal(size=(3, dim)) + 0.5 * rng.normal(size=(window, dim))}
    np.savez(path, **arrays)
    return path


# ----------------------------------------------------------------------------------------------------------- scorers
def official_scorer():
    """`three_dbench`'s per-group routines: {axis: function(group arrays) -> metric row}."""
    from three_dbench.chirality import evaluation as chi
    from three_dbench.common import metrics as M
    from three_dbench.rotation.evaluation import CONF, pairwise_distances_from_embeddings
    from three_dbench.traj import evaluation as traj

    def geometry(g):  # compute_all_geometry_metrics(D, Delta=..., deg=...) without dCor, Mantel, stress, triplets
        D, deg = np.asarray(g["D"], np.float64), np.asarray(g["deg"], np.float64)
        Delta = pairwise_distances_from_embeddings(g["Z"], metric="cosine")
        k = int(min(max(1, CONF["lie_k"]), D.shape[0] - 1))
        return {"A1_spearman": M.spearman_correlation(D, Delta, max_pairs=None, random_state=0),
                "A2_kendall": M.kendall_correlation(D, Delta, max_pairs=CONF["max_pairs_kendall"], random_state=0),
                "G_cka_rbf": M.cka_rbf(D, Delta), "H_LIE@k": M.local_isometry_error(D, Delta, k=k, aggregation="mean"),
                "J_isotonic_R2": M.isotonic_r2(D, Delta), "torsion_sp": M.torsion_embedding_spearman(Delta, deg),
                "AS": M.angular_smoothness(Delta, deg, circular=True)["AS"]}

    def chirality(g):  # evaluate_en_separation's supervised branch for one molecule, without the clarity scores
        X, y = np.asarray(g["Z"], np.float64), np.asarray(g["y"])
        D = chi.distance_matrix_for_subset(X, np.arange(len(y)), "continuous")
        silu, _, _ = chi.best_unsup_silhouette_from_D_or_X(mode="continuous", D=D, X=X, kmin=2, kmax=min(10, len(y) - 1),
                                                           fp_backend="custom")
        return {"ES_AUC": chi.auc_diff_pairs_large_when_different(D, y), "NN1_acc": chi.nn1_leave_one_out_from_D(D, y),
                "SCI": chi.silhouette_with_labels_from_D(D, y), "DBI": chi.davies_bouldin_from_D(D, y, mode="continuous"),
                "Hopkins": chi.hopkins_statistic(X), "SCI_unsup": silu}

    def energy(g):  # _one_sample_worker for one embedding: Delta, then the three metric calls (dCor left out)
        E = np.asarray(g["E"], np.float64)
        Dc = traj.pairwise_distances_from_embeddings_large(g["Z"], metric="cosine", out_mode="condensed",
                                                           progress=False)
        Dref = traj.vector_to_absdiff_condensed(E, dtype=np.float32)
        out = {"spearman": traj.spearman_from_condensed(Dref, Dc), "kendall": traj.kendall_from_condensed(Dref, Dc),
               "iso_R2": traj.isotonic_r2_from_condensed(Dref, Dc), "cka_rbf": traj.cka_rbf_from_condensed(Dref, Dc)}
        ejs = traj.energy_jump_sensitivity_auto(E, Dc, lam_grid=(0.1, 0.5, 1.0, 2.0, 3.0), lam_rep=2.0,
                                                robust_sigma=True, dist_quantile=0.75, use_global_quantile=True)
        out |= {k: float(v) for k, v in ejs.items() if k.startswith("EJS")}
        out["ROC_AUC"] = float(traj.ejs_auc_halfnormal(Dc, E, lam=2.0)["ROC_AUC"])
        out["Smoothness"] = float(traj.energy_embedding_smoothness(E, Dc)["Smoothness"])
        out["TS"] = traj.thresholded_smoothness(Dc, E, eps=1e-12)["TS"]
        ks = traj.ks_wasserstein_against_energy_diff(Dc, E)
        return out | {"KS": ks["KS"], "W1": ks["W1"]}

    return {"geometry": geometry, "chirality": chirality, "energy": energy}


def project_scorer():
    """The project's per-group metrics (`evaluate.score`'s calls) under the `release` definitions: {axis: function}."""
    from lit_iclr.three_dcs.chirality import chirality_metrics, chirality_spec
    from lit_iclr.three_dcs.distances import representation_distance
    from lit_iclr.three_dcs.energy import energy_metrics, energy_spec
    from lit_iclr.three_dcs.geometry import geometry_metrics, geometry_spec

    gs, cs, es = geometry_spec("release"), chirality_spec("release"), energy_spec("release")
    fns = {"geometry": lambda g: geometry_metrics(g["D"], representation_distance(g["Z"], "cosine"), g["deg"], gs, g["Z"]),
           "chirality": lambda g: chirality_metrics(representation_distance(g["Z"], "euclidean"), g["y"], g["Z"], cs),
           "energy": lambda g: energy_metrics(g["E"], representation_distance(g["Z"], "stored_half_cosine"), es)}
    return fns


# ------------------------------------------------------------------------------------------------------------ workers
def _single_thread_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                VECLIB_MAXIMUM_THREADS="1", NUMEXPR_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def worker(side: str, data: str, repo: str) -> None:
    """JSON lines: {"passes": n} -> {"wall": s, "cpu": s, "axes": {axis: cpu s}}; {"values": 1} -> the per-group metric
    rows of one pass."""
    import warnings

    warnings.filterwarnings("ignore")  # both codes warn on near-constant inputs; the protocol stream stays clean
    if side == "official":
        sys.path.insert(0, str(Path(repo) / "src"))
    groups = groups_of(data)
    fns = official_scorer() if side == "official" else project_scorer()
    axes = {axis: 0.0 for axis in groups}

    def one_pass() -> dict[str, list[dict]]:
        rows = {}
        for axis, gs in groups.items():
            c = time.process_time()
            rows[axis] = [fns[axis](g) for g in gs]
            axes[axis] += time.process_time() - c
        return rows

    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # everything else printed goes to stderr
    for line in sys.stdin:
        req = json.loads(line)
        if "values" in req:
            proto.write(json.dumps(one_pass(), default=float) + "\n")
        else:
            t, c = time.perf_counter(), time.process_time()
            for axis in axes:
                axes[axis] = 0.0
            for _ in range(req["passes"]):
                one_pass()
            proto.write(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c, "axes": axes}) + "\n")
        proto.flush()


def Worker(python: str, side: str, data: str, repo: str, core: int | None):
    """One side in its own process, pinned to `core` (`core.timing.PinnedWorker`)."""
    from lit_iclr.core.timing import PinnedWorker  # the driver's import: the official side's Python has no lit_iclr

    return PinnedWorker([python, __file__, "--worker", side, data, repo], _single_thread_env(), ROOT, core)


# ----------------------------------------------------------------------------------------------------------- driver
def max_abs_difference(a: dict, b: dict) -> tuple[float, str]:
    """Largest |a - b| over the metrics both sides report (NaN on both sides counts as equal)."""
    worst, where = 0.0, ""
    for axis in a:
        for k, (ra, rb) in enumerate(zip(a[axis], b[axis], strict=True)):
            for m in ra.keys() & rb.keys():
                x, y = float(ra[m]), float(rb[m])
                d = 0.0 if (np.isnan(x) and np.isnan(y)) else abs(x - y)
                if not d <= worst:
                    worst, where = d, f"{axis}[{k}].{m}"
    return worst, where


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vs-official", default="", help="a checkout of github.com/ComDec/3DCS")
    p.add_argument("--official-python", default=sys.executable, help="python of an environment with three_dbench's deps")
    p.add_argument("--size", default="40,24,40,1,2000,512",
                   help="scans, conformers per scan, stereo parents, energy windows, frames per window, embedding dim")
    p.add_argument("--passes", type=int, default=1, help="passes over all groups per timed block")
    p.add_argument("--repeats", type=int, default=6, help="interleaved blocks per side")
    p.add_argument("--runs", type=int, default=1, help="separate runs (fresh processes), for the spread across runs")
    p.add_argument("--core", type=int, default=1, help="pin every side to this CPU core (-1: no pinning)")
    p.add_argument("--score-npz", default="", help="print both sides' per-group values on this npz and exit")
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    from lit_iclr.core.stats import ratio_ci

    core = None if args.core < 0 else args.core
    if args.score_npz:
        sides = {"project": Worker(sys.executable, "project", args.score_npz, "", core)}
        if args.vs_official:
            sides["official"] = Worker(args.official_python, "official", args.score_npz, args.vs_official, core)
        values = {name: w.ask({"values": 1}) for name, w in sides.items()}
        for w in sides.values():
            w.close()
        print(json.dumps(values, indent=1))
        if "official" in values:
            worst, where = max_abs_difference(values["project"], values["official"])
            print(f"max |project - official|: {worst:.3g} at {where}")
        return
    scans, scan_len, stereo, windows, window, dim = (int(v) for v in args.size.split(","))
    data = str(write_groups(Path(tempfile.mkdtemp(prefix="three_dcs_speed_")) / "groups.npz", scans, scan_len, stereo,
                            windows, window, dim))
    runs = []
    for run in range(args.runs):
        sides = {}
        if args.vs_official:
            sides["official"] = Worker(args.official_python, "official", data, args.vs_official, core)
        sides["project"] = Worker(sys.executable, "project", data, "", core)
        sides["project (A/A)"] = Worker(sys.executable, "project", data, "", core)
        values = {name: w.ask({"values": 1}) for name, w in sides.items()}  # also the first, untimed-in-blocks pass
        if "official" in values:
            diff = max_abs_difference(values["project"], values["official"])
            print(f"[run {run}] max |project - official| over all groups and metrics: {diff[0]:.3g} ({diff[1]})")
        first = {name: w.ask({"passes": 1})["cpu"] for name, w in sides.items()}
        cpu = {name: [] for name in sides}
        axes = {name: {} for name in sides}
        names = list(sides)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                res = sides[name].ask({"passes": args.passes})
                cpu[name].append(res["cpu"] / args.passes)
                for axis, v in res["axes"].items():
                    axes[name].setdefault(axis, []).append(v / args.passes)
        for w in sides.values():
            w.close()
        print(f"[run {run}] " + json.dumps({"first_pass_cpu_s": first, "cpu_s_per_pass": cpu, "axes": axes}), flush=True)
        runs.append((cpu, axes))
    ref = "official" if args.vs_official else "project"
    pinned = f"pinned to core {core}" if core is not None else "not pinned"
    print(f"\n{args.runs} run(s) x {args.repeats} interleaved blocks per side ({pinned}; load {os.getloadavg()[0]:.1f}); "
          f"size {args.size}; CPU s per pass over all groups\n")
    axis_names = list(runs[0][1][ref])
    print(f"| run | side | CPU s / pass (median) | ratio vs {ref} | per-block ratio, mean [paired 95% CI] | "
          + " | ".join(f"{a}: s (ratio)" for a in axis_names) + " |")
    print("|---" * (5 + len(axis_names)) + "|")
    ratios: dict[str, list[float]] = {}
    for k, (cpu, axes) in enumerate(runs):
        for name, v in cpu.items():
            med, ref_med = statistics.median(v), statistics.median(cpu[ref])
            ci = ratio_ci(v, cpu[ref]) if name != ref else "-"
            ratios.setdefault(name, []).append(med / ref_med)
            per_axis = " | ".join(f"{statistics.median(axes[name][a]):.3f} "
                                  f"({statistics.median(axes[name][a]) / statistics.median(axes[ref][a]):.2f})"
                                  for a in axis_names)
            print(f"| {k} | {name} | {med:.3f} | {med / ref_med:.3f} | {ci} | {per_axis} |")
    for k, (cpu, _) in enumerate(runs):
        print(f"A/A control, run {k}: project (A/A) / project per-block ratio {ratio_ci(cpu['project (A/A)'], cpu['project'])}")
    if args.runs > 1:
        print("\nspread across runs (ratio of medians): " + "; ".join(
            f"{n}: {min(r):.3f}-{max(r):.3f} (mean {statistics.mean(r):.3f})" for n, r in ratios.items() if n != ref))


if __name__ == "__main__":
    main()
