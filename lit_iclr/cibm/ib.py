"""The paper's information-bottleneck quantities for a Gaussian concept layer p(z|x) = N(mu(x), diag sigma(x)^2).

- `est_mi`: the minibatch estimate of I(X;C) (Ji et al.'s estimator, the official `est_MI` / `log_marg_prob`):
      I_hat = mean_i [ log p(z_i|x_i) - log (1/M) sum_j p(z_i|x_j) ],   z_i ~ p(z|x_i),
  the marginal p(z_i) estimated over the same M subsample points by a logsumexp (or, `jensen=True`, its Jensen bound
  mean_j log p(z_i|x_j)). 0 <= I_hat <= log M: once I(X;C) exceeds log M it reads log M and its gradient vanishes
  (~1e-8, measured in seeds/cibm.md). The official code (dsb-ifi/cibm `src/losses.py` `est_MI`, `src/models.py`
  `StochasticMLP.log_marg_prob`) uses this estimator with sigma only clamped at 1e-7, so it has the same ceiling.
- `gaussian_mi_bound`: the variational (KL) upper bound I(X;C) <= E_x KL(p(z|x) || r(z)) with r the Gaussian of the
  subsample's moments, r = N(m, diag s^2), m = mean_i mu_i, s^2 = var_i(mu_i) + mean_i sigma_i^2 (the tightest Gaussian r
  for these moments; Alemi et al.'s VIB uses r = N(0, I)). Per dimension it is 1/2 (log s^2 - mean_i log sigma_i^2):
  no log M ceiling, a gradient at any sigma, and exact when the marginal of z is Gaussian. Not in the official code
  (a deviation, `mi_estimator: gaussian`).
- `est_hc`: the IB_E entropy surrogate, sum of log sigma over the subsample (Gaussian entropy up to constants).
- `dual_update`: after every batch beta <- beta + beta_lr * (I_c - I_hat); the official default beta_lr = -0.01, so beta
  grows while I_hat exceeds I_c and shrinks below it. The loss term is beta * (I_c - I_hat).
- `mi_cy`: I(C;Y) = E[log q(y|c) - log p(y)] from the model's label posteriors (the information plane's vertical axis).
"""
from __future__ import annotations

import math

import torch

LOG_2PI = math.log(2 * math.pi)


def gaussian_log_prob(z: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """log N(z; mu, diag sigma^2) summed over the last dimension (broadcasting over the leading ones)."""
    return (-0.5 * ((z - mu) / sigma) ** 2 - torch.log(sigma) - 0.5 * LOG_2PI).sum(-1)


def est_mi(mu: torch.Tensor, sigma: torch.Tensor, jensen: bool = False, z: torch.Tensor | None = None) -> torch.Tensor:
    """I_hat(X;C) from the M subsample points' (M, L) Gaussian parameters; z ~ N(mu, sigma) is drawn unless given."""
    if z is None:
        z = mu + sigma * torch.randn_like(mu)
    log_prob = gaussian_log_prob(z, mu, sigma)                                # log p(z_i | x_i), (M,)
    pair = gaussian_log_prob(z.unsqueeze(1), mu.unsqueeze(0), sigma.unsqueeze(0))  # log p(z_i | x_j), (M, M)
    if jensen:
        log_marg = pair.mean(1)
    else:
        log_marg = torch.logsumexp(pair, dim=1) - math.log(mu.shape[0])
    return (log_prob - log_marg).mean()


def gaussian_mi_bound(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """mean_i KL(N(mu_i, sigma_i^2) || N(m, s^2)) summed over dimensions, r = N(m, s^2) from the (M, L) subsample's moments."""
    mu, sigma = mu.flatten(1), sigma.flatten(1)
    var = sigma**2
    m = mu.mean(0)
    s2 = mu.var(0, unbiased=False) + var.mean(0)                              # variance of the aggregate posterior
    kl = 0.5 * (torch.log(s2) - torch.log(var) + (var + (mu - m) ** 2) / s2 - 1)  # KL of two diagonal Gaussians, (M, L)
    return kl.sum(1).mean()


def est_hc(sigma: torch.Tensor) -> torch.Tensor:
    """IB_E's H(C) surrogate: sum of log sigma over the subsample (official `est_HC`, eps 1e-8)."""
    return torch.sum(torch.log(sigma + 1e-8))


def dual_update(beta: float, mi: float, mi_const: float, beta_lr: float) -> float:
    """The official Lagrangian step after each batch: beta + beta_lr * (I_c - I_hat)."""
    return beta + beta_lr * (mi_const - mi)


def mi_cy(y_logits: torch.Tensor, y: torch.Tensor, num_classes: int, prior: torch.Tensor | None = None) -> torch.Tensor:
    """I(C;Y) ~ mean_i [log q(y_i|c_i) - log p(y_i)]; p(y) is the label frequency of `y` unless `prior` is given."""
    if prior is None:
        prior = torch.bincount(y, minlength=num_classes).float() / len(y)
    log_q = torch.log_softmax(y_logits, -1).gather(1, y[:, None]).squeeze(1)
    return (log_q - torch.log(prior[y])).mean()
