"""Seeded generator of ICU records written in the exact PhysioNet 2012 format (`set-a/<RecordID>.txt`, `Outcomes-a.txt`).

It models what ReIMTS exploits:

* **multi-scale dynamics**: every patient has a slow trend (a drift plus a 30-60 h wave), a fast oscillation (period
  4-9 h) and a smoothed latent severity; variables load on these with group-specific weights (haemodynamics,
  respiration, metabolism), so MAP/Sys/Dias, the NI* cuff pressures and the blood gases move together (with small
  lags) and each variable carries a patient-specific offset.
* **informative irregular sampling**: each variable is observed by a Poisson process whose rate switches between a
  sparse and a dense regime with the latent state (a two-state Markov chain "stable/unstable"), so when and how often a
  variable is measured says something about its values; labs are sparse, vitals dense; many variables are never
  measured for a patient (arterial line or not, ventilated or not), giving PhysioNet-like missingness (~85-90 % of the
  hourly grid empty).

Two versions of the dynamics (`dynamics`):

* `v2` (data versions 1-2): slow = drift + a 30-60 h wave, fast = a 4-9 h oscillation whose amplitude follows the
  stable/unstable state. Little of it is forecastable 3 h ahead from long context (the wave hardly moves in 3 h, the
  oscillation's amplitude switches with a Markov chain).
* `multiscale` (data version 3, the default): structure at the periods ReIMTS's sub-samples see (39 -> 24 -> 12 h).
  Slow = drift + a 20-30 h circadian-like wave (one to two cycles per 39 h window); fast = recurring events every
  8-12 h (scheduled doses / feeds: a ~2-3 h bump on every variable that loads on it, patient-specific period and phase,
  +-0.25 h jitter). The next event's timing is fixed by the events of the last 16-24 h, which the 12 h horizon
  sub-sample (9 h of lookback) cannot see on its own but its 24 h and 39 h parents can.

`generate_patient` also returns each variable's true slow and fast components per hour (what an oracle forecaster is
told, see `generator_components`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .physionet import HEADER, OUTCOME_HEADER

# name: (mean, std, low, high, decimals, group, observations per hour when the patient is stable)
SPECS = {
    "HR": (86, 14, 30, 200, 0, "haemo", 0.8), "SysABP": (118, 18, 50, 230, 0, "art", 0.8),
    "DiasABP": (59, 10, 20, 130, 0, "art", 0.8), "MAP": (79, 12, 30, 160, 0, "art", 0.8),
    "NISysABP": (117, 19, 50, 230, 0, "ni", 0.5), "NIDiasABP": (58, 11, 20, 130, 0, "ni", 0.5),
    "NIMAP": (77, 12, 30, 160, 1, "ni", 0.5), "RespRate": (19, 4.5, 5, 50, 0, "resp", 0.35),
    "Temp": (37.1, 0.6, 34.0, 41.0, 1, "haemo", 0.3), "SaO2": (97, 2.0, 80, 100, 0, "resp", 0.06),
    "FiO2": (0.52, 0.15, 0.21, 1.0, 2, "vent", 0.12), "GCS": (11, 3.5, 3, 15, 0, "neuro", 0.18),
    "Urine": (120, 80, 0, 900, 0, "renal", 0.6), "MechVent": (1, 0, 1, 1, 0, "vent", 0.15),
    "pH": (7.38, 0.06, 7.0, 7.7, 2, "resp", 0.1), "PaCO2": (40, 7, 20, 80, 0, "resp", 0.1),
    "PaO2": (140, 55, 40, 500, 0, "resp", 0.1), "HCO3": (24, 3.8, 10, 40, 0, "metab", 0.07),
    "Lactate": (2.6, 1.5, 0.3, 15, 1, "metab", 0.05), "Glucose": (138, 40, 40, 400, 0, "metab", 0.08),
    "K": (4.1, 0.55, 2.5, 6.5, 1, "metab", 0.08), "Na": (139, 4.5, 120, 160, 0, "metab", 0.07),
    "Mg": (2.0, 0.3, 1.0, 3.5, 1, "metab", 0.06), "HCT": (30.5, 4.5, 18, 50, 1, "blood", 0.08),
    "Platelets": (195, 85, 10, 600, 0, "blood", 0.05), "WBC": (12, 5.5, 0.5, 40, 1, "blood", 0.05),
    "BUN": (27, 18, 3, 150, 0, "renal", 0.05), "Creatinine": (1.5, 1.1, 0.3, 10, 1, "renal", 0.05),
    "Albumin": (2.9, 0.6, 1.2, 4.8, 1, "liver", 0.015), "ALP": (115, 70, 20, 800, 0, "liver", 0.015),
    "ALT": (120, 150, 5, 2000, 0, "liver", 0.015), "AST": (160, 180, 5, 2500, 0, "liver", 0.015),
    "Bilirubin": (2.3, 2.6, 0.1, 30, 1, "liver", 0.015), "Cholesterol": (155, 42, 50, 350, 0, "liver", 0.004),
    "TroponinI": (6, 8, 0.1, 50, 1, "cardiac", 0.01), "TroponinT": (1.1, 1.6, 0.01, 15, 2, "cardiac", 0.01),
}
# Loadings of each group on (slow trend, fast oscillation, severity): why the dynamics are multi-scale and coupled.
GROUPS = {
    "haemo": (0.6, 0.9, 0.7), "art": (-0.5, -0.9, -0.8), "ni": (-0.5, -0.9, -0.8), "resp": (0.4, 0.7, 0.6),
    "vent": (0.3, 0.3, 0.8), "neuro": (-0.6, -0.2, -0.7), "renal": (0.8, 0.25, 0.5), "metab": (0.7, 0.35, 0.6),
    "blood": (0.8, 0.1, 0.3), "liver": (0.9, 0.05, 0.4), "cardiac": (0.8, 0.1, 0.6),
}
RECORD_HOURS = 48
DYNAMICS = ("multiscale", "v2")


def _latent_paths(rng: np.random.Generator, minutes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slow trend, fast oscillation and the stable(0)/unstable(1) state on a minute grid."""
    h = minutes / 60.0
    slow = rng.normal(0, 0.6) * h / RECORD_HOURS + 0.8 * np.sin(2 * np.pi * h / rng.uniform(30, 60) + rng.uniform(0, 6.3))
    s = _state_chain(rng, minutes)  # same draws, in the same order, as data versions 1-2
    # fast oscillation: larger and quicker while unstable
    period = rng.uniform(4, 9)
    amp = 0.6 + 0.8 * s
    fast = amp * np.sin(2 * np.pi * h / period + rng.uniform(0, 6.3))
    return slow, fast, s


def _state_chain(rng: np.random.Generator, minutes: np.ndarray) -> np.ndarray:
    """Stable(0)/unstable(1) two-state Markov chain on an hourly clock (mean sojourn ~8 h), on the minute grid."""
    p_unstable = rng.beta(1.5, 2.5)  # a patient-specific share of unstable time
    hours = RECORD_HOURS + 1
    state = np.zeros(hours, dtype=np.int64)
    state[0] = rng.random() < p_unstable
    flips = rng.random(hours)
    for k in range(1, hours):  # a 49-step chain per patient; not a hot path
        rate = 1 / 8 * (p_unstable if state[k - 1] == 0 else 1 - p_unstable) * 2
        state[k] = 1 - state[k - 1] if flips[k] < rate else state[k - 1]
    return state[np.minimum(minutes // 60, hours - 1)].astype(float)


def _latent_paths_multiscale(rng: np.random.Generator, minutes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slow trend (drift + 20-30 h wave), fast recurring events (every 8-12 h, ~2 h wide) and the state, per minute."""
    h = minutes / 60.0
    slow = rng.normal(0, 0.6) * h / RECORD_HOURS + 1.0 * np.sin(2 * np.pi * h / rng.uniform(20, 30) + rng.uniform(0, 6.3))
    period = rng.uniform(8, 12)
    times = rng.uniform(-period, 0) + period * np.arange(RECORD_HOURS / 8 + 2)  # event times, from before admission
    times = times + rng.uniform(-0.25, 0.25, len(times))  # small jitter: the schedule is kept, not to the minute
    # Gaussian bumps (sd 0.75 h); centred so the component has mean ~0 over a period
    fast = 2.0 * (np.exp(-0.5 * ((h[:, None] - times[None, :]) / 0.75) ** 2).sum(1) - 0.75 * np.sqrt(2 * np.pi) / period)
    return slow, fast, _state_chain(rng, minutes)


def _hourly(z: np.ndarray) -> np.ndarray:
    """Hourly means of a per-minute path (the protocol bins observations per hour)."""
    return z.reshape(RECORD_HOURS, 60).mean(1)


def generate_patient(rng: np.random.Generator, record_id: int,
                     dynamics: str = "v2") -> tuple[str, list[float], dict[str, np.ndarray]]:
    """One record file's text, its outcome row, and each written variable's true (slow, fast) components per hour
    (2, 48) in the units of the latent z (before the variable's mean/std)."""
    if dynamics not in DYNAMICS:
        raise ValueError(f"dynamics must be one of {DYNAMICS}, got {dynamics!r}")
    minutes = np.arange(RECORD_HOURS * 60)
    paths = _latent_paths if dynamics == "v2" else _latent_paths_multiscale
    slow, fast, state = paths(rng, minutes)
    # smoothed severity (exponential filter, ~2 h) so values lag the state the sampling reacts to
    sev = np.convolve(state, np.exp(-np.arange(240) / 120.0) / 120.0, mode="full")[: len(minutes)]
    art = rng.random() < 0.7  # arterial line -> invasive pressures, else non-invasive cuff
    vent = rng.random() < 0.6
    age = round(float(np.clip(rng.normal(65, 16), 16, 90)))
    rows = [f"00:00,RecordID,{record_id}", f"00:00,Age,{age}", f"00:00,Gender,{int(rng.random() < 0.56)}",
            f"00:00,Height,{-1 if rng.random() < 0.45 else round(rng.normal(170, 10), 1)}",
            f"00:00,ICUType,{int(rng.integers(1, 5))}"]
    weight = round(float(np.clip(rng.normal(82, 20), 35, 200)), 1)
    rows.append(f"00:00,Weight,{weight}")
    obs: list[tuple[int, str, str]] = []
    components: dict[str, np.ndarray] = {}
    for name, (mean, std, low, high, dec, group, rate) in SPECS.items():
        if group == "art" and not art or group == "ni" and art and rng.random() < 0.8:
            continue
        if group == "vent" and not vent:
            continue
        if rate < 0.02 and rng.random() < 0.5:  # rare labs are often never drawn
            continue
        a, b, c = GROUPS[group]
        lag = int(rng.integers(0, 60))  # minutes: coupled variables respond with small lags
        slow_v, fast_v = a * slow, b * np.roll(fast, lag)
        z = (slow_v + fast_v + c * (2 * sev - 0.6) + rng.normal(0, 0.35)
             + 0.15 * np.cumsum(rng.normal(0, 0.02, len(minutes))))
        # informative sampling: dense while unstable (x3), sparse while stable; Poisson thinning on the minute grid
        lam = rate * np.where(state > 0, 3.0, 0.6) / 60.0
        if group in ("liver", "cardiac", "blood", "metab", "renal") and name != "Urine":
            lam = lam * (1 + 4 * (minutes < 90))  # admission labs
        t_obs = np.flatnonzero(rng.random(len(minutes)) < lam)
        if not len(t_obs):
            continue
        vals = mean + std * (z[t_obs] + rng.normal(0, 0.15, len(t_obs)))
        if name == "MechVent":
            vals = np.ones(len(t_obs))
        vals = np.clip(vals, low, high).round(dec)
        obs.extend((int(t), name, f"{v:.{dec}f}" if dec else f"{int(v)}") for t, v in zip(t_obs, vals, strict=True))
        components[name] = np.stack([_hourly(slow_v), _hourly(fast_v)])
    # Weight after admission (a series in the real records): a few daily-ish weighings, fluid balance follows the
    # slow trend (kg), plus scale noise
    t_w = np.flatnonzero(rng.random(len(minutes)) < 0.05 / 60)
    t_w = t_w[t_w > 0]
    obs.extend((int(t), "Weight", f"{weight + 1.5 * slow[t] + rng.normal(0, 0.4):.1f}") for t in t_w)
    if len(t_w):
        components["Weight"] = np.stack([_hourly(slow), np.zeros(RECORD_HOURS)])
    obs.sort(key=lambda o: o[0])
    rows += [f"{t // 60:02d}:{t % 60:02d},{n},{v}" for t, n, v in obs]
    death = float(rng.random() < 1 / (1 + np.exp(-(2.5 * state.mean() - 2.2))))
    outcome = [float(rng.integers(5, 25)), float(rng.integers(0, 15)), float(rng.integers(2, 30)),
               -1.0 if not death else float(rng.integers(1, 30)), death]
    return HEADER + "\n" + "\n".join(rows) + "\n", outcome, components


def generator_components(num_patients: int = 3000, seed: int = 0, dynamics: str = "multiscale",
                         first_id: int = 132539) -> dict[int, dict[str, np.ndarray]]:
    """The true (slow, fast) hourly components of every variable of every record `generate_physionet` writes with the
    same arguments (regenerated in memory, nothing written): {RecordID: {variable: (2, 48)}}."""
    rng = np.random.default_rng(seed)
    return {first_id + i: generate_patient(rng, first_id + i, dynamics)[2] for i in range(num_patients)}


def generate_physionet(out_dir: str | Path, num_patients: int = 3000, seed: int = 0, first_id: int = 132539,
                       dynamics: str = "multiscale") -> None:
    """Write `num_patients` records into `out_dir/set-a/<RecordID>.txt` plus `out_dir/Outcomes-a.txt`."""
    out_dir = Path(out_dir)
    (out_dir / "set-a").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    outcomes = [OUTCOME_HEADER]
    for i in range(num_patients):
        record_id = first_id + i
        text, outcome, _ = generate_patient(rng, record_id, dynamics)
        (out_dir / "set-a" / f"{record_id}.txt").write_text(text)
        outcomes.append(",".join([str(record_id)] + [f"{o:g}" for o in outcome]))
    (out_dir / "Outcomes-a.txt").write_text("\n".join(outcomes) + "\n")
