"""Pruning a Hugging Face MoE LM: HEAPr (global atomic ranking) and the baselines, producing a physically smaller model.

Atomic methods ("heapr", "wanda", "magnitude", "random") slice W_gate/W_up rows and W_down columns of each routed expert
in place, so every expert keeps its own intermediate width (`VariableWidthExperts`); shared experts and the router are
untouched and there is no weight compensation (as in the paper). Whole-expert baselines remove entire experts and their
router rows, so tokens are re-routed among the remaining experts:
- "frequency": the globally least-routed experts (routing frequency on the calibration data);
- "naee": per layer, the expert subset whose removal minimises the MoE block's output reconstruction error on the
  calibration inputs, enumerating all subsets of the given size (NAEE, "Not All Experts are Equal", Lu et al. 2024);
  above `max_subsets` subsets per layer it switches to the greedy form and says so.
"""
from __future__ import annotations

import copy
import itertools
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.moe import MoEBlock, VariableWidthExperts, check_moe, unfuse_experts

from .calibrate import Calibration, calibrate
from .scores import ATOM_METHODS, atom_scores, check_ratio, global_keep

EXPERT_METHODS = ("frequency", "naee")
METHODS = ATOM_METHODS + EXPERT_METHODS


@dataclass
class PruneReport:
    method: str
    ratio: float
    averaging: str
    atoms_total: int
    atoms_pruned: int
    routed_params_before: int
    routed_params_after: int
    params_before: int
    params_after: int
    expert_flops_before: float  # routed-expert FLOPs per token (routing frequencies of the calibration data)
    expert_flops_after: float
    calib_seconds: float
    calib_loss: float
    fisher_state_bytes: int
    widths: dict[str, list[int]] = field(default_factory=dict)

    @property
    def achieved_ratio(self) -> float:
        return self.atoms_pruned / max(self.atoms_total, 1)

    def as_dict(self) -> dict:
        return {**asdict(self), "achieved_ratio": self.achieved_ratio}


def apply_keep(blocks: list[MoEBlock], keep: list[list[torch.Tensor]]) -> None:
    """Slice every expert to its kept atoms (physically smaller tensors)."""
    for b, per in zip(blocks, keep, strict=True):
        for e, mask in enumerate(per):
            if not bool(mask.all()):
                b.set_expert(e, b.get_expert(e).select(mask.nonzero().flatten().to(b.get_expert(e).gate.device)))


def drop_experts(block: MoEBlock, keep: list[int]) -> None:
    """Remove whole experts (and their router rows); tokens are re-routed among the kept experts."""
    keep = sorted(int(k) for k in keep)
    if not keep:
        raise ValueError(f"{block.name}: cannot drop every expert")
    experts = block.experts
    if not isinstance(experts, VariableWidthExperts):
        raise TypeError("call unfuse_experts(model) first")
    idx = torch.tensor(keep, device=block.router.weight.device)
    r = block.router
    r.weight = nn.Parameter(r.weight.detach()[idx].clone(), requires_grad=r.weight.requires_grad)
    bias = getattr(r, "e_score_correction_bias", None)
    if isinstance(bias, torch.Tensor):
        r.e_score_correction_bias = bias[idx].clone()
    for obj in (r, block.module):
        for attr in ("num_experts", "num_local_experts", "n_routed_experts"):
            if isinstance(getattr(obj, attr, None), int):
                setattr(obj, attr, len(keep))
        if isinstance(getattr(obj, "top_k", None), int):
            obj.top_k = min(obj.top_k, len(keep))
    if getattr(r, "num_group", None) not in (None, 1) and len(keep) % r.num_group:
        raise ConfigError(f"{block.name}: group-limited routing needs a multiple of {r.num_group} experts")
    new = VariableWidthExperts(experts.hidden_dim, [experts.widths()[k] for k in keep], experts.act_fn)
    for j, k in enumerate(keep):
        new[j] = experts[k]
    block.module.experts = new


def routed_params(blocks: list[MoEBlock]) -> int:
    return sum(3 * block.hidden_size * w for block in blocks for w in block.widths())


def expert_flops(blocks: list[MoEBlock], calib: Calibration | None, ids: list[list[int]] | None = None) -> float:
    """Routed-expert multiply-adds x2 per token: sum_e (n_e / N) * 2 * 3 d I_e (frequencies from calibration)."""
    if calib is None:
        return float("nan")
    total = 0.0
    for bi, b in enumerate(blocks):
        freq = calib.blocks[bi].n / calib.tokens
        idx = ids[bi] if ids is not None else list(range(b.num_experts))
        # Dropped experts' tokens are re-routed to the kept ones (top-k unchanged): renormalise their frequencies.
        scale = float(freq.sum() / freq[idx].sum()) if ids is not None and float(freq[idx].sum()) > 0 else 1.0
        total += scale * sum(float(freq[i]) * 6 * b.hidden_size * w for i, w in zip(idx, b.widths(), strict=True))
    return total


def frequency_prune(blocks: list[MoEBlock], calib: Calibration, ratio: float) -> list[list[int]]:
    """Drop the globally least-routed experts until `ratio` of the routed atoms are gone; returns kept expert ids."""
    entries = [(float(calib.blocks[bi].n[e]) / calib.tokens, bi, e, w)
               for bi, b in enumerate(blocks) for e, w in enumerate(b.widths())]
    target = ratio * sum(w for *_, w in entries)
    removed, drop = 0, set()
    for _freq, bi, e, w in sorted(entries):
        if removed >= target - 0.5 * w:  # stop at the expert count closest to the atom budget
            break
        if sum(1 for (b2, _) in drop if b2 == bi) + 1 >= blocks[bi].num_experts:
            continue  # keep at least one expert per block
        drop.add((bi, e))
        removed += w
    kept = [[e for e in range(b.num_experts) if (bi, e) not in drop] for bi, b in enumerate(blocks)]
    for b, k in zip(blocks, kept, strict=True):
        drop_experts(b, k)
    return kept


@torch.no_grad()
def _block_output(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x[None]).reshape(x.shape)


def _removal_error(b: MoEBlock, x: torch.Tensor, ref: torch.Tensor, keep: list[int]) -> float:
    """||F(x) - F_S(x)||^2 of the block keeping only experts `keep`."""
    trial = copy.deepcopy(b.module)
    drop_experts(MoEBlock(b.name, b.layer, trial), list(keep))
    return float((_block_output(trial, x) - ref).float().pow(2).sum())


@torch.no_grad()
def naee_prune(blocks: list[MoEBlock], calib: Calibration, ratio: float, max_tokens: int = 4096,
               max_subsets: int = 20_000, log=print) -> list[list[int]]:
    """Per layer, drop the round(ratio * E) experts whose removal best preserves the block output.

    Exhaustive over all C(E, E - r) kept subsets (NAEE) while that is at most `max_subsets`; above it (e.g. C(60, 15) ~
    5e13 on Qwen1.5-MoE) the greedy form is used instead, and said so: r rounds, each removing the one expert whose
    removal increases the reconstruction error least (E + (E-1) + ... trials instead of C(E, E - r)).
    """
    kept = []
    for bi, b in enumerate(blocks):
        x = torch.cat(calib.blocks[bi].inputs)[:max_tokens].to(b.router.weight.device, b.router.weight.dtype)
        ref = _block_output(b.module, x)
        E = b.num_experts
        r = min(int(round(ratio * E)), E - 1)
        best = list(range(E))
        if r > 0 and math.comb(E, E - r) <= max_subsets:
            errs = {subset: _removal_error(b, x, ref, list(subset)) for subset in itertools.combinations(range(E), E - r)}
            best = list(min(errs, key=errs.get))
        elif r > 0:
            log(f"naee: {b.name}: C({E}, {E - r}) = {math.comb(E, E - r):.3g} subsets > max_subsets={max_subsets}; "
                f"using the greedy search ({r} rounds of single-expert removals)")
            for _ in range(r):
                errs = {e: _removal_error(b, x, ref, [k for k in best if k != e]) for e in best}
                best.remove(min(errs, key=errs.get))
        kept.append(best)
    for b, k in zip(blocks, kept, strict=True):
        drop_experts(b, k)
    return kept


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def prune_model(model: nn.Module, batches: Iterable[dict] | None, ratio: float, method: str = "heapr",
                averaging: str = "per_token", fisher_state: str = "full", seed: int = 0,
                calib: Calibration | None = None) -> tuple[PruneReport, Calibration | None]:
    """Calibrate (unless `calib` is given or the method needs no data) and prune `model` in place.

    Args:
        model: A Hugging Face MoE causal LM (any layout understood by `lit_iclr.core.moe`).
        batches: Calibration LM batches (held-out text).
        ratio: Fraction of the routed experts' atoms (intermediate channels) removed, strictly in (0, 1).
        method: One of METHODS.
        averaging: "per_token" (paper code) or "frequency" (see `scores`).
        fisher_state: "full" (d x d per expert, the paper) or "atom" (per-atom sums, same scores, O(I) memory).
        seed: Seed of the random baseline.
        calib: Reuse statistics from an earlier `calibrate` call on the same unpruned model.
    """
    check_ratio(ratio)
    if torch.is_inference_mode_enabled():  # e.g. from a Lightning test hook: the new weights must stay normal tensors
        with torch.inference_mode(False):
            return prune_model(model, batches, ratio, method, averaging, fisher_state, seed, calib)
    if method not in METHODS:
        raise ConfigError(f"unknown pruning method {method!r}; choose from {', '.join(METHODS)}")
    check_moe(model)
    unfuse_experts(model)
    blocks = check_moe(model)
    params_before, routed_before = count_params(model), routed_params(blocks)
    atoms_total = sum(sum(b.widths()) for b in blocks)
    if calib is None and batches is not None:
        calib = calibrate(model, batches, fisher_state=fisher_state, with_gradients=method == "heapr",
                          collect_inputs=method == "naee")
    if calib is None and method not in ("magnitude", "random"):
        raise ConfigError(f"method {method!r} needs calibration data")
    flops_before = expert_flops(blocks, calib)
    t0 = time.perf_counter()
    kept_ids = None
    if method in ATOM_METHODS:
        apply_keep(blocks, global_keep(atom_scores(calib, blocks, method, averaging, seed), ratio))
    elif method == "frequency":
        kept_ids = frequency_prune(blocks, calib, ratio)
    else:
        kept_ids = naee_prune(blocks, calib, ratio)
    blocks = check_moe(model)
    report = PruneReport(
        method=method, ratio=ratio, averaging=averaging, atoms_total=atoms_total,
        atoms_pruned=atoms_total - sum(sum(b.widths()) for b in blocks), routed_params_before=routed_before,
        routed_params_after=routed_params(blocks), params_before=params_before, params_after=count_params(model),
        expert_flops_before=flops_before, expert_flops_after=expert_flops(blocks, calib, kept_ids),
        calib_seconds=(calib.seconds if calib is not None else 0.0) + time.perf_counter() - t0,
        calib_loss=calib.loss if calib is not None else float("nan"),
        fisher_state_bytes=calib.state_bytes() if calib is not None else 0,
        widths={b.name: b.widths() for b in blocks})
    return report, calib
