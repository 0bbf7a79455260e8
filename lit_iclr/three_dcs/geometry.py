"""Geometry axis (torsion scans): reference RMSD `D` vs representation distance `Delta` within one molecule.

Metrics of Table 1 (keys of the reference outputs): Spearman `A1_spearman`, Kendall `A2_kendall`, RBF-CKA `G_cka_rbf`,
isotonic R^2 `J_isotonic_R2`, LIE@k `H_LIE@k`, Torsion-SP `torsion_sp`, angular smoothness `AS`. Two versions:
`paper` reproduces the published runs, `v2` follows the paper text (App. C.3/C.4), `release` the released package's
code (three_dbench 0.1.0); every difference is a field of `GeometrySpec`, so each can be switched on its own.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.stats import kendalltau, spearmanr

from .distances import EPS, centred_cka, circular_distance, cka_rbf, condensed, isotonic_r2

AS_VARIANTS = ("mean_delta_circular", "median_delta_circular", "median_halfdelta_circular", "median_dz_linear")


@dataclass(frozen=True)
class GeometrySpec:
    """Per-molecule geometry metric definitions (see `PRESETS` for the two published versions).

    lie_k: neighbours per conformer in LIE@k (capped at n - 1).
    lie_include_self: neighbour set `argpartition(D)[:, :k]` that contains the conformer itself (paper) or k others (v2).
    lie_unit_range: rescale a cosine `Delta` to [0, 1] ((1 - cos)/2) before LIE (paper).
    lie_min_conformers: molecules with fewer conformers get NaN LIE.
    as_variant: AS aggregation (see `AS_VARIANTS`): paper `median_halfdelta_circular`, v2 `median_dz_linear`.
    cka: `paper_run` (`exp(-d^2 / (median d + eps)^2)`) or `median_2sigma2` (`exp(-d^2 / 2 sigma^2)`, App. C.3).
    isor2: `reference_on_model` (fit D = f(Delta), App. C.3) or `model_on_reference` (release 0.1.0).
    isor2_guard: NaN for < 2 pairs or constant Delta (v2); paper runs had no guard.
    kendall_min_conformers: Kendall only for molecules with at least this many conformers (paper runs: 11).
    """

    lie_k: int = 3
    lie_include_self: bool = False
    lie_unit_range: bool = False
    lie_min_conformers: int = 3
    as_variant: str = "median_dz_linear"
    cka: str = "median_2sigma2"
    isor2: str = "reference_on_model"
    isor2_guard: bool = True
    kendall_min_conformers: int = 0


PRESETS = {
    "paper": GeometrySpec(lie_k=10, lie_include_self=True, lie_unit_range=True, lie_min_conformers=2,
                          as_variant="median_halfdelta_circular", cka="paper_run", isor2="reference_on_model",
                          isor2_guard=False, kendall_min_conformers=11),
    "v2": GeometrySpec(),
    # the released package (three_dbench 0.1.0, rotation/evaluation.py + common/metrics.py): its shared CKA, LIE on
    # 1 - cos, mean AS without halving, isotonic fit of Delta on D, Kendall for every molecule
    "release": GeometrySpec(lie_k=10, lie_include_self=True, lie_unit_range=False, lie_min_conformers=2,
                            as_variant="mean_delta_circular", cka="median_2sigma2", isor2="model_on_reference",
                            isor2_guard=True, kendall_min_conformers=0),
}


def geometry_spec(version: str = "paper", **overrides) -> GeometrySpec:
    """The preset of `version` (`paper` | `v2` | `release`) with single definitions overridden (e.g. `lie_k=5`)."""
    if version not in PRESETS:
        raise ValueError(f"metric version must be one of {tuple(PRESETS)}, got {version!r}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides.get("as_variant", AS_VARIANTS[0]) not in AS_VARIANTS:
        raise ValueError(f"as_variant must be one of {AS_VARIANTS}")
    return replace(PRESETS[version], **overrides)


def lie_at_k(D: np.ndarray, Delta: np.ndarray, k: int, include_self: bool) -> float:
    """LIE@k = mean_i RMS_j( D_ij / mean D_i. - Delta_ij / mean Delta_i. ) over the k nearest neighbours j of i in D."""
    n = D.shape[0]
    if n <= 1:
        return float("nan")
    k = int(min(max(1, k), n - 1))
    if include_self:
        nbrs = np.argpartition(D, kth=k, axis=1)[:, :k]
    else:
        Dm = D.copy()
        np.fill_diagonal(Dm, np.inf)
        nbrs = np.argsort(Dm, axis=1, kind="stable")[:, :k]
    Di = np.take_along_axis(D, nbrs, 1)
    Xi = np.take_along_axis(Delta, nbrs, 1)
    diff = Di / (Di.mean(1, keepdims=True) + EPS) - Xi / (Xi.mean(1, keepdims=True) + EPS)
    return float(np.sqrt((diff * diff).mean(1)).mean())


def angular_smoothness(torsion_deg: np.ndarray, variant: str, Delta: np.ndarray, Z: np.ndarray | None = None) -> float:
    """AS: representation change per radian between conformers adjacent in torsion angle.

    `*_circular` includes the wrap-around step (largest angle back to the smallest) and uses circular increments;
    `median_dz_linear` (App. C.4) takes `||z_{i+1} - z_i|| / |phi_{i+1} - phi_i|` without wrap-around (Delta for bit
    vectors). Steps under 1e-9 rad are ignored.
    """
    phi = np.deg2rad(np.asarray(torsion_deg, dtype=np.float64).reshape(-1))
    n = phi.size
    if n < 2:
        return float("nan")
    order = np.argsort(phi, kind="stable")
    if variant.endswith("circular"):
        i, j = order, np.roll(order, -1)
        dphi = np.abs(phi[j] - phi[i])
        dphi = np.minimum(dphi, 2 * np.pi - dphi)
    else:
        i, j = order[:-1], order[1:]
        dphi = np.abs(phi[j] - phi[i])
    if variant == "median_dz_linear" and Z is not None and np.issubdtype(np.asarray(Z).dtype, np.floating):
        step = np.linalg.norm(np.asarray(Z, np.float64)[j] - np.asarray(Z, np.float64)[i], axis=1)
    else:
        step = Delta[i, j] * (0.5 if variant == "median_halfdelta_circular" else 1.0)
    keep = dphi > 1e-9
    if not keep.any():
        return float("nan")
    agg = np.mean if variant == "mean_delta_circular" else np.median
    return float(agg(step[keep] / dphi[keep]))


def cka_paper_run(D: np.ndarray, Delta: np.ndarray) -> float:
    """RBF-CKA of the published geometry runs: `K = exp(-d^2 / (median(d) + 1e-12)^2)` per matrix, HKH centring."""
    if D.shape[0] < 2:
        return float("nan")

    def kernel(M):
        s = float(np.median(condensed(M))) + EPS
        return np.exp(-(M**2) / s**2)

    return centred_cka(kernel(D), kernel(Delta))


def _rank_corr(fn, a: np.ndarray, b: np.ndarray) -> float:
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 2 or np.ptp(a[keep]) == 0 or np.ptp(b[keep]) == 0:
        return float("nan")  # a constant vector has no rank correlation (scipy would warn and return NaN)
    return float(fn(a[keep], b[keep])[0])


def geometry_metrics(D: np.ndarray, Delta: np.ndarray, torsion_deg: np.ndarray | None, spec: GeometrySpec,
                     Z: np.ndarray | None = None, cosine: bool = True) -> dict[str, float]:
    """All Table-1 metrics of one molecule. `cosine` says whether `Delta` is `1 - cos` (for LIE's unit-range rescale)."""
    D = np.asarray(D, dtype=np.float64)
    Delta = np.asarray(Delta, dtype=np.float64)
    n = D.shape[0]
    d, x = condensed(D), condensed(Delta)
    out = {"A1_spearman": _rank_corr(spearmanr, d, x)}
    out["A2_kendall"] = _rank_corr(kendalltau, d, x) if n >= max(2, spec.kendall_min_conformers) else float("nan")
    out["G_cka_rbf"] = cka_paper_run(D, Delta) if spec.cka == "paper_run" else cka_rbf(D, Delta)
    if n >= max(2, spec.lie_min_conformers):
        X = 0.5 * Delta if (spec.lie_unit_range and cosine) else Delta
        out["H_LIE@k"] = lie_at_k(D, X, spec.lie_k, spec.lie_include_self)
    else:
        out["H_LIE@k"] = float("nan")
    if spec.isor2 == "reference_on_model":
        out["J_isotonic_R2"] = isotonic_r2(x, d, guard=spec.isor2_guard)
    else:
        out["J_isotonic_R2"] = isotonic_r2(d, x, guard=spec.isor2_guard)
    if torsion_deg is not None and len(torsion_deg) == n:
        out["torsion_sp"] = _rank_corr(spearmanr, x, condensed(circular_distance(torsion_deg)))
        out["AS"] = angular_smoothness(torsion_deg, spec.as_variant, Delta, Z)
    else:
        out["torsion_sp"] = out["AS"] = float("nan")
    return out


def rmsd_matrix(mols) -> np.ndarray:
    """Reference `D`: symmetry-aware heavy-atom RMSD after optimal alignment (`rdMolAlign.GetBestRMS`), all pairs.

    RDKit enumerates the symmetry-equivalent atom maps per pair, so this is the one pairwise loop that stays (in C++).
    """
    from rdkit import Chem
    from rdkit.Chem import rdMolAlign

    heavy = [Chem.RemoveHs(m, sanitize=False) for m in mols]
    n = len(heavy)
    D = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            D[i, j] = D[j, i] = rdMolAlign.GetBestRMS(heavy[i], heavy[j])
    return D
