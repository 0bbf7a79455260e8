"""Deep diagonal state-space classifiers in plain PyTorch: a MIMO S5 layer and a SISO S4D layer.

Both layers are diagonal linear systems discretised by zero-order hold (ZOH):

    x_{k+1} = Lambda_bar x_k + B_bar u_k,   y_k = Re(C x_k) (x2 with conjugate symmetry) + D u_k
    Lambda_bar = exp(Lambda * Delta),       B_bar = Lambda^{-1} (Lambda_bar - 1) B

S5 (Smith et al. 2023) is one MIMO system per layer: P complex states shared by all H channels, B in C^{P x H} and
C in C^{H x P}. S4D (Gu et al. 2022) is H independent SISO systems of N states each. We store the S4D states *flat*
(M = H * N states, each with the index of its channel), which is the same system but lets a pruned layer keep a
different number of states per channel while staying a dense tensor: pruning physically removes entries.

Every state contributes a modal subsystem C_i Lambda_bar_i^k B_bar_i; `modal_terms()` returns what the pruning
scores need (|Lambda_bar_i|, ||B_bar_i||^2, ||C_i||^2 per direction) and `keep_states(idx)` returns a smaller layer.
The outputs are computed either by FFT convolution with the per-state kernel Lambda_bar^k ("fft") or by a parallel
(Hillis-Steele doubling) scan of the recurrence ("scan"); both give the same result.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from lit_iclr.aire_prune.modcopy import module_like

# --------------------------------------------------------------------------------------------------------------
# Initialisation of the diagonal state matrix
# --------------------------------------------------------------------------------------------------------------


def hippo_legs(n: int) -> np.ndarray:
    """The HiPPO-LegS matrix A (n x n): A_nk = -sqrt(2n+1) sqrt(2k+1) for n > k, -(n+1) on the diagonal, 0 above."""
    p = np.sqrt(1 + 2 * np.arange(n))
    a = p[:, None] * p[None, :]
    a = np.tril(a) - np.diag(np.arange(n))
    return -a


def dplr_hippo(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues and eigenvectors of the normal part of HiPPO-LegS (the S5 / S4D-LegS initialisation).

    A = S - p p^T with S normal; S = -1/2 I + skew, so its eigenvalues are -1/2 + i w with w from the Hermitian
    matrix -i S. Returns Lambda (n,) complex and V (n, n) with S = V diag(Lambda) V^*. Eigenvalues come sorted by
    imaginary part, so the first half holds one member of every conjugate pair.
    """
    a = hippo_legs(n)
    p = np.sqrt(np.arange(n) + 0.5)
    s = a + p[:, None] * p[None, :]
    lam_re = np.mean(np.diagonal(s)) * np.ones(n)
    lam_im, v = np.linalg.eigh(s * -1j)
    return lam_re + 1j * lam_im, v


def s4d_lin(n: int) -> np.ndarray:
    """S4D-Lin eigenvalues -1/2 + i pi k, k = 0..n-1 (Gu et al. 2022)."""
    return -0.5 + 1j * math.pi * np.arange(n)


def _log_steps(n: int, dt_min: float, dt_max: float, gen: torch.Generator) -> torch.Tensor:
    """log(Delta) drawn uniformly between log(dt_min) and log(dt_max), one per state (S5) or channel (S4D)."""
    u = torch.rand(n, generator=gen, dtype=torch.float64, device="cpu")
    return (u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).float().to(torch.get_default_device())


# --------------------------------------------------------------------------------------------------------------
# Linear recurrences x_k = lambda x_{k-1} + v_k along dim 1, for diagonal lambda
# --------------------------------------------------------------------------------------------------------------


def recurrence_fft(v: torch.Tensor, log_lam: torch.Tensor) -> torch.Tensor:
    """x_k = sum_{j<=k} lambda^{k-j} v_j as a causal convolution with the kernel lambda^k, by FFT.

    v: (B, L, S) complex, log_lam: (S,) complex with lambda = exp(log_lam) (powers computed as exp(k log_lam), which
    is exact and stable for |lambda| < 1).
    """
    length = v.shape[1]
    k = torch.arange(length, device=v.device, dtype=log_lam.real.dtype)
    kernel = torch.exp(k[:, None] * log_lam[None, :])  # (L, S)
    n = 2 * length
    x = torch.fft.ifft(torch.fft.fft(v, n=n, dim=1) * torch.fft.fft(kernel, n=n, dim=0)[None], n=n, dim=1)
    return x[:, :length]


def recurrence_scan(v: torch.Tensor, log_lam: torch.Tensor) -> torch.Tensor:
    """The same recurrence by a parallel prefix scan (log2 L doubling steps, each O(B L S))."""
    x = v
    lam_pow = torch.exp(log_lam)  # lambda^(2^j)
    shift = 1
    while shift < v.shape[1]:
        x = torch.cat([x[:, :shift], x[:, shift:] + lam_pow * x[:, :-shift]], dim=1)
        lam_pow = lam_pow * lam_pow
        shift *= 2
    return x


RECURRENCES = {"fft": recurrence_fft, "scan": recurrence_scan}


def _complex(p: torch.Tensor) -> torch.Tensor:
    """A real parameter (..., 2) as a complex tensor (...)."""
    return torch.complex(p[..., 0], p[..., 1])


def s5_continuous(lambda_re: torch.Tensor, lambda_im: torch.Tensor, log_step: torch.Tensor, clip_eigs: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """S5's Lambda (complex, Re clipped at -1e-4 with `clip_eigs`) and Delta; any leading dims (layers stacked)."""
    re = lambda_re.clamp(max=-1e-4) if clip_eigs else lambda_re
    return torch.complex(re, lambda_im), torch.exp(log_step)


def s5_discretize(lambda_re: torch.Tensor, lambda_im: torch.Tensor, log_step: torch.Tensor, b: torch.Tensor,
                  clip_eigs: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """ZOH: log Lambda_bar = Lambda Delta (..., n) and B_bar = (Lambda_bar - 1) / Lambda * B (..., n, H)."""
    lam, step = s5_continuous(lambda_re, lambda_im, log_step, clip_eigs)
    log_lam = lam * step
    return log_lam, ((torch.exp(log_lam) - 1) / lam)[..., None] * _complex(b)


def s5_modal_terms(lambda_re: torch.Tensor, lambda_im: torch.Tensor, log_step: torch.Tensor, b: torch.Tensor,
                   cs: list[torch.Tensor], clip_eigs: bool) -> dict[str, torch.Tensor]:
    """|Lambda_bar_i|, ||B_bar_i||^2 and ||C_i||^2 (one row per C in `cs`, stored (..., H, n, 2)) of S5 parameters."""
    log_lam, b_bar = s5_discretize(lambda_re, lambda_im, log_step, b, clip_eigs)
    return {"lam_abs": torch.exp(log_lam.real), "b_norm2": b_bar.abs().pow(2).sum(-1),
            "c_norm2": torch.stack([_complex(c).abs().pow(2).sum(-2) for c in cs])}


class _DiagonalSSM(nn.Module):
    """What the S5 and S4D layers share: complex output matrices C (and C2 for the backward direction)."""

    bidirectional: bool

    def output_matrices(self) -> list[torch.Tensor]:
        """C complex, and C2 for the backward direction when bidirectional."""
        cs = [_complex(self.C)]
        if self.bidirectional:
            cs.append(_complex(self.C2))
        return cs


# --------------------------------------------------------------------------------------------------------------
# MIMO S5 layer
# --------------------------------------------------------------------------------------------------------------


class S5SSM(_DiagonalSSM):
    """One MIMO diagonal SSM (S5): `n_states` complex states shared by the H channels.

    Parameters: Lambda_re, Lambda_im (n,), B (n, H, 2), C (H, n, 2) (+ C2 for the backward direction), D (H,),
    log_step (n,) (one Delta per state, as in S5).
    """

    kind = "s5"

    def __init__(self, d_model: int, state_size: int = 32, blocks: int = 1, conj_sym: bool = True,
                 bidirectional: bool = False, init: str = "hippo", dt_min: float = 1e-3, dt_max: float = 1e-1,
                 clip_eigs: bool = True, mode: str = "fft", n_states: int | None = None, seed: int | None = None):
        """
        Args:
            d_model: H, channels in and out.
            state_size: P, the (unpruned) state dimension; with `conj_sym` P/2 complex states are stored.
            blocks: J, the HiPPO initialisation is block-diagonal with J blocks of size P/J.
            conj_sym: Store one state per conjugate pair and output 2 Re(C x).
            bidirectional: Add a backward scan with its own C (C2), as S5 on LRA.
            init: "hippo" (diagonalised HiPPO-LegS, S5's default) or "s4d_lin".
            dt_min: Smallest initial step Delta.
            dt_max: Largest initial step Delta.
            clip_eigs: Keep Re(Lambda) <= -1e-4 so |Lambda_bar| < 1 (the AIRE energy is finite only then).
            mode: "fft" (convolution) or "scan" (parallel scan).
            n_states: Stored states; default P/2 (conj_sym) or P. A pruned layer has fewer.
            seed: Seed of this layer's initialisation (None: torch's global generator).
        """
        super().__init__()
        if mode not in RECURRENCES:
            raise ValueError(f"mode must be one of {sorted(RECURRENCES)}, got {mode!r}")
        if state_size % blocks or (conj_sym and (state_size // blocks) % 2):
            raise ValueError(f"state_size {state_size} must split into {blocks} blocks (of even size with conj_sym)")
        self.d_model, self.conj_sym, self.bidirectional = d_model, conj_sym, bidirectional
        self.clip_eigs, self.mode = clip_eigs, mode
        full = state_size // 2 if conj_sym else state_size
        n = full if n_states is None else int(n_states)
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()) if seed is None else seed)

        lam, b_tilde, c_tilde = self._initial_system(d_model, state_size, blocks, conj_sym, init, gen)
        c_tilde2 = self._initial_system(d_model, state_size, blocks, conj_sym, init, gen)[2]
        lam, b_tilde, c_tilde, c_tilde2 = lam[:n], b_tilde[:n], c_tilde[:, :n], c_tilde2[:, :n]
        self.Lambda_re = nn.Parameter(torch.tensor(lam.real, dtype=torch.float32))
        self.Lambda_im = nn.Parameter(torch.tensor(lam.imag, dtype=torch.float32))
        self.B = nn.Parameter(torch.tensor(np.stack([b_tilde.real, b_tilde.imag], -1), dtype=torch.float32))
        self.C = nn.Parameter(torch.tensor(np.stack([c_tilde.real, c_tilde.imag], -1), dtype=torch.float32))
        if bidirectional:
            self.C2 = nn.Parameter(torch.tensor(np.stack([c_tilde2.real, c_tilde2.imag], -1), dtype=torch.float32))
        self.D = nn.Parameter(torch.randn(d_model, generator=gen))
        self.log_step = nn.Parameter(_log_steps(full, dt_min, dt_max, gen)[:n])
        # Pruning by masking (the official code's way): zeroes B_bar_i and C_i. Not saved; slicing replaces it.
        self.register_buffer("state_mask", torch.ones(n), persistent=False)

    @staticmethod
    def _initial_system(h: int, p: int, blocks: int, conj_sym: bool, init: str, gen: torch.Generator):
        """Lambda (n,), B_tilde = V^-1 B (n, H) and C_tilde = C V (H, n) with real B, C ~ lecun normal (S5's init)."""
        size = p // blocks
        if init == "hippo":
            lam_b, v_b = dplr_hippo(size)
        elif init == "s4d_lin":
            # S4D-Lin is already diagonal: V = I. Conjugate partners are -1/2 - i pi k, so the kept half is distinct.
            lam_b, v_b = s4d_lin(size), np.eye(size, dtype=np.complex128)
        else:
            raise ValueError(f"init must be 'hippo' or 's4d_lin', got {init!r}")
        keep = size // 2 if conj_sym else size
        lam_b, v_b = lam_b[:keep], v_b[:, :keep]
        lam = np.tile(lam_b, blocks)
        v = np.zeros((p, keep * blocks), dtype=np.complex128)
        for j in range(blocks):
            v[j * size:(j + 1) * size, j * keep:(j + 1) * keep] = v_b
        b = torch.randn(p, h, generator=gen, dtype=torch.float64, device="cpu").numpy() / math.sqrt(h)
        c = (torch.randn(h, p, generator=gen, dtype=torch.float64, device="cpu").numpy()
             + 1j * torch.randn(h, p, generator=gen, dtype=torch.float64, device="cpu").numpy()) / math.sqrt(p)
        return lam, v.conj().T @ b, c @ v

    @property
    def n_states(self) -> int:
        return self.Lambda_re.shape[0]

    def continuous(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Lambda (n,) complex and Delta (n,)."""
        return s5_continuous(self.Lambda_re, self.Lambda_im, self.log_step, self.clip_eigs)

    def discretize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """ZOH: log Lambda_bar = Lambda Delta (n,) and B_bar = (Lambda_bar - 1) / Lambda * B (n, H)."""
        return s5_discretize(self.Lambda_re, self.Lambda_im, self.log_step, self.B, self.clip_eigs)

    def modal_terms(self) -> dict[str, torch.Tensor]:
        """|Lambda_bar_i|, ||B_bar_i||^2 and ||C_i||^2 per direction: the ingredients of the pruning scores."""
        with torch.no_grad():
            cs = [self.C, self.C2] if self.bidirectional else [self.C]
            return s5_modal_terms(self.Lambda_re, self.Lambda_im, self.log_step, self.B, cs, self.clip_eigs)

    @staticmethod
    def stacked_modal_terms(ssms: list[nn.Module]) -> dict[str, torch.Tensor] | None:
        """`modal_terms` of several S5 layers at once, their parameters stacked on a leading layer dim: lam_abs and
        b_norm2 (layers, n), c_norm2 (directions, layers, n); the same numbers as layer by layer. None unless every
        layer is an S5SSM with the same number of states and the same settings (a pruned model's layers differ)."""
        first = ssms[0]
        same = (S5SSM, first.n_states, first.clip_eigs, first.bidirectional)
        if any((type(s), s.n_states, s.clip_eigs, s.bidirectional) != same for s in ssms):
            return None
        with torch.no_grad():
            def stack(name: str) -> torch.Tensor:
                return torch.stack([getattr(s, name) for s in ssms])

            cs = [stack("C"), stack("C2")] if first.bidirectional else [stack("C")]
            return s5_modal_terms(stack("Lambda_re"), stack("Lambda_im"), stack("log_step"), stack("B"), cs,
                                  first.clip_eigs)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u: (B, L, H) real -> (B, L, H)."""
        log_lam, b_bar = self.discretize()
        b_bar = b_bar * self.state_mask[:, None]
        # B_bar u with real matmuls (u is real): cheaper than complex matmuls on CPU.
        bu = torch.complex(u @ b_bar.real.T, u @ b_bar.imag.T)  # (B, L, n)
        scan = RECURRENCES[self.mode]
        xs = [scan(bu, log_lam)]
        if self.bidirectional:  # the backward state at k sums inputs j >= k
            xs.append(scan(bu.flip(1), log_lam).flip(1))
        y = 0
        for x, c in zip(xs, self.output_matrices(), strict=True):
            c = c * self.state_mask[None, :]
            y = y + x.real @ c.real.T - x.imag @ c.imag.T  # Re(C x)
        if self.conj_sym:
            y = 2 * y
        return y + self.D * u

    def keep_states(self, idx: torch.Tensor) -> S5SSM:
        """A new, smaller layer holding only the states `idx` (sorted): every per-state tensor is sliced."""
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.D.device).sort().values
        own = self._parameters
        params = {name: nn.Parameter(own[name].detach().index_select(0, idx))
                  for name in ("Lambda_re", "Lambda_im", "B", "log_step")}
        params.update((name, nn.Parameter(own[name].detach().index_select(1, idx))) for name in ("C", "C2") if name in own)
        params["D"] = nn.Parameter(own["D"].detach().clone())
        return module_like(self, params, {"state_mask": self.state_mask.index_select(0, idx)})  # same attributes

    def state_macs_per_step(self) -> int:
        """Real multiply-adds per time step spent on states: B_bar u (2nH), C x (2nH per direction), the recurrence."""
        dirs = 2 if self.bidirectional else 1
        return self.n_states * (2 * self.d_model + dirs * (2 * self.d_model + 4))


# --------------------------------------------------------------------------------------------------------------
# SISO S4D layer (states stored flat with their channel index)
# --------------------------------------------------------------------------------------------------------------


class S4DSSM(_DiagonalSSM):
    """H independent SISO diagonal SSMs (S4D) with N conjugate-symmetric complex states each, stored flat.

    Parameters: log_A_real, A_imag (M,) with Lambda = -exp(log_A_real) + i A_imag, B, C (M, 2) (+ C2), log_step (H,)
    (one Delta per channel, as in S4D), D (H,); buffer `channel` (M,) says which channel each state belongs to.
    """

    kind = "s4d"

    def __init__(self, d_model: int, state_size: int = 32, bidirectional: bool = False, init: str = "s4d_lin",
                 dt_min: float = 1e-3, dt_max: float = 1e-1, mode: str = "fft", n_states: int | None = None,
                 seed: int | None = None):
        """
        Args:
            d_model: H channels, each its own SISO system.
            state_size: N per channel (unpruned), stored as N/2 conjugate pairs; M = H N / 2 states in the layer.
            bidirectional: Add a backward kernel with its own C (C2).
            init: "s4d_lin" (-1/2 + i pi n, B = 1) or "hippo" (S4D-LegS: diagonalised HiPPO with its B).
            dt_min: Smallest initial step Delta.
            dt_max: Largest initial step Delta.
            mode: "fft" (kernel K_h = sum_m 2 Re(C_m B_bar_m Lambda_bar_m^k), FFT convolution) or "scan".
            n_states: Stored states M; default H N / 2. A pruned layer has fewer (first M of the default layout).
            seed: Seed of this layer's initialisation (None: torch's global generator).
        """
        super().__init__()
        if mode not in RECURRENCES:
            raise ValueError(f"mode must be one of {sorted(RECURRENCES)}, got {mode!r}")
        if state_size % 2:
            raise ValueError(f"S4D state_size must be even (conjugate pairs), got {state_size}")
        self.d_model, self.bidirectional, self.mode = d_model, bidirectional, mode
        self.conj_sym = True
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()) if seed is None else seed)
        half = state_size // 2
        if init == "s4d_lin":
            lam, b = s4d_lin(half), np.ones(half, dtype=np.complex128)
        elif init == "hippo":
            lam, v = dplr_hippo(state_size)
            lam, b = lam[:half], (v.conj().T @ np.sqrt(2 * np.arange(state_size) + 1.0))[:half]
        else:
            raise ValueError(f"init must be 's4d_lin' or 'hippo', got {init!r}")
        m_full = d_model * half
        m = m_full if n_states is None else int(n_states)
        lam, b = np.tile(lam, d_model)[:m], np.tile(b, d_model)[:m]
        self.log_A_real = nn.Parameter(torch.tensor(np.log(-lam.real), dtype=torch.float32))
        self.A_imag = nn.Parameter(torch.tensor(lam.imag, dtype=torch.float32))
        self.B = nn.Parameter(torch.tensor(np.stack([b.real, b.imag], -1), dtype=torch.float32))
        self.C = nn.Parameter(torch.randn(m_full, 2, generator=gen)[:m] * math.sqrt(0.5))
        if bidirectional:
            self.C2 = nn.Parameter(torch.randn(m_full, 2, generator=gen)[:m] * math.sqrt(0.5))
        self.D = nn.Parameter(torch.randn(d_model, generator=gen))
        self.log_step = nn.Parameter(_log_steps(d_model, dt_min, dt_max, gen))
        self.register_buffer("channel", torch.arange(d_model).repeat_interleave(half)[:m])
        self.register_buffer("state_mask", torch.ones(m), persistent=False)

    @property
    def n_states(self) -> int:
        return self.log_A_real.shape[0]

    def continuous(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Lambda (M,) complex (Re < 0 by construction) and each state's channel step Delta (M,)."""
        return torch.complex(-torch.exp(self.log_A_real), self.A_imag), torch.exp(self.log_step)[self.channel]

    def discretize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """ZOH: log Lambda_bar (M,) and B_bar (M,) complex."""
        lam, step = self.continuous()
        log_lam = lam * step
        return log_lam, (torch.exp(log_lam) - 1) / lam * _complex(self.B)


    def modal_terms(self) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            log_lam, b_bar = self.discretize()
            return {"lam_abs": torch.exp(log_lam.real), "b_norm2": b_bar.abs().pow(2),
                    "c_norm2": torch.stack([c.abs().pow(2) for c in self.output_matrices()])}

    def _per_channel(self, v: torch.Tensor) -> torch.Tensor:
        """Sum a (..., M) tensor over the states of each channel -> (..., H)."""
        out = v.new_zeros(*v.shape[:-1], self.d_model)
        return out.index_add_(-1, self.channel, v)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u: (B, L, H) real -> (B, L, H)."""
        log_lam, b_bar = self.discretize()
        b_bar = b_bar * self.state_mask
        length = u.shape[1]
        if self.mode == "fft":
            k = torch.arange(length, device=u.device, dtype=u.dtype)
            powers = torch.exp(k[:, None] * log_lam[None, :])  # (L, M)
            y = 0
            for direction, c in enumerate(self.output_matrices()):
                kern = self._per_channel(2 * (powers * (c * self.state_mask * b_bar)).real)  # (L, H)
                src = u if direction == 0 else u.flip(1)
                n = 2 * length
                out = torch.fft.irfft(torch.fft.rfft(src, n=n, dim=1) * torch.fft.rfft(kern, n=n, dim=0), n=n, dim=1)
                out = out[:, :length]
                y = y + (out if direction == 0 else out.flip(1))
        else:
            bu = u[..., self.channel] * b_bar  # (B, L, M) complex
            y = 0
            for direction, c in enumerate(self.output_matrices()):
                src = bu if direction == 0 else bu.flip(1)
                x = recurrence_scan(src, log_lam)
                x = x if direction == 0 else x.flip(1)
                y = y + self._per_channel(2 * (x * (c * self.state_mask)).real)
        return y + self.D * u

    def keep_states(self, idx: torch.Tensor) -> S4DSSM:
        """A new, smaller layer holding only the states `idx` (sorted)."""
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.D.device).sort().values
        own = self._parameters
        params = {name: nn.Parameter(own[name].detach().index_select(0, idx))
                  for name in ("log_A_real", "A_imag", "B", "C", "C2") if name in own}
        params.update((name, nn.Parameter(own[name].detach().clone())) for name in ("D", "log_step"))
        return module_like(self, params, {"channel": self.channel.index_select(0, idx),
                                          "state_mask": self.state_mask.index_select(0, idx)})

    def state_macs_per_step(self) -> int:
        """Real multiply-adds per step of the recurrent form: B_bar u, Lambda_bar x (complex), Re(C x) per direction."""
        dirs = 2 if self.bidirectional else 1
        return self.n_states * (2 + dirs * 6)


# --------------------------------------------------------------------------------------------------------------
# The deep classifier
# --------------------------------------------------------------------------------------------------------------


class SSMBlock(nn.Module):
    """Pre-norm residual block: x + Dropout(GLU(Dropout(GELU(SSM(Norm(x))))))."""

    def __init__(self, ssm: nn.Module, d_model: int, norm: str = "layer", glu: str = "half_glu2",
                 dropout: float = 0.1):
        super().__init__()
        if norm not in ("layer", "batch"):
            raise ValueError(f"norm must be 'layer' or 'batch', got {norm!r}")
        if glu not in ("half_glu1", "half_glu2", "full_glu", "gelu"):
            raise ValueError(f"glu must be half_glu1, half_glu2, full_glu or gelu, got {glu!r}")
        self.ssm = ssm
        self.norm_kind, self.glu = norm, glu
        self.norm = nn.LayerNorm(d_model) if norm == "layer" else nn.BatchNorm1d(d_model)
        self.out = nn.Linear(d_model, 2 * d_model if glu == "full_glu" else d_model) if glu != "gelu" else None
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.norm(x) if self.norm_kind == "layer" else self.norm(x.transpose(1, 2)).transpose(1, 2)
        y = self.ssm(z)
        g = self.drop(nn.functional.gelu(y))
        if self.glu == "half_glu1":  # GELU(y) * sigmoid(W GELU(y))
            g = g * torch.sigmoid(self.out(g))
        elif self.glu == "half_glu2":  # y * sigmoid(W GELU(y)), S5's LRA choice
            g = y * torch.sigmoid(self.out(g))
        elif self.glu == "full_glu":
            g = nn.functional.glu(self.out(g), dim=-1)
        return x + self.drop(g)


class SSMClassifier(nn.Module):
    """Encoder -> n_layers x SSMBlock -> masked mean pooling over time -> linear decoder."""

    def __init__(self, layer_type: str = "s5", d_input: int = 1, vocab_size: int = 0, num_classes: int = 10,
                 d_model: int = 64, n_layers: int = 4, state_size: int = 32, blocks: int = 1, conj_sym: bool = True,
                 bidirectional: bool = False, ssm_init: str = "hippo", norm: str = "layer", glu: str = "half_glu2",
                 dropout: float = 0.1, dt_min: float = 1e-3, dt_max: float = 1e-1, clip_eigs: bool = True,
                 mode: str = "fft", state_counts: list[int] | None = None, seed: int = 0):
        """
        Args:
            layer_type: "s5" (MIMO) or "s4d" (SISO).
            d_input: Features per time step of a real-valued input (ignored when vocab_size > 0).
            vocab_size: Token vocabulary (0: real-valued input, encoded by a linear layer).
            num_classes: Output classes.
            d_model: H.
            n_layers: Number of SSM blocks.
            state_size: P (S5, per layer) or N (S4D, per channel) before pruning.
            blocks: S5's J initialisation blocks.
            conj_sym: S5: store conjugate pairs once (S4D always does).
            bidirectional: Backward scan too.
            ssm_init: "hippo" or "s4d_lin".
            norm: "layer" or "batch".
            glu: "half_glu1", "half_glu2", "full_glu" or "gelu".
            dropout: Dropout rate.
            dt_min: Smallest initial Delta.
            dt_max: Largest initial Delta.
            clip_eigs: S5: keep Re(Lambda) < 0.
            mode: "fft" or "scan".
            state_counts: Stored states per layer of a pruned model (None: unpruned).
            seed: Seed of the SSM initialisations.
        """
        super().__init__()
        if layer_type not in ("s5", "s4d"):
            raise ValueError(f"layer_type must be 's5' or 's4d', got {layer_type!r}")
        if state_counts is not None and len(state_counts) != n_layers:
            raise ValueError(f"state_counts has {len(state_counts)} entries for {n_layers} layers")
        self.config: dict[str, Any] = dict(
            layer_type=layer_type, d_input=d_input, vocab_size=vocab_size, num_classes=num_classes, d_model=d_model,
            n_layers=n_layers, state_size=state_size, blocks=blocks, conj_sym=conj_sym, bidirectional=bidirectional,
            ssm_init=ssm_init, norm=norm, glu=glu, dropout=dropout, dt_min=dt_min, dt_max=dt_max, clip_eigs=clip_eigs,
            mode=mode, state_counts=None if state_counts is None else [int(c) for c in state_counts], seed=seed)
        self.encoder = nn.Embedding(vocab_size, d_model, padding_idx=0) if vocab_size else nn.Linear(d_input, d_model)
        layers = []
        for i in range(n_layers):
            n = None if state_counts is None else state_counts[i]
            if layer_type == "s5":
                ssm = S5SSM(d_model, state_size, blocks, conj_sym, bidirectional, ssm_init, dt_min, dt_max, clip_eigs,
                            mode, n_states=n, seed=seed * 1000 + i)
            else:
                ssm = S4DSSM(d_model, state_size, bidirectional, ssm_init, dt_min, dt_max, mode, n_states=n,
                             seed=seed * 1000 + i)
            layers.append(SSMBlock(ssm, d_model, norm, glu, dropout))
        self.layers = nn.ModuleList(layers)
        self.decoder = nn.Linear(d_model, num_classes)

    def ssms(self) -> list[nn.Module]:
        return [block.ssm for block in self.layers]

    def state_counts(self) -> list[int]:
        return [s.n_states for s in self.ssms()]

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, L, d_input) float or (B, L) token ids; x_mask: (B, L) True on real steps. Returns logits (B, K)."""
        h = self.encoder(x)
        for block in self.layers:
            h = block(h)
        if x_mask is None:
            pooled = h.mean(1)
        else:
            w = x_mask.to(h.dtype)[..., None]
            pooled = (h * w).sum(1) / w.sum(1).clamp(min=1)
        return self.decoder(pooled)

    def state_macs_per_step(self) -> int:
        return sum(s.state_macs_per_step() for s in self.ssms())
