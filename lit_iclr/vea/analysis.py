"""Running the analysis and the interventions over batches of a VLM that returns answer-position attention rows.

`vlm(x, q, return_attention=True)` must return an object with `logits` (B, A), `answer_attention` (B, L, T) and
`num_image_tokens` (`model.CompactVLM` does). An answer's score is the VQA accuracy of the argmax class (`gold` holds
every class's score: 1 / 0 for single-answer records); an answer is wrong when it scores 0 (no human gave it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import vea
from .data import PAD

VARIANTS = ("plain", "vea", "vea_random_layers", "vea_shallow_layers", "vea_random_mask", "crop", "assembly", "oracle_mask")


@dataclass
class VEAConfig:
    """VEA's knobs (see `vea.py`). `num_layers` is m; `top_frac` rho; `gamma` the retention of the context."""

    num_layers: int = 2
    top_frac: float = 0.25
    smooth_sigma: float = 0.5
    edge_sigma: float = 1.5
    gamma: float = 0.3
    context: str = "blur"
    context_sigma: float = 2.0
    min_overlap: float = 0.5
    variants: tuple[str, ...] = field(default=VARIANTS)


@torch.no_grad()
def attention_batch(vlm, batch: dict[str, torch.Tensor], image_size: int, min_overlap: float) -> dict[str, torch.Tensor]:
    """One forward pass: logits, correctness, per-layer image attention (B, L, N), evidence patch labels, RAPT."""
    out = vlm(batch["x"], batch["q"], return_attention=True)
    n = out.num_image_tokens
    grid = int(round(n**0.5))
    labels = vea.patch_labels(batch["boxes"], image_size, grid, min_overlap)
    shares = vea.rapt(out.answer_attention, n, (batch["q"] != PAD).sum(1))
    att_img = out.answer_attention[..., :n]
    return {"logits": out.logits, "correct": correct(out.logits, batch["gold"]), "att_img": att_img, "labels": labels,
            "rapt_share": shares["share"], "image_mass": shares["image_mass"],
            "auroc": vea.auroc(att_img, labels[:, None]), "ndcg": vea.ndcg(att_img, labels[:, None])}


def correct(logits: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """(B,) VQA score of the predicted class (bool `gold` gives bool: right or wrong)."""
    return gold.gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)


def profile_layers(loader, vlm, image_size: int, min_overlap: float = 0.5) -> dict[str, torch.Tensor]:
    """Layer profiling on a calibration loader: mean evidence AUROC and NDCG per layer, (L,) each (NaN rows skipped)."""
    aurocs, ndcgs = [], []
    for batch in loader:
        r = attention_batch(vlm, batch, image_size, min_overlap)
        aurocs.append(r["auroc"])
        ndcgs.append(r["ndcg"])
    return {"auroc": torch.cat(aurocs).nanmean(0), "ndcg": torch.cat(ndcgs).nanmean(0)}


@torch.no_grad()
def intervene(vlm, batch: dict[str, torch.Tensor], first: dict[str, torch.Tensor], layer_auroc: torch.Tensor,
              cfg: VEAConfig, image_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Correctness (B,) of every variant in `cfg.variants`, re-answering the masked (or cropped) image once each.

    `first` is `attention_batch` of the same batch (the plain answer and its attention); `layer_auroc` the profile.
    With `batch["index"]` (the questions' dataset indices) the random controls draw per question, from
    (`generator`'s seed, index): the same draws however the questions are batched or split over ranks; without it,
    from `generator` per batch.
    """
    x, q = batch["x"], batch["q"]
    att = first["att_img"]
    grid = int(round(att.shape[-1] ** 0.5))
    m = cfg.num_layers
    ids = batch.get("index")

    def mask_answer(a: torch.Tensor) -> torch.Tensor:
        mask = vea.evidence_mask(a, grid, image_size, cfg.top_frac, cfg.smooth_sigma, cfg.edge_sigma)
        return vlm(vea.augment(x, mask, cfg.gamma, cfg.context, cfg.context_sigma), q).logits

    profiled_layers = vea.choose_layers(layer_auroc, m, "profiled")
    profiled = vea.aggregate(att, profiled_layers)
    out: dict[str, torch.Tensor] = {}
    vea_logits = None
    for name in cfg.variants:
        if name == "plain":
            logits = first["logits"]
        elif name == "vea":
            logits = vea_logits = mask_answer(profiled)
        elif name == "vea_random_layers":
            # m random layers other than the profiled ones (all layers when fewer than m others exist)
            if ids is None:
                a = vea.aggregate(att, vea.choose_layers(layer_auroc, m, "random", generator, profiled_layers))
            else:
                keys = vea.sample_uniform(ids, att.shape[1], generator.initial_seed(), salt=1).to(att.device)
                a = vea.aggregate_rows(att, vea.random_layer_weights(keys, m, profiled_layers))
            logits = mask_answer(a)
        elif name == "vea_shallow_layers":
            logits = mask_answer(vea.aggregate(att, vea.choose_layers(layer_auroc, m, "shallow")))
        elif name == "vea_random_mask":
            scores = (vea.random_scores(len(x), grid, generator) if ids is None
                      else vea.sample_uniform(ids, grid * grid, generator.initial_seed(), salt=2))
            logits = mask_answer(scores.to(x.device))
        elif name == "crop":
            logits = vlm(vea.crop_zoom(x, profiled, grid, cfg.top_frac), q).logits
        elif name == "assembly":  # AGLA-style: log-probabilities of the original and the augmented view added
            aug = vea_logits if vea_logits is not None else mask_answer(profiled)
            logits = F.log_softmax(first["logits"], -1) + F.log_softmax(aug, -1)
        elif name == "oracle_mask":  # the annotated evidence as the mask: an upper bound on what any mask can give
            logits = mask_answer(first["labels"].float())
        else:
            raise ValueError(f"unknown variant {name!r}; choose from {VARIANTS}")
        out[name] = correct(logits, batch["gold"])
    out["profiled_hit"] = vea.top_patch_hit(profiled, first["labels"])
    return out


def summarize(firsts: list[dict[str, torch.Tensor]], variants: list[dict[str, torch.Tensor]], layer_profile: dict
              ) -> dict[str, float | list[float]]:
    """Test-set numbers: accuracy of each variant, per-layer RAPT share / AUROC / NDCG / hit rates, SBNB rates."""
    cat = {k: torch.cat([f[k] for f in firsts]) for k in ("correct", "rapt_share", "image_mass", "auroc", "ndcg", "att_img",
                                                           "labels")}
    var = {k: torch.cat([v[k] for v in variants]) for k in variants[0]}
    wrong = cat["correct"] <= 0  # no human gave the answer
    ev = cat["labels"].any(1)  # questions with annotated evidence: the only ones a hit is defined for
    # per-layer hit: top-attended patch of layer l inside the evidence
    top = cat["att_img"].argmax(-1)  # (N, L)
    hit = cat["labels"].gather(1, top)  # (N, L)
    res: dict[str, float | list[float]] = {f"acc/{k}": var[k].float().mean().item() for k in var if k != "profiled_hit"}
    res.update({
        "layer/rapt_share": cat["rapt_share"].mean(0).tolist(),
        "layer/image_mass": cat["image_mass"].mean(0).tolist(),
        "layer/auroc": cat["auroc"].nanmean(0).tolist(),
        "layer/ndcg": cat["ndcg"].nanmean(0).tolist(),
        "layer/hit_wrong": hit[wrong & ev].float().mean(0).tolist() if (wrong & ev).any() else [float("nan")] * hit.shape[1],
        "layer/hit_correct": (hit[~wrong & ev].float().mean(0).tolist() if (~wrong & ev).any()
                              else [float("nan")] * hit.shape[1]),
        "calib/auroc": layer_profile["auroc"].tolist(),
        "sbnb_rate": var["profiled_hit"][wrong & ev].float().mean().item() if (wrong & ev).any() else float("nan"),
        "hit_rate_correct": var["profiled_hit"][~wrong & ev].float().mean().item() if (~wrong & ev).any() else float("nan"),
        "evidence_fraction": cat["labels"][ev].float().mean().item() if ev.any() else float("nan"),  # chance of a hit
    })
    return res
