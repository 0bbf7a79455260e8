"""Energy axis (MD trajectory windows): energy differences `dE_ij = |E_i - E_j|` vs representation distance `Delta`.

Per window of frames (Table 3 / 6): Spearman, Kendall, RBF-CKA, isotonic R^2, EJS(lambda), EJS-ROC-AUC, thresholded
smoothness TS, Smoothness, KS / W1. `Delta` is `(1 - cos)/2` for vectors (Tanimoto for fingerprints). `paper` is the
code path of the published tables, `v2` the App. C.3/C.6 text; every difference is a field of `EnergySpec`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.special import erfinv
from scipy.stats import kendalltau, ks_2samp, spearmanr, wasserstein_distance

from .distances import EPS, centred_cka, condensed, isotonic_r2, median_sigma, rbf_kernel, roc_auc

LAMBDAS = (0.1, 0.5, 1.0, 2.0, 3.0)


@dataclass(frozen=True)
class EnergySpec:
    """low_precision: Delta stored as float16 and dE cast to float32 for the rank correlations (paper storage).
    cka_shared_sigma: one median bandwidth over dE and Delta together (paper) or one per matrix (v2, App. C.3).
    isor2_energy_on_model: fit dE = f(Delta) and score R^2 on dE (v2) instead of Delta = f(dE) on Delta (paper).
    ejs_sigma: `robust` median(dE)/0.6745 (paper) or `rms` sqrt(mean dE^2) (v2, App. C.6) as the jump scale.
    ts_consecutive: TS along consecutive frames of a time-ordered trajectory (v2) instead of all pairs (paper).
    ks_normalised: KS / W1 between Delta/Q_Z and dE/Q_E (v2) instead of raw Delta vs dE in kcal/mol (paper).
    time_ordered: frames are in simulation-time order (v2 reports TS and Smoothness only then; rMD17 frames are not).
    """

    low_precision: bool = False
    cka_shared_sigma: bool = False
    isor2_energy_on_model: bool = True
    ejs_sigma: str = "rms"
    ts_consecutive: bool = True
    ks_normalised: bool = True
    time_ordered: bool = True


PRESETS = {
    "paper": EnergySpec(low_precision=True, cka_shared_sigma=True, isor2_energy_on_model=False, ejs_sigma="robust",
                        ts_consecutive=False, ks_normalised=False),
    "v2": EnergySpec(),
}
PRESETS["release"] = PRESETS["paper"]  # the released package (three_dbench 0.1.0, traj/evaluation.py) is the paper path


def energy_spec(version: str = "paper", **overrides) -> EnergySpec:
    if version not in PRESETS:
        raise ValueError(f"metric version must be one of {tuple(PRESETS)}, got {version!r}")
    return replace(PRESETS[version], **{k: v for k, v in overrides.items() if v is not None})


def jump_scale(dE: np.ndarray, kind: str) -> float:
    """sigma_d of EJS: robust half-normal scale `median(dE) / (sqrt(2) erfinv(0.5) + eps)` or `sqrt(mean dE^2 + eps)`."""
    if kind == "robust":
        return float(np.median(dE) / (np.sqrt(2.0) * erfinv(0.5) + EPS))
    if kind == "rms":
        return float(np.sqrt(np.mean(dE * dE) + EPS))
    raise ValueError(f"ejs_sigma must be 'robust' or 'rms', got {kind!r}")


def ejs(dE: np.ndarray, delta: np.ndarray, lam: float, sigma: float) -> tuple[float, int]:
    """EJS(lambda): share of energy jumps `dE > lambda sigma` whose Delta exceeds the 0.75-quantile of Delta; and |J|."""
    jumps = dE > lam * sigma
    n = int(jumps.sum())
    if n == 0:
        return float("nan"), 0
    return float((delta[jumps] > np.quantile(delta, 0.75)).mean()), n


def ts_all_pairs(E: np.ndarray, dE: np.ndarray, delta: np.ndarray, seed: int = 0, max_pairs: int = 200_000) -> float:
    """Paper TS over all pairs with `dE >= 0.2 Q~_E`: mean `exp(-(Delta / Q_Z) / (dE / Q~_E + eps))`, where Q~_E is the
    0.9-quantile of |E_i - E_j| over min(200k, n(n-1)/2) random pairs (i < j kept, `default_rng(0)`) and Q_Z that of
    Delta (three_dbench `_q90_absdiff_energy`: a window under 633 frames draws n(n-1)/2 pairs, not 200k)."""
    n = len(E)
    rng = np.random.default_rng(seed)
    m = min(max_pairs, n * (n - 1) // 2)
    i = rng.integers(0, n - 1, size=m)
    j = rng.integers(1, n, size=m)
    keep = i < j
    q_e = float(np.quantile(np.abs(E[i[keep]] - E[j[keep]]), 0.9)) + EPS
    q_z = float(np.quantile(delta, 0.9)) + EPS
    sel = dE >= 0.2 * q_e
    if not sel.any():
        return float("nan")
    return float(np.mean(np.exp(-(delta[sel] / q_z) / (dE[sel] / q_e + EPS))))


def consecutive(E: np.ndarray, Delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|E_{k+1} - E_k| and Delta_{k,k+1} along the frame order."""
    k = np.arange(len(E) - 1)
    return np.abs(E[k + 1] - E[k]), Delta[k, k + 1]


def energy_metrics(E: np.ndarray, Delta: np.ndarray, spec: EnergySpec) -> dict[str, float]:
    """All Table-3/6 metrics of one window. `E` float64 energies (kcal/mol) in frame order, `Delta` (n, n)."""
    E = np.asarray(E, dtype=np.float64)
    Delta = np.asarray(Delta, dtype=np.float64)
    if spec.low_precision:
        Delta = Delta.astype(np.float16).astype(np.float64)
    dE_mat = np.abs(E[:, None] - E[None, :])
    dE, x = condensed(dE_mat), condensed(Delta)
    # paper: the reference |dE| matrix as stored (float32) in the correlations, CKA and isotonic R^2; EJS, ROC, TS and
    # KS recompute |dE| from E in float64
    ref_mat = dE_mat.astype(np.float32).astype(np.float64) if spec.low_precision else dE_mat
    ref = condensed(ref_mat)
    nan = float("nan")
    out: dict[str, float] = {}
    const = np.ptp(x) == 0 or np.ptp(dE) == 0
    out["spearman"] = nan if const else float(spearmanr(ref, x)[0])
    out["kendall"] = nan if const else float(kendalltau(ref, x)[0])
    if spec.cka_shared_sigma:
        sa = sb = median_sigma(np.concatenate([ref, x]))
    else:
        sa, sb = median_sigma(ref), median_sigma(x)
    out["cka_rbf"] = centred_cka(rbf_kernel(ref_mat, sa), rbf_kernel(Delta, sb))
    out["iso_R2"] = isotonic_r2(x, dE, guard=True) if spec.isor2_energy_on_model else isotonic_r2(ref, x, guard=False)
    sigma = jump_scale(dE, spec.ejs_sigma)
    for lam in LAMBDAS:
        tag = f"{lam:g}".replace(".", "p")
        out[f"EJS_lam{tag}"], out[f"EJS_num_jumps_lam{tag}"] = ejs(dE, x, lam, sigma)
    out["EJS"] = out["EJS_lam2"]
    sigma_rms = jump_scale(dE, "rms")  # EJS-ROC labels use the RMS scale in both versions
    out["ROC_AUC"] = roc_auc(x, dE > 2.0 * sigma_rms)
    q_z = float(np.quantile(x, 0.9)) + EPS
    q_e = float(np.quantile(dE, 0.9)) + EPS
    dk, zk = consecutive(E, Delta)
    if spec.ts_consecutive:
        if spec.time_ordered:
            sel = dk > 0.2 * q_e
            out["TS"] = float(np.mean(np.exp(-(zk[sel] / q_z) / (dk[sel] / q_e + EPS)))) if sel.any() else nan
            out["Smoothness"] = float(np.mean(np.exp(-(zk / q_z) / (dk / q_e + EPS))))
        else:
            out["TS"] = out["Smoothness"] = nan
    else:
        out["TS"] = ts_all_pairs(E, dE, x)
        out["Smoothness"] = float(np.mean(np.exp(-zk / (dk + 1e-8))))  # raw units, file order (paper)
    a, b = (x / q_z, dE / q_e) if spec.ks_normalised else (x, dE)
    out["KS"] = float(ks_2samp(a, b).statistic)
    out["W1"] = float(wasserstein_distance(a, b))
    return out


def window_starts(n_frames: int, n_windows: int, window: int, seed: int = 2025) -> np.ndarray:
    """Window starts of the published protocol: `default_rng(seed).integers(0, n_frames - window, size=n_windows)`."""
    if n_frames <= window:
        return np.zeros(1, dtype=int)
    return np.random.default_rng(seed).integers(0, n_frames - window, size=n_windows)
