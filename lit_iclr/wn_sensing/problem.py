"""A sensing problem on disk (`problem.npz`) and its generator: the target, the operator, the measurements.

`problem.npz` keys:
    sensing   (n, m*m) float for `gaussian` (row i is vec(M_i), M_i symmetric) or (n, m) for `rank_one` (row i is a_i)
    operator  0-d string: "gaussian" or "rank_one"
    y         (n,) measurements y_i = <M_i, A> + noise
    target    (m, m) the PSD matrix A, optional (without it no error against the truth can be reported)
A user brings their own operator and measurements in this layout (numpy.savez) and points `data.init_args.root` at it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError

from .sensing import OPERATORS, SensingOperator, sample_operator

TARGETS = ("synthetic", "image")


@dataclass
class Problem:
    op: SensingOperator
    y: torch.Tensor
    target: torch.Tensor | None

    @property
    def dim(self) -> int:
        return self.op.dim


def degrees_of_freedom(m: int, r: int) -> int:
    """Dimension of the rank-r PSD matrices in S^m: m r - r (r - 1) / 2."""
    return m * r - r * (r - 1) // 2


def synthetic_target(m: int, rank: int, condition_number: float, generator: torch.Generator) -> torch.Tensor:
    """A = U diag(s) U^T, U uniform on St(m, r_A), s geometric from 1 down to 1 / condition_number (||A||_2 = 1)."""
    u, _ = torch.linalg.qr(torch.randn(m, rank, generator=generator, dtype=torch.float64))
    s = torch.logspace(0, -np.log10(condition_number), rank, dtype=torch.float64) if rank > 1 else torch.ones(1,
                                                                                                            dtype=torch.float64)
    return u @ torch.diag(s) @ u.T


def image_target(m: int, rank: int, image: str = "china.jpg") -> torch.Tensor:
    """A PSD rank-r_A target made from a real photograph (scikit-learn's bundled sample images).

    The grey image is resized to m x m (area averaging) as B; A is the best rank-r_A approximation of B B^T / ||B B^T||_2,
    i.e. the top r_A eigenpairs of the image's row Gram matrix. Recovering A recovers the image's dominant row space.
    """
    from sklearn.datasets import load_sample_image

    grey = torch.from_numpy(load_sample_image(image).astype(np.float64).mean(-1))
    b = torch.nn.functional.adaptive_avg_pool2d(grey[None, None], (m, m))[0, 0] / 255.0
    gram = b @ b.T
    vals, vecs = torch.linalg.eigh(gram)
    top = vals.argsort(descending=True)[:rank]
    a = vecs[:, top] @ torch.diag(vals[top]) @ vecs[:, top].T
    return a / vals[top].max()


def generate(m: int, rank: int, condition_number: float, oversampling: float, noise: float, operator: str,
             target: str, image: str, seed: int) -> dict[str, np.ndarray]:
    """Arrays of `problem.npz`: n = ceil(oversampling * dof(m, r_A)) measurements of a rank-r_A target."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; choose one of {TARGETS}")
    g = torch.Generator().manual_seed(seed)
    a = synthetic_target(m, rank, condition_number, g) if target == "synthetic" else image_target(m, rank, image)
    n = int(np.ceil(oversampling * degrees_of_freedom(m, rank)))
    op = SensingOperator(operator, sample_operator(operator, n, m, g), m)
    y = op(a)
    if noise > 0:
        y = y + noise * torch.linalg.matrix_norm(a) / np.sqrt(n) * torch.randn(n, generator=g, dtype=torch.float64)
    return {"sensing": op.tensor.numpy(), "operator": np.array(operator), "y": y.numpy(), "target": a.numpy()}


def read_problem(path: str | Path, psd_tol: float = 1e-8) -> Problem:
    """Read and check `problem.npz` (a file, or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "problem.npz"
    if not path.exists():
        raise DatasetNotFoundError(path, "sensing problem not found",
                                   "point data.init_args.root at a problem.npz (keys sensing, operator, y[, target])")
    fix = "write it with numpy.savez(sensing=..., operator=..., y=..., target=...) as seeds/wn_sensing.md describes"
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise DatasetFormatError(path, f"not a readable npz file ({e})", fix) from e
    missing = [k for k in ("sensing", "operator", "y") if k not in arrays]
    if missing:
        raise DatasetFormatError(path, f"missing arrays {missing}", fix)
    kind = str(arrays["operator"])
    if kind not in OPERATORS:
        raise DatasetFormatError(path, f"operator is {kind!r}, expected one of {OPERATORS}", fix)
    sensing, y = arrays["sensing"].astype(np.float64), arrays["y"].astype(np.float64)
    if sensing.ndim != 2 or y.ndim != 1 or sensing.shape[0] != y.shape[0]:
        raise DatasetFormatError(path, f"sensing {sensing.shape} and y {y.shape} do not match: expected (n, d) and (n,)",
                                 fix)
    m = int(round(np.sqrt(sensing.shape[1]))) if kind == "gaussian" else sensing.shape[1]
    if kind == "gaussian" and m * m != sensing.shape[1]:
        raise DatasetFormatError(path, f"gaussian sensing rows have {sensing.shape[1]} entries, not a square m*m", fix)
    for name, arr in (("sensing", sensing), ("y", y)):
        if not np.isfinite(arr).all():
            raise DatasetFormatError(path, f"{name} holds NaN or infinite values", fix)
    target = None
    if "target" in arrays:
        target = arrays["target"].astype(np.float64)
        if target.shape != (m, m):
            raise DatasetFormatError(path, f"target has shape {target.shape}, expected ({m}, {m})", fix)
        if not np.allclose(target, target.T, atol=1e-10):
            raise DatasetFormatError(path, "target is not symmetric", "the symmetric form X Theta X^T needs A = A^T")
        low = np.linalg.eigvalsh(target).min()
        if low < -psd_tol * max(1.0, np.abs(target).max()):
            raise DatasetFormatError(path, f"target is not PSD (smallest eigenvalue {low:.3g})",
                                     "the symmetric factorisation needs A >= 0; use a PSD target")
        target = torch.from_numpy(target)
    return Problem(SensingOperator(kind, torch.from_numpy(sensing), m), torch.from_numpy(y), target)
