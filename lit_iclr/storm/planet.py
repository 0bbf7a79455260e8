"""The default data: a forced-dissipative moist shallow-water planet, written as an ERA5 store in WeatherBench 2 layout.

One fluid layer on the rotating sphere (spectral transform method, T21 on a 32 x 64 Gaussian grid, torch-harmonics
Legendre weights) with the ingredients that give weather its scales:

* planetary: relaxation of the layer thickness towards a seasonal, land-sea-dependent equilibrium set by a temperature
  field, plus two mountain ranges (stationary waves);
* synoptic: a red-in-time stochastic vorticity stirring in mid-latitude storm tracks (total wavenumbers 8-14), which
  drives eddy-driven jets and travelling cyclones (Vallis et al. 2004 style);
* local: moisture `q` that condenses where it exceeds saturation `q_sat(T)` (Clausius-Clapeyron), releasing latent heat
  and a mass source (convective outflow), so precipitation is intermittent and patchy.

Temperature and moisture are advected by the flow, so the variables are coupled nonlinearly. Rayleigh drag, Newtonian
relaxation and hyperdiffusion keep it statistically stationary for years. Gravity waves are integrated semi-implicitly
(Crank-Nicolson), everything else with third-order Adams-Bashforth. The layer is mapped to WB2 variables at two pressure
levels with an equivalent-barotropic vertical structure (see `to_wb2`): the second level is a fixed linear function of
the layer fields (geopotential through the hypsometric equation), not independent information.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

DAY = 86400.0
G = 9.81
A_EARTH = 6.371e6
OMEGA = 7.292e-5
LEVELS = (500, 850)


class SpectralTransforms:
    """Scalar and vector spherical-harmonic transforms with torch-harmonics' quadrature, fused for speed.

    Spectral arrays have layout (m, field, 2 [re, im], l). Vector fields (u, v) map to the pair of coefficients whose
    curl and divergence are `-l(l+1)/a * (c0, c1)`, the convention of torch-harmonics' `RealVectorSHT`.
    """

    def __init__(self, nlat: int, nlon: int, lmax: int, grid: str = "legendre-gauss", analysis: bool = True):
        import torch_harmonics as th

        kw = dict(lmax=lmax, mmax=lmax, grid=grid, csphase=False)
        self.nlat, self.nlon, self.L = nlat, nlon, lmax
        f64 = torch.float64
        if analysis:
            wT = th.RealSHT(nlat, nlon, **kw).weights.to(f64).transpose(1, 2)  # (m, k, l)
            vw = th.RealVectorSHT(nlat, nlon, **kw).weights.to(f64).transpose(2, 3)  # (2, m, k, l)
            self.wT = torch.cat([wT, vw[0], vw[1]], -1).contiguous()  # (m, k, 3l): scalar, then vector weights
        p = th.InverseRealSHT(nlat, nlon, **kw).pct.to(f64).transpose(1, 2)  # (m, l, k)
        dp = th.InverseRealVectorSHT(nlat, nlon, **kw).dpct.to(f64).transpose(2, 3)  # (2, m, l, k)
        self.p = torch.cat([p, dp[0], dp[1]], -1).contiguous()  # (m, l, 3k)
        # one batched matmul per transform, batched over m with every (field, re/im) row of a given m in one matrix:
        # (2n x k) @ (k x 3l) instead of many (2 x k) products; rows take the columns of their kind

    @staticmethod
    def _i(x: torch.Tensor) -> torch.Tensor:  # multiply by the imaginary unit along the (re, im) axis -2
        return torch.stack([-x[..., 1, :], x[..., 0, :]], -2)

    def analysis(self, scal: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
        """(ns, nlat, nlon) scalars and (nv, 2, nlat, nlon) vectors -> (m, ns + 2 nv, 2, l)."""
        ns, nv, L = scal.shape[0], vec.shape[0], self.L
        x = torch.cat([scal, vec.flatten(0, 1)], 0)
        X = torch.fft.rfft(x, dim=-1, norm="forward")[..., :L]
        X = torch.view_as_real(X).permute(2, 0, 3, 1)  # (m, n, 2, k)
        P = torch.bmm(X.reshape(L, -1, X.shape[-1]), self.wT).view(L, -1, 2, 3 * L)  # (m, n, 2, 3l)
        S = P[:, :ns, :, :L]
        Y = P[:, ns:, :, L:].unflatten(1, (nv, 2))  # (m, nv, comp, 2, 2l)
        Y0, Y1 = Y[..., :L], Y[..., L:]
        c0 = Y0[:, :, 0] + self._i(Y1[:, :, 1])
        c1 = self._i(Y1[:, :, 0]) - Y0[:, :, 1]
        return torch.cat([S, torch.stack([c0, c1], 2).flatten(1, 2)], 1)

    def synthesis(self, spec: torch.Tensor, ns: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(m, ns + 2 nv, 2, l) -> (ns, nlat, nlon) scalars and (nv, 2, nlat, nlon) vectors."""
        L, k = self.L, self.nlat
        R = torch.bmm(spec.reshape(L, -1, L), self.p).view(L, -1, 2, 3 * k)  # (m, n, 2, 3k)
        G_ = R[:, :ns, :, :k]  # (m, ns, 2, k)
        V = R[:, ns:].unflatten(1, (-1, 2))  # (m, nv, comp, 2, 3k)
        Y0, Y1 = V[..., k:2 * k], V[..., 2 * k:]
        c0 = Y0[:, :, 0] + self._i(Y1[:, :, 1])
        c1 = self._i(Y1[:, :, 0]) - Y0[:, :, 1]
        X = torch.cat([G_, torch.stack([c0, c1], 2).flatten(1, 2)], 1).permute(1, 3, 0, 2).contiguous()
        X = torch.view_as_complex(X)
        X[..., 0].imag.zero_()  # real signal: the m = 0 coefficient has no imaginary part
        out = torch.fft.irfft(X, n=self.nlon, dim=-1, norm="forward")
        return out[:ns], out[ns:].unflatten(0, (-1, 2))


@dataclass
class PlanetConfig:
    """Physical and numerical parameters of the generator (all SI units)."""

    nlat: int = 32            # Gaussian latitudes of the solver grid
    nlon: int = 64
    lmax: int = 22            # triangular truncation T21
    dt: float = 1800.0        # time step; 12 steps per 6-hourly output
    depth: float = 3000.0     # mean layer depth H (gravity-wave speed sqrt(gH) ~ 170 m/s)
    tau_drag: float = 7 * DAY       # Rayleigh drag on vorticity and divergence
    tau_rad: float = 12 * DAY       # relaxation of the thickness towards its thermal equilibrium
    tau_T: float = 15 * DAY         # Newtonian relaxation of temperature towards T_eq(lat, lon, season)
    alpha: float = 25.0             # equilibrium thickness per kelvin (m/K): warm columns stand tall
    stir_amp: float = 3e-11         # stochastic vorticity forcing amplitude (1/s^2 per coefficient)
    stir_band: tuple[int, int] = (8, 14)
    tau_stir: float = 2 * DAY       # decorrelation time of the stirring
    tau_c: float = 6 * 3600.0       # condensation time scale
    tau_e: float = 2 * DAY          # evaporation time scale
    rh: float = 0.8                 # surface relative humidity that evaporation restores
    latent: float = 2500.0          # L/cp (K per kg/kg)
    beta: float = 30000.0           # convective mass source (m per kg/kg condensed)
    hyper_tau: float = 6 * 3600.0   # e-folding of the smallest resolved scale by del^8 hyperdiffusion
    smooth_l: float = 14.0          # spectral smoothing of the grid-point physics tendencies
    column: float = 2.5             # metres of precipitation per kg/kg condensed (column mass / water density)


def _blob(lat_deg, lon_deg, la, lo, rla, rlo):
    dlon = (lon_deg - lo + 180.0) % 360.0 - 180.0
    return np.exp(-((lat_deg - la) / rla) ** 2 - (dlon / rlo) ** 2)


def land_sea_mask(lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
    """Fractional land (0..1) of six smooth continents; lat/lon broadcast against each other."""
    blobs = [(50, 90, 35, 25), (45, 260, 20, 18), (5, 20, 20, 15), (-15, 300, 20, 12), (-25, 135, 12, 15),
             (65, 40, 12, 30)]
    return np.tanh(2 * sum(_blob(lat_deg, lon_deg, *b) for b in blobs))


def orography(lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
    """Surface height (m): a Tibetan-like plateau and a Rocky-like ridge."""
    return 1500.0 * _blob(lat_deg, lon_deg, 40, 90, 10, 15) + 1000.0 * _blob(lat_deg, lon_deg, 45, 250, 15, 10)


class MoistShallowWater:
    """State: spectral (m, 6, 2, l) holding vorticity, divergence, geopotential anomaly, T, q and the stirring."""

    def __init__(self, cfg: PlanetConfig, seed: int = 0):
        import torch_harmonics as th

        self.c = c = cfg
        self.tr = SpectralTransforms(c.nlat, c.nlon, c.lmax)
        cost, _ = th.quadrature.legendre_gauss_weights(c.nlat, -1, 1)
        self.lat = -torch.arcsin(torch.as_tensor(cost)).double()  # north to south, as torch-harmonics orders them
        self.lon = torch.arange(c.nlon, dtype=torch.float64) * 2 * math.pi / c.nlon
        LAT, LON = torch.meshgrid(self.lat, self.lon, indexing="ij")
        self.LAT = LAT
        lat_d, lon_d = np.degrees(LAT.numpy()), np.degrees(LON.numpy())
        self.land = torch.from_numpy(land_sea_mask(lat_d, lon_d))
        L = c.lmax
        l = torch.arange(L, dtype=torch.float64)  # noqa: E741 - the spherical-harmonic degree
        m = torch.arange(L, dtype=torch.float64)
        as_l = lambda v: v[None, None, None, :]  # broadcast over (m, field, re/im, l)
        self.lam = as_l(l * (l + 1) / A_EARTH**2)  # eigenvalue of -laplacian
        self.invlam = as_l(torch.where(l > 0, A_EARTH**2 / (l * (l + 1)).clamp(min=1.0), 0.0))
        tri = (m[:, None] <= l[None, :]).double()[:, None, None, :]
        band = ((l >= c.stir_band[0]) & (l <= c.stir_band[1])).double()
        self.stir_mask = tri * as_l(band)
        self.tri = tri
        self.hyper = as_l(torch.exp(-c.dt / c.hyper_tau * (l * (l + 1) / (L * (L - 1))) ** 4))
        self.smooth = as_l(torch.exp(-((l * (l + 1)) / (c.smooth_l * (c.smooth_l + 1))) ** 2))
        self.f = 2 * OMEGA * torch.sin(LAT)
        # orography seen by the solver: spectrally truncated so it does not ring
        orog = torch.from_numpy(orography(lat_d, lon_d))
        none = torch.zeros(0, 2, c.nlat, c.nlon, dtype=torch.float64)
        self.orog = self.tr.synthesis(self.tr.analysis(orog[None], none) * self.smooth, 1)[0][0]
        self.Phis = G * self.orog
        self.stir_lat = torch.exp(-((LAT.abs() - math.radians(45)) / math.radians(12)) ** 2)
        self.gen = torch.Generator().manual_seed(seed)
        self.t = 0.0  # seconds since 1 January of the first output year
        self.hist: list[torch.Tensor] = []

    def T_eq(self, t: float) -> torch.Tensor:
        """Radiative-equilibrium temperature: a seasonal equator-pole contrast, warm summer continents."""
        phs = math.radians(23.4) * math.sin(2 * math.pi * (t / DAY - 80) / 365.25)  # subsolar latitude
        summer = phs / math.radians(23.4)
        return (300.0 - 45.0 * torch.sin(self.LAT - phs) ** 2 + 12.0 * self.land * summer * torch.sin(self.LAT)
                - 6.0 * self.land * torch.cos(self.LAT) ** 2)

    @staticmethod
    def qsat(T: torch.Tensor) -> torch.Tensor:
        return 0.02 * torch.exp(0.07 * (T - 300.0))  # ~7 %/K (Clausius-Clapeyron)

    def initial_state(self) -> torch.Tensor:
        c = self.c
        T = self.T_eq(self.t)
        h = c.depth + c.alpha * (T - T.mean()) - self.orog
        zero = torch.zeros_like(T)
        grid = torch.stack([zero, zero, G * (h - c.depth), T, c.rh * self.qsat(T), zero])
        spec = self.tr.analysis(grid, torch.zeros(0, 2, c.nlat, c.nlon, dtype=torch.float64))
        noise = torch.randn(spec[:, 0].shape, generator=self.gen, dtype=torch.float64)
        spec[:, 0] += 1e-6 * noise * self.tri[:, 0]
        return spec

    def wind_spec(self, spec: torch.Tensor) -> torch.Tensor:
        """Vector coefficients of (u, v) from vorticity and divergence (inverse laplacian)."""
        return torch.stack([-self.invlam[:, 0] * spec[:, 0], -self.invlam[:, 0] * spec[:, 1]], 1) / A_EARTH

    def tendencies(self, spec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.c
        grid, uv = self.tr.synthesis(torch.cat([spec, self.wind_spec(spec)], 1), 6)
        zeta, delta, phi, T, q, F = grid
        u, v = uv[0]
        absv = zeta + self.f
        fluxes = torch.stack([torch.stack([u * absv, v * absv]), torch.stack([u * phi, v * phi]),
                              torch.stack([u * T, v * T]), torch.stack([u * q, v * q])])
        qs = self.qsat(T)
        cond = torch.relu(q - qs) / c.tau_c
        evap = torch.relu(c.rh * qs - q) / c.tau_e * (1 - 0.7 * self.land)
        h_eq = c.depth + c.alpha * (T - T.mean()) - self.orog
        dphi = G * (h_eq - (c.depth + phi / G)) / c.tau_rad + c.beta * G * (cond - cond.mean())  # mean removed
        dT = (self.T_eq(self.t) - T) / c.tau_T + c.latent * cond
        dq = evap - cond
        KE = 0.5 * (u * u + v * v)
        S = self.tr.analysis(torch.stack([KE + self.Phis, dT, dq, dphi, F * self.stir_lat, T * delta, q * delta]), fluxes)
        phys = S[:, 1:4] * self.smooth  # grid-point physics, smoothed so switches do not ring
        fl = -self.lam * A_EARTH * S[:, 7:]
        curl, div = fl[:, 0::2], fl[:, 1::2]
        N = torch.stack([
            -div[:, 0] + S[:, 4] - spec[:, 0] / c.tau_drag,                       # vorticity
            curl[:, 0] + self.lam[:, 0] * S[:, 0] - spec[:, 1] / c.tau_drag,     # divergence (no linear phi term)
            -div[:, 1] + phys[:, 2],                                              # phi' (no linear -Phi_bar*delta)
            -div[:, 2] + S[:, 5] + phys[:, 0],                                    # T: -u.grad T = -div(uT) + T delta
            -div[:, 3] + S[:, 6] + phys[:, 1]], 1)                                # q
        return N, cond

    def step(self, spec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.c
        dt, pbar = c.dt, G * c.depth
        N, cond = self.tendencies(spec)
        self.hist = [N, *self.hist[:2]]
        h = self.hist
        if len(h) == 1:
            A = h[0]
        elif len(h) == 2:
            A = 1.5 * h[0] - 0.5 * h[1]
        else:
            A = (23 * h[0] - 16 * h[1] + 5 * h[2]) / 12  # third-order Adams-Bashforth
        new = spec[:, :5] + dt * A
        lam = self.lam[:, 0]
        k = dt * dt / 4 * pbar * lam
        d0, f0, Nd, Nf = spec[:, 1], spec[:, 2], A[:, 1], A[:, 2]
        # Crank-Nicolson for d(delta)/dt = lam phi', d(phi')/dt = -Phi_bar delta (gravity waves)
        f1 = (f0 * (1 - k) + dt * Nf - dt * pbar * d0 - dt * dt / 2 * pbar * Nd) / (1 + k)
        d1 = d0 + dt * Nd + dt / 2 * lam * (f1 + f0)
        new[:, 1], new[:, 2] = d1, f1
        r = math.exp(-dt / c.tau_stir)
        noise = torch.randn(spec[:, 5].shape, generator=self.gen, dtype=torch.float64) * self.stir_mask[:, 0]
        stir = r * spec[:, 5] + math.sqrt(1 - r * r) * c.stir_amp * noise
        self.t += dt
        return torch.cat([new * self.hyper, stir[:, None]], 1), cond


def output_grid(nlat: int = 32, nlon: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """WB2 equiangular grid without poles (e.g. 64x32: latitudes +-87.1875), ascending latitude."""
    dlat = 180.0 / nlat
    lat = -90.0 + dlat / 2 + dlat * np.arange(nlat)
    lon = 360.0 / nlon * np.arange(nlon)
    return lat, lon


def to_wb2(fields: dict[str, np.ndarray], orog: np.ndarray, land: np.ndarray, summer: np.ndarray) -> dict:
    """Map layer fields on the output grid to WB2 variables at levels (500, 850) hPa and the surface.

    z_fs (free-surface height), u, v, T, q and 6-h condensation `P` -> geopotential, temperature, winds, specific
    humidity (levels), 2m_temperature, total_precipitation_6hr. The 850 hPa geopotential follows the hypsometric
    equation z500 - z850 = (R/g) T_layer ln(850/500).
    """
    zfs, u, v, T, q, P = (fields[k] for k in ("zfs", "u", "v", "T", "q", "P"))
    z500 = 5600.0 + (zfs - 3000.0)
    T850 = T
    T500 = 253.0 + 0.7 * (T - 280.0)
    z850 = z500 - 287.0 / G * 0.5 * (T500 + T850) * math.log(850 / 500)
    lev = lambda a500, a850: np.stack([a500, a850], 1).astype(np.float32)
    return {
        "geopotential": lev(G * z500, G * z850),
        "temperature": lev(T500, T850),
        "u_component_of_wind": lev(u, 0.6 * u),
        "v_component_of_wind": lev(v, 0.6 * v),
        "specific_humidity": lev(0.25 * np.clip(q, 0, None), np.clip(q, 0, None)),
        "2m_temperature": (T850 + 10.0 - 0.0065 * orog + 5.0 * land * summer).astype(np.float32),
        "total_precipitation_6hr": np.clip(P, 0, None).astype(np.float32),
    }


def generate(out_dir: Path, start: str = "2000-01-01", days: int = 1827, spinup_days: int = 90, seed: int = 0,
             cfg: PlanetConfig | None = None, chunk_days: int = 30, log=print) -> Path:
    """Integrate the planet and write `out_dir/planet-6h-64x32_equiangular.zarr` (WB2 layout, zarr v2, consolidated)."""
    import pandas as pd
    import xarray as xr

    torch.set_flush_denormal(True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny transforms: one thread avoids contention overhead
    try:
        cfg = cfg or PlanetConfig()
        model = MoistShallowWater(cfg, seed)
        model.t = -spinup_days * DAY
        steps6 = int(round(6 * 3600 / cfg.dt))
        lat, lon = output_grid()
        # the output grid's latitudes are the odd rows of a 65-point equiangular grid (north to south)
        out_tr = SpectralTransforms(2 * len(lat) + 1, len(lon), cfg.lmax, grid="equiangular", analysis=False)
        lat2d, lon2d = np.meshgrid(lat, lon, indexing="ij")
        land_o, orog_o = land_sea_mask(lat2d, lon2d), orography(lat2d, lon2d)
        path = Path(out_dir) / "planet-6h-64x32_equiangular.zarr"
        times = pd.date_range(start, periods=days * 4, freq="6h")
        spec = model.initial_state()
        t0 = time.time()
        for _ in range(spinup_days * 4 * steps6):
            spec, _ = model.step(spec)
        none = torch.zeros(0, 2, cfg.nlat, cfg.nlon, dtype=torch.float64)
        written = 0
        per_chunk = chunk_days * 4
        while written < len(times):
            n = min(per_chunk, len(times) - written)
            buf = {k: np.empty((n, len(lat), len(lon)), np.float64) for k in ("zfs", "u", "v", "T", "q", "P")}
            summer = np.empty((n, len(lat), 1))
            for i in range(n):
                acc = torch.zeros(cfg.nlat, cfg.nlon, dtype=torch.float64)
                if written + i > 0:
                    for _ in range(steps6):
                        spec, cond = model.step(spec)
                        acc += cond * cfg.dt
                phs = math.sin(2 * math.pi * (model.t / DAY - 80) / 365.25)
                summer[i] = phs * np.sin(np.radians(lat))[:, None]
                acc_spec = model.tr.analysis(acc[None], none) * model.smooth
                full = torch.cat([spec[:, [2, 3, 4]], acc_spec, model.wind_spec(spec)], 1)
                g, uv = out_tr.synthesis(full, 4)
                g, uv = g[:, 1::2].numpy()[:, ::-1], uv[0][:, 1::2].numpy()[:, ::-1]  # odd rows, ascending latitude
                if not np.isfinite(g).all():
                    raise RuntimeError(f"the planet simulation became non-finite at {times[written + i]}")
                buf["zfs"][i] = cfg.depth + g[0] / G + orog_o
                buf["T"][i], buf["q"][i], buf["P"][i] = g[1], g[2], g[3] * cfg.column
                buf["u"][i], buf["v"][i] = uv[0], uv[1]
            data = to_wb2(buf, orog_o, land_o, summer)
            coords = {"time": times[written:written + n], "level": np.array(LEVELS, np.int64),
                      "latitude": lat, "longitude": lon}
            ds = xr.Dataset(
                {k: (("time", "level", "latitude", "longitude") if a.ndim == 4 else ("time", "latitude", "longitude"), a)
                 for k, a in data.items()}, coords=coords)
            if written == 0:
                ds["land_sea_mask"] = (("latitude", "longitude"), land_o.astype(np.float32))
                ds["geopotential_at_surface"] = (("latitude", "longitude"), (G * orog_o).astype(np.float32))
                ds.attrs.update(source="lit_iclr.storm.planet: forced-dissipative moist shallow-water model",
                                seed=seed, spinup_days=spinup_days, **{k: str(v) for k, v in asdict(cfg).items()})
                enc = {k: {"chunks": (per_chunk,) + ds[k].shape[1:]} for k in data}
                ds.to_zarr(path, mode="w", encoding=enc, zarr_format=2, consolidated=True)
            else:
                ds.to_zarr(path, append_dim="time", zarr_format=2, consolidated=True)
            written += n
            log(f"planet: {written}/{len(times)} steps written ({time.time() - t0:.0f} s)")
        return path
    finally:
        torch.set_num_threads(threads)
