"""Golden values of the released reference code: the project's GCE scores of small fixed embeddings, written in the
published layout (`{rotation,chirality,traj}.npz`, array `embeddings`, dataset row order) and read back by the project's
reader, equal the authors' `three_dbench` on the same arrays.

GOLDEN was computed once with three_dbench (github.com/ComDec/3DCS at 06dee1c, release 0.1.0; numpy 2.4.6, scipy 1.17.1,
scikit-learn 1.9.1) by writing `fixture_groups()` to an npz in the layout of `benchmarks/three_dcs_speed.py` (keys
`<axis>/<k>/<array>`; the energy group holds the scored window, frames 0-59) and running

    .venv/bin/python benchmarks/three_dcs_speed.py --score-npz golden.npz --vs-official ~/src/3dcs \
        --official-python /tmp/dcsvenv/bin/python

whose `official` rows call the package's metric functions as its per-group loops do. The official code is not needed to
run this test.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from lit_iclr.three_dcs import formats
from lit_iclr.three_dcs.evaluate import Benchmark, score

SCANS = (12, 16)          # conformers per torsion scan (>= 11: Kendall in every version)
STEREO = ((4, 4, 4), (5, 5))  # conformers per stereoisomer of each parent (>= 10 rows: Hopkins defined)
FRAMES, WINDOW = 61, 60   # one trajectory; window_starts(61, 1, 60) = [0]: frames 0-59 are scored
DIM = 8


def _wave(n: int, dim: int, a: float, b: float) -> np.ndarray:
    """A deterministic (n, dim) pattern without ties (no random generator: identical under every numpy)."""
    i, d = np.arange(n)[:, None], np.arange(dim)[None, :]
    return np.sin(a * (i + 1) * (d + 1) + b * d * d) + 0.3 * np.cos(b * (i + 2) + a * (d + 1) ** 1.5)


def fixture_groups() -> dict[str, list[dict[str, np.ndarray]]]:
    """Reference arrays and embeddings per group: scans (D from a perturbed circle of torsion angles, embeddings that
    partly follow it), stereo parents (class centres plus spread), one energy trajectory (embeddings follow the state)."""
    mix = _wave(2, DIM, 0.37, 0.11)
    out: dict[str, list[dict[str, np.ndarray]]] = {"geometry": [], "chirality": [], "energy": []}
    for k, n in enumerate(SCANS):
        deg = np.arange(n) * (360.0 / n)
        phi = np.deg2rad(deg)
        coords = np.c_[np.cos(phi), np.sin(phi)] + 0.05 * _wave(n, 2, 0.9 + k, 0.3)
        D = np.sqrt(((coords[:, None] - coords[None]) ** 2).sum(-1))
        Z = 1.0 + coords @ mix + 0.3 * _wave(n, DIM, 0.53 + 0.1 * k, 0.7)
        out["geometry"].append({"D": D, "deg": deg, "Z": Z})
    for k, sizes in enumerate(STEREO):
        y = np.repeat(np.arange(len(sizes)), sizes)
        centres = _wave(len(sizes), DIM, 1.1 + k, 0.2)
        out["chirality"].append({"y": y, "Z": 0.8 * centres[y] + _wave(len(y), DIM, 0.61 + 0.2 * k, 0.45)})
    t = np.arange(FRAMES)
    state = np.c_[np.sin(0.21 * t), np.cos(0.13 * t + 0.4), np.sin(0.05 * t * t / FRAMES)]
    E = 3.0 * np.sin(state).sum(1) + 0.1 * np.cos(1.7 * t)
    Z = 1.0 + state @ _wave(3, DIM, 0.29, 0.5) + 0.4 * _wave(FRAMES, DIM, 0.77, 0.35)
    out["energy"].append({"E": E, "Z": Z})
    return out


# three_dbench's values (see the module docstring), group by group
GOLDEN = {
    "geometry": [
        {"A1_spearman": 0.8467800855860559, "A2_kendall": 0.6512820512820513, "G_cka_rbf": 0.9085213910546848,
         "H_LIE@k": 0.3672681021467536, "J_isotonic_R2": 0.7132700428357386, "torsion_sp": 0.8579304558845327,
         "AS": 0.18040702366927455},
        {"A1_spearman": 0.9034585735120492, "A2_kendall": 0.722689075630252, "G_cka_rbf": 0.9218666384246135,
         "H_LIE@k": 0.43951219771024386, "J_isotonic_R2": 0.8527306872537288, "torsion_sp": 0.896225855261817,
         "AS": 0.1555898864697326},
    ],
    "chirality": [
        {"ES_AUC": 0.8530092592592592, "NN1_acc": 0.5833333333333334, "SCI": 0.18460720754245707,
         "DBI": 1.3706723823366607, "Hopkins": 0.48827077552197984, "SCI_unsup": 0.22317580350161326},
        {"ES_AUC": 0.9420000000000001, "NN1_acc": 1.0, "SCI": 0.2844990734993752, "DBI": 1.074749050006151,
         "Hopkins": 0.46029363747278856, "SCI_unsup": 0.2844990734993752},
    ],
    "energy": [
        {"spearman": 0.5478135141196282, "kendall": 0.4053236213625496, "iso_R2": 0.3278922410454007,
         "cka_rbf": 0.2525003478596017, "EJS_lam0p1": 0.26127239036442246, "EJS_num_jumps_lam0p1": 1619.0,
         "EJS_lam0p5": 0.3088768115942029, "EJS_num_jumps_lam0p5": 1104.0, "EJS_lam1": 0.48987108655616945,
         "EJS_num_jumps_lam1": 543.0, "EJS_lam2": 0.9555555555555556, "EJS_num_jumps_lam2": 45.0,
         "EJS_lam3": math.nan, "EJS_num_jumps_lam3": 0.0, "EJS": 0.9555555555555556, "ROC_AUC": 0.8987197091154564,
         "Smoothness": 0.91541498265957, "TS": 0.4436909705180875, "KS": 0.903954802259887, "W1": 3.5269338973964866},
    ],
}

TOL = 1e-10  # measured: 1.7e-13 at most


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    groups = fixture_groups()
    folder = tmp_path_factory.mktemp("golden")
    bench_groups = {}
    for axis, config in (("geometry", "rotation"), ("chirality", "chirality"), ("energy", "traj")):
        Zs, start, made = [], 0, []
        for k, g in enumerate(groups[axis]):
            n = len(g["Z"])
            made.append(formats.Group(key=f"{config}-{k}", mols=[None] * n, rows=slice(start, start + n),
                                      torsion_deg=g.get("deg"), labels=g.get("y"), energies=g.get("E")))
            Zs.append(g["Z"])
            start += n
        np.savez(folder / f"{config}.npz", embeddings=np.concatenate(Zs))
        bench_groups[config] = made
    bench = Benchmark(bench_groups["rotation"], bench_groups["chirality"], bench_groups["traj"])
    for g, arrays in zip(bench.rotation, groups["geometry"], strict=True):
        bench.rmsd[g.key] = arrays["D"]  # the reference RMSD given, as the published rotation rows carry it
    files = {config: formats.read_embeddings(folder / f"{config}.npz", bench.n_rows(config))
             for config in ("rotation", "chirality", "traj")}
    return score(bench, files=files, version="release", window=WINDOW, n_windows=1)["rows"]


@pytest.mark.parametrize("axis", ["geometry", "chirality", "energy"])
def test_release_scores_equal_three_dbench(scored, axis):
    assert len(scored[axis]) == len(GOLDEN[axis])
    for k, (ours, ref) in enumerate(zip(scored[axis], GOLDEN[axis], strict=True)):
        for metric, value in ref.items():
            got = ours[metric]
            if math.isnan(value):
                assert math.isnan(got), (axis, k, metric)
            else:
                assert got == pytest.approx(value, abs=TOL, rel=0), (axis, k, metric, got, value)


def test_golden_fixture_is_not_degenerate(scored):
    """Every golden metric is finite and off its trivial values, so each comparison above tests a computation."""
    for axis, rows in GOLDEN.items():
        for row in rows:  # EJS at lambda = 3 has no jump in this window: NaN on both sides (checked above)
            assert all(math.isfinite(v) for k, v in row.items() if k != "EJS_lam3"), (axis, row)
    assert all(0.1 < r["A1_spearman"] < 0.99 for r in GOLDEN["geometry"])
    assert all(0.5 < r["ES_AUC"] < 1.0 for r in GOLDEN["chirality"])
