"""Linear-Gaussian theory of K models retrained recursively on a shared pool of each other's synthetic data.

Entity k owns the task y = x^T theta~_k + eps (private real data, covariates x ~ N(0, S_k)); a public real set follows
y = x^T theta* + eps (covariates ~ N(0, S_pub)). At generation t >= 1 entity k refits least squares on n examples:
(1-alpha) beta n private, (1-alpha)(1-beta) n public, and alpha n scraped synthetic examples, an equal share from every
model j of generation t-1 (x ~ N(0, S_j), y = x^T theta_{t-1,j} + eps: a generator reproduces its own covariates and
its own fitted labels). Generation 0 uses alpha = 0. With G_k the entity's Gram matrix, the estimate is

    theta_{t,k} = G_k^{-1} [ X_priv^T y_priv + X_pub^T y_pub + sum_j X_kj^T y_kj ]
                = c_k + sum_j Q_kj theta_{t-1,j} + G_k^{-1} X_k^T eps,                                    (recursion)
    c_k  = G_k^{-1} (G_priv,k theta~_k + G_pub,k theta*),     Q_kj = G_k^{-1} G_syn,kj,

so the stacked Theta_t = c + Q Theta_{t-1} + noise, noise ~ N(0, blockdiag(sigma^2 G_k^{-1})). For fixed designs (the
covariates are drawn once; labels and noise are redrawn every generation) the mean and covariance of Theta_t obey

    m_t = c + Q m_{t-1},        C_t = Q C_{t-1} Q^T + N,                                                    (exact)

which converge iff rho(Q) < 1 to m* = (I - Q)^{-1} c and C* solving C = Q C Q^T + N. With alpha = 1 every block row of
Q sums to I, rho(Q) = 1 and the covariance grows without bound (collapse). `design="population"` replaces each Gram
matrix by its expectation n S (the large-sample limit); `monte_carlo` simulates the finite-sample process itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_discrete_lyapunov


@dataclass
class Problem:
    """K tasks in d dimensions: theta_priv (K, d), theta_pub (d,), covariances S_priv (K, d, d), S_pub (d, d)."""

    theta_priv: np.ndarray
    theta_pub: np.ndarray
    S_priv: np.ndarray
    S_pub: np.ndarray
    sigma: float = 1.0

    @property
    def K(self) -> int:
        return self.theta_priv.shape[0]

    @property
    def d(self) -> int:
        return self.theta_priv.shape[1]


def default_problem(K: int = 2, d: int = 8, sigma: float = 1.0, seed: int = 0, weak: float = 0.05) -> Problem:
    """Entity k's covariates vary mostly in its own block of d/K coordinates (variance `weak` elsewhere): each private
    set lacks what the others' hold. Tasks share a public component theta* plus an entity-specific part."""
    rng = np.random.default_rng(seed)
    theta_pub = rng.normal(size=d)
    theta_priv = theta_pub + rng.normal(size=(K, d))
    S_priv = np.empty((K, d, d))
    for k, block in enumerate(np.array_split(np.arange(d), K)):
        diag = np.full(d, weak)
        diag[block] = 1.0
        S_priv[k] = np.diag(diag)
    return Problem(theta_priv, theta_pub, S_priv, np.eye(d), sigma)


@dataclass
class Designs:
    """Covariates of one realisation: X_priv[k], X_pub[k], X_syn[k][j] (entity k's share of model j's pool)."""

    X_priv: list
    X_pub: list
    X_syn: list


def counts(n: int, alpha: float, beta: float, K: int) -> tuple[int, int, int]:
    """(private, public, synthetic per source model) example counts of one entity's n-example training mix."""
    n_syn = int(round(alpha * n / K))
    n_real = n - K * n_syn
    n_priv = int(round(beta * n_real))
    return n_priv, n_real - n_priv, n_syn


def draw_designs(p: Problem, n: int, alpha: float, beta: float, rng: np.random.Generator) -> Designs:
    n_priv, n_pub, n_syn = counts(n, alpha, beta, p.K)

    def draw(S, m):
        return rng.multivariate_normal(np.zeros(p.d), S, size=m) if m else np.zeros((0, p.d))

    return Designs([draw(p.S_priv[k], n_priv) for k in range(p.K)], [draw(p.S_pub, n_pub) for _ in range(p.K)],
                   [[draw(p.S_priv[j], n_syn) for j in range(p.K)] for _ in range(p.K)])


def grams(p: Problem, n: int, alpha: float, beta: float, design: str | Designs = "population"):
    """Gram matrices (G_priv (K,d,d), G_pub (K,d,d), G_syn (K,K,d,d)); population: expectations n_i S_i."""
    if isinstance(design, Designs):
        G_priv = np.stack([X.T @ X for X in design.X_priv])
        G_pub = np.stack([X.T @ X for X in design.X_pub])
        G_syn = np.stack([np.stack([X.T @ X for X in row]) for row in design.X_syn])
        return G_priv, G_pub, G_syn
    n_priv, n_pub, n_syn = counts(n, alpha, beta, p.K)
    G_priv = n_priv * p.S_priv
    G_pub = np.broadcast_to(n_pub * p.S_pub, G_priv.shape).copy()
    G_syn = np.broadcast_to(n_syn * p.S_priv[None], (p.K, p.K, p.d, p.d)).copy()
    return G_priv, G_pub, G_syn


@dataclass
class Recursion:
    """Stacked affine map Theta_t = c + Q Theta_{t-1} + N(0, N) of one generation (Kd-dimensional)."""

    c: np.ndarray
    Q: np.ndarray
    N: np.ndarray

    @property
    def spectral_radius(self) -> float:
        return float(np.max(np.abs(np.linalg.eigvals(self.Q)))) if self.Q.size else 0.0

    def fixed_point(self) -> tuple[np.ndarray, np.ndarray]:
        """(m*, C*) = ((I - Q)^{-1} c, solution of C = Q C Q^T + N); only defined when rho(Q) < 1."""
        if self.spectral_radius >= 1.0:
            raise ValueError(f"no fixed point: spectral radius {self.spectral_radius:.4f} >= 1")
        m = np.linalg.solve(np.eye(len(self.c)) - self.Q, self.c)
        return m, solve_discrete_lyapunov(self.Q, self.N)


def recursion(p: Problem, G_priv, G_pub, G_syn) -> Recursion:
    """c_k = G_k^{-1}(G_priv,k theta~_k + G_pub,k theta*), Q_kj = G_k^{-1} G_syn,kj, N = blockdiag(sigma^2 G_k^{-1})."""
    K, d = p.K, p.d
    G = G_priv + G_pub + G_syn.sum(1)
    Ginv = np.linalg.inv(G)
    c = np.einsum("kab,kb->ka", Ginv, np.einsum("kab,kb->ka", G_priv, p.theta_priv) + G_pub @ p.theta_pub)
    Q = np.einsum("kab,kjbc->kajc", Ginv, G_syn).reshape(K * d, K * d)
    N = np.zeros((K * d, K * d))
    for k in range(K):
        N[k * d:(k + 1) * d, k * d:(k + 1) * d] = p.sigma ** 2 * Ginv[k]
    return Recursion(c.reshape(-1), Q, N)


def moments(p: Problem, n: int, alpha: float, beta: float, generations: int,
            design0: str | Designs = "population", design: str | Designs = "population"):
    """Exact means (G+1, Kd) and covariances (G+1, Kd, Kd) of Theta_0..Theta_G (generation 0: real data only)."""
    r0 = recursion(p, *grams(p, n, 0.0, beta, design0))
    r = recursion(p, *grams(p, n, alpha, beta, design))
    m, C = [r0.c], [r0.N]
    for _ in range(generations):
        m.append(r.c + r.Q @ m[-1])            # m_t = c + Q m_{t-1}
        C.append(r.Q @ C[-1] @ r.Q.T + r.N)    # C_t = Q C_{t-1} Q^T + N
    return np.stack(m), np.stack(C), r


def risks(p: Problem, m: np.ndarray, C: np.ndarray) -> dict[str, np.ndarray]:
    """Exact expected errors from moments: R[k, j] = E (theta_k - theta~_j)^T S_j (theta_k - theta~_j) (model k on
    task j) and gap = mean over pairs of E ||theta_k - theta_l||^2 (homogenisation), each per generation."""
    K, d = p.K, p.d
    mk = m.reshape(len(m), K, d)
    Ck = C.reshape(len(C), K, d, K, d)
    diff = mk[:, :, None, :] - p.theta_priv[None, None]                        # (T, k, j, d)
    bias = np.einsum("tkja,jab,tkjb->tkj", diff, p.S_priv, diff)
    var = np.einsum("jab,tkbka->tkj", p.S_priv, Ck)                            # tr(S_j C_kk)
    R = bias + var
    gaps = []
    for k in range(K):
        for j in range(k + 1, K):
            dm = mk[:, k] - mk[:, j]
            tr = (np.einsum("taa->t", Ck[:, k, :, k]) + np.einsum("taa->t", Ck[:, j, :, j])
                  - 2 * np.einsum("taa->t", Ck[:, k, :, j]))
            gaps.append((dm ** 2).sum(-1) + tr)
    return {"R": R, "gap": np.mean(gaps, 0) if gaps else np.zeros(len(m))}


def summarize(p: Problem, R: np.ndarray, gap: np.ndarray) -> dict[str, np.ndarray]:
    """own = mean_k R[k, k]; cross = mean_{k != j} R[k, j]; per generation."""
    K = p.K
    eye = np.eye(K, dtype=bool)
    return {"own": R[:, eye].mean(-1), "cross": R[:, ~eye].mean(-1), "gap": gap}


def monte_carlo(p: Problem, designs0: Designs, designs: Designs, generations: int, replicates: int,
                rng: np.random.Generator) -> np.ndarray:
    """Simulate the finite-sample process: every generation, label the fixed covariates (real labels from the tasks,
    synthetic labels from the previous models' current estimates), add fresh noise, and refit by least squares.
    Returns Theta of every replicate, (replicates, generations + 1, K, d). Vectorised over replicates."""
    K, sigma = p.K, p.sigma

    def fit(ds: Designs, prev):  # prev: (R, K, d) or None (generation 0)
        out = []
        for k in range(K):
            X = [ds.X_priv[k], ds.X_pub[k]]
            y = [ds.X_priv[k] @ p.theta_priv[k] + np.zeros((replicates, 1)), ds.X_pub[k] @ p.theta_pub
                 + np.zeros((replicates, 1))]
            for j in range(K):
                Xs = ds.X_syn[k][j]
                if len(Xs):
                    X.append(Xs)
                    y.append(prev[:, j] @ Xs.T)                 # synthetic labels x^T theta_{t-1,j}
            Xk = np.concatenate(X)
            yk = np.concatenate(y, axis=1) + sigma * rng.standard_normal((replicates, len(Xk)))
            out.append(np.linalg.lstsq(Xk, yk.T, rcond=None)[0].T)  # one lstsq for all replicates
        return np.stack(out, 1)

    theta = [fit(designs0, None)]
    for _ in range(generations):
        theta.append(fit(designs, theta[-1]))
    return np.stack(theta, 1)


def sweep(p: Problem, n: int, alphas, betas, generations: int) -> dict[str, np.ndarray]:
    """Population-design theory over an alpha x beta grid: final own/cross risk, gap and rho(Q)."""
    out = {k: np.zeros((len(alphas), len(betas))) for k in ("own", "cross", "gap", "rho")}
    for a, alpha in enumerate(alphas):
        for b, beta in enumerate(betas):
            m, C, r = moments(p, n, alpha, beta, generations)
            s = summarize(p, **risks(p, m, C))
            for key in ("own", "cross", "gap"):
                out[key][a, b] = s[key][-1]
            out["rho"][a, b] = r.spectral_radius
    return out
