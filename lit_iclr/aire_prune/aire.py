"""AIRE-Prune: score every state of a deep diagonal SSM, normalise per layer, keep the global top-K, slice.

Score of state i of a layer (its modal subsystem h_k = C_i Lambda_bar_i^k B_bar_i, k >= 0):

    AIRE       s_i = ||C_i||^2 ||B_bar_i||^2 / (1 - |Lambda_bar_i|^2)      = sum_k ||h_k||_F^2 (squared H2 norm)
    LAST       s_i = ||C_i||^2 ||B_bar_i||^2 / (1 - |Lambda_bar_i|)^2      (squared H-infinity norm; Gwak et al. 2024)
    magnitude  s_i = ||B_bar_i|| ||C_i||
    random     s_i ~ U(0, 1)
    modal      s_i = ||C_i|| ||B_bar_i|| / (1 - |Lambda_bar_i|)           (H-infinity norm of the mode: classical
               modal truncation; its error bound is the sum of the dropped s_i)

Bidirectional layers have one C per direction. The intended AIRE form averages the energies, 1/2 (||C_f||^2 + ||C_b||^2);
the official code's active line reads `(|C_f| + |C_b|)/2**2 * ...`, i.e. (||C_f|| + ||C_b||) / 4 by operator precedence,
kept here as `bidir="quirk"` for exact reproduction.

Layer-wise normalisation (LAMP-style, as LAST): with the layer's scores sorted ascending s_(1) <= ... <= s_(P),
    s^_(k) = s_(k) / sum_{j >= k} s_(j),
so the strongest state of every layer scores 1. Then one global threshold: the K = floor((1 - rho) * total) states
with the largest s^ over all layers are kept (ties go to the earlier index), without retraining. Each layer keeps at
least its strongest state (K is raised to n_layers if needed), so no layer is left without states.

`modal` is the control-theory baseline: modal truncation of each layer to the same order, no LAMP and no global
threshold: every layer keeps max(floor((1 - rho) * n_l), 1) of its modes, those of largest H-infinity norm.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lit_iclr.aire_prune.modcopy import copy_module

METHODS = ("aire", "last", "magnitude", "random", "modal")
UNIFORM = ("modal",)  # methods that prune every layer by the same fraction (no LAMP, no global threshold)
EPS = 1e-8  # added to the denominators, as the official code does


def score_from_terms(terms: dict[str, torch.Tensor], method: str = "aire", bidir: str = "intended",
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-state score (n,) from `modal_terms()` of a layer: lam_abs (n,), b_norm2 (n,), c_norm2 (directions, n)."""
    lam_abs = terms["lam_abs"].double()
    b2 = terms["b_norm2"].double()
    c2 = terms["c_norm2"].double()
    if bidir == "intended":
        c_term = c2.mean(0)  # 1/2 (||C_f||^2 + ||C_b||^2); the plain ||C||^2 for one direction
    elif bidir == "quirk":
        c_term = c2.sqrt().sum(0) / 2**2 if c2.shape[0] == 2 else c2[0]  # (|C_f| + |C_b|) / 2**2
    else:
        raise ValueError(f"bidir must be 'intended' or 'quirk', got {bidir!r}")
    if method == "aire":
        return c_term * b2 / ((1 - lam_abs**2) + EPS)
    if method == "last":
        return c_term * b2 / ((1 - lam_abs) ** 2 + EPS)
    if method == "magnitude":
        return b2.sqrt() * c_term.sqrt()
    if method == "random":
        return torch.rand(lam_abs.shape, generator=generator, dtype=torch.float64)
    if method == "modal":
        return (c_term * b2).sqrt() / ((1 - lam_abs) + EPS)
    raise ValueError(f"unknown pruning method {method!r}; choose from {METHODS}")


def layer_scores(ssm, method: str = "aire", bidir: str = "intended",
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Raw score of every state of one SSM layer (S5SSM or S4DSSM)."""
    return score_from_terms(ssm.modal_terms(), method, bidir, generator)


def layerwise_normalize(scores: torch.Tensor) -> torch.Tensor:
    """LAMP normalisation: each score divided by the sum of itself and every larger score of its layer (the last dim:
    one layer (n,), or layers of one size stacked (layers, n))."""
    values, order = torch.sort(scores, dim=-1)  # ascending
    tail = torch.flip(torch.cumsum(torch.flip(values, [-1]), -1), [-1])  # sum_{j >= k} s_(j)
    return torch.empty_like(scores).scatter_(-1, order, values / tail.clamp(min=torch.finfo(scores.dtype).tiny))


def topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the k largest entries; equal scores go to the earlier index (the official `_topk_mask_desc`)."""
    n = scores.numel()
    k = max(min(int(k), n), 1)
    # Stable sort of -score keeps the original (earlier-first) order among ties.
    order = torch.sort(-scores, stable=True).indices
    mask = torch.zeros(n, dtype=torch.bool)
    mask[order[:k]] = True
    return mask


@dataclass
class PrunePlan:
    """Which states each layer keeps, and why."""

    method: str
    ratio: float
    keep: list[torch.Tensor]  # per layer, sorted indices of kept states
    sizes: list[int]  # states per layer before pruning
    normalized: list[torch.Tensor] = field(repr=False)  # per layer normalised scores
    threshold: float = 0.0  # smallest kept normalised score

    @property
    def kept_counts(self) -> list[int]:
        return [len(k) for k in self.keep]

    @property
    def layer_fractions(self) -> list[float]:
        """Fraction of states pruned in each layer."""
        return [1 - len(k) / n for k, n in zip(self.keep, self.sizes, strict=True)]

    @property
    def pruned_fraction(self) -> float:
        return 1 - sum(self.kept_counts) / sum(self.sizes)


def plan_from_scores(raw: list[torch.Tensor] | torch.Tensor, ratio: float, method: str = "aire") -> PrunePlan:
    """Normalise each layer's raw scores, keep the global top max(floor((1 - ratio) * total), n_layers), return the plan.

    `raw`: one tensor per layer, or a (layers, n) tensor when the layers are of one size (normalised in one pass).
    Every layer keeps at least its strongest state: LAMP gives each layer's top state the same score 1, so with
    ties (earlier index first) or K < n_layers a later layer could otherwise lose all its states, and a layer with
    none cannot run (the FFT convolution over zero states fails). At such ratios the pruned fraction is below `ratio`.
    """
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"prune ratio must be in [0, 1), got {ratio}")
    if method in UNIFORM:
        return _uniform_plan(list(raw), ratio, method)
    if torch.is_tensor(raw) or len({s.numel() for s in raw}) == 1:
        stacked = layerwise_normalize(raw if torch.is_tensor(raw) else torch.stack(list(raw)))
        normalized, tops = list(stacked.unbind(0)), stacked.argmax(-1)  # argmax: the first of equal maxima
    else:
        normalized = [layerwise_normalize(s) for s in raw]
        tops = torch.stack([s.argmax() for s in normalized])
    sizes = [s.numel() for s in normalized]
    flat = torch.cat(normalized)
    k = max(int((1.0 - ratio) * flat.numel() + 1e-9), len(normalized))
    forced = flat.clone()
    # each layer's top state is kept; the rest of the budget goes to the global top-K
    forced[tops + torch.tensor([0] + sizes[:-1]).cumsum(0)] = float("inf")
    mask = topk_mask(forced, k)
    keep = [torch.nonzero(m).flatten() for m in mask.split(sizes)]
    threshold = float(flat[mask].min())
    return PrunePlan(method, ratio, keep, sizes, normalized, threshold)


def _uniform_plan(raw: list[torch.Tensor], ratio: float, method: str) -> PrunePlan:
    """Every layer keeps its max(floor((1 - ratio) n_l), 1) highest raw scores (modal truncation to a fixed order)."""
    keep = [torch.sort(torch.nonzero(topk_mask(s, max(int((1.0 - ratio) * s.numel() + 1e-9), 1))).flatten()).values
            for s in raw]
    threshold = min(float(s[k].min()) for s, k in zip(raw, keep, strict=True))
    return PrunePlan(method, ratio, keep, [s.numel() for s in raw], [s.clone() for s in raw], threshold)


def plan(model, ratio: float, method: str = "aire", bidir: str = "intended", seed: int = 0) -> PrunePlan:
    """Score every layer of an `SSMClassifier` and choose the states to keep at pruning ratio `ratio`."""
    ssms = model.ssms()
    stacked = getattr(ssms[0], "stacked_modal_terms", None)  # layers of one size scored in one pass (not `random`:
    terms = stacked(ssms) if stacked is not None and method != "random" else None  # its draws go layer by layer)
    if terms is not None:
        return plan_from_scores(score_from_terms(terms, method, bidir), ratio, method)
    gen = torch.Generator().manual_seed(seed)
    return plan_from_scores([layer_scores(ssm, method, bidir, gen) for ssm in ssms], ratio, method)


def apply_mask(model, prune_plan: PrunePlan) -> None:
    """Prune by masking in place (B_bar_i and C_i zeroed; the model keeps its size)."""
    for ssm, keep in zip(model.ssms(), prune_plan.keep, strict=True):
        mask = torch.zeros(ssm.n_states, device=ssm.state_mask.device)
        mask[keep] = 1.0
        ssm.state_mask.copy_(mask)


def slice_model(model, prune_plan: PrunePlan):
    """A physically smaller copy of `model`: each layer keeps only its planned states (tensors sliced).

    The sliced SSM layers are built from the kept entries directly (`keep_states`); every other module is copied as
    `copy.deepcopy` would copy it (`modcopy.copy_module`), and the full-size SSM layers are never copied.
    """
    sliced = {id(ssm): ssm.keep_states(keep) for ssm, keep in zip(model.ssms(), prune_plan.keep, strict=True)}
    new = copy_module(model, replace=sliced)
    new.config = dict(model.config, state_counts=new.state_counts())
    return new


def prune(model, ratio: float, method: str = "aire", bidir: str = "intended", seed: int = 0):
    """Plan and slice: returns (smaller model, plan)."""
    p = plan(model, ratio, method, bidir, seed)
    return slice_model(model, p), p
