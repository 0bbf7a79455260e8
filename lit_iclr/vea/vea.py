"""The paper's analysis and Visual Evidence Augmentation (VEA), on per-layer attention rows from the answer position.

Input everywhere: `att` (B, L, T), layer l's head-mean attention of the answer (last) position over the T input tokens,
image tokens first (N = grid^2 of them, row-major patches), then the question. Both model paths (`model.CompactVLM`,
`hf.image_attention`) produce it.

Analysis (paper section "attention analysis"; names as in the paper):
    RAPT_img(l) = A_l(image) / N_img,  RAPT_txt(l) = A_l(text) / N_txt       relative attention per token
    rapt_share(l) = RAPT_img / (RAPT_img + RAPT_txt)                         > 0.5: an image token gets more than a text one
    AUROC_l, NDCG_l of a_l = att[:, l, :N] as a score of "patch lies in the evidence box"
    seeing-but-not-believing rate = P(top-attended patch in evidence | answer wrong)

VEA (training-free; reconstructed: the paper gives the steps, not the formulas; every choice below is a config option):
    L* = top-m layers by mean calibration AUROC                                   (layer profiling, once per model)
    a = normalize(mean_{l in L*} a_l), smoothed on the patch grid (Gaussian, sigma in patches)
    M = 1 on the top-rho fraction of patches, upsampled to pixels with soft (Gaussian) edges
    x' = M * x + (1 - M) * (gamma * x + (1 - gamma) * context(x))                 gamma: retention of the context
    answer = VLM(x', question)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rapt(att: torch.Tensor, num_image: int, num_text: torch.Tensor) -> dict[str, torch.Tensor]:
    """Relative attention per token to image and text, per item and layer: (B, L) each, plus the image share of RAPT.

    `num_text` (B,) counts the real (non-padding) text tokens, the answer token included.
    """
    img = att[..., :num_image].sum(-1) / num_image
    txt = att[..., num_image:].sum(-1) / num_text[:, None].clamp(min=1)
    return {"image": img, "text": txt, "share": img / (img + txt).clamp(min=1e-12),
            "image_mass": att[..., :num_image].sum(-1)}


def patch_labels(boxes: torch.Tensor, image_size: int, grid: int, min_overlap: float = 0.5) -> torch.Tensor:
    """(B, K, 4) boxes [x0, y0, x1, y1] in pixels (rows of -1 are padding) -> (B, grid^2) bool: the patch's covered
    fraction by the union of its boxes (upper-bounded by the sum over boxes) is >= min_overlap."""
    p = image_size / grid
    lo = torch.arange(grid, device=boxes.device, dtype=boxes.dtype) * p  # patch starts along one axis
    valid = (boxes[..., 2] > boxes[..., 0])[..., None, None]  # (B, K, 1, 1)
    ox = ((torch.minimum(boxes[..., 2, None], lo + p) - torch.maximum(boxes[..., 0, None], lo)).clamp(min=0))  # (B, K, G)
    oy = ((torch.minimum(boxes[..., 3, None], lo + p) - torch.maximum(boxes[..., 1, None], lo)).clamp(min=0))
    cover = (oy[..., :, None] * ox[..., None, :] * valid).sum(1).clamp(max=p * p) / (p * p)  # (B, G_y, G_x)
    return (cover >= min_overlap).flatten(1)


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """AUROC of `scores` (..., P) for binary `labels` (..., P), per row: P(s_pos > s_neg) + 0.5 P(tie) over all pairs.

    Rows without a positive or a negative give NaN. Pairwise (P^2), which is exact with ties and cheap for patch grids.
    """
    labels = labels.bool().expand_as(scores)
    diff = scores[..., :, None] - scores[..., None, :]  # (..., P_pos, P_neg)
    win = (diff > 0).float() + 0.5 * (diff == 0).float()
    pair = (labels[..., :, None] & ~labels[..., None, :]).float()
    n = pair.sum((-1, -2))
    return torch.where(n > 0, (win * pair).sum((-1, -2)) / n.clamp(min=1), torch.nan)


def ndcg(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """NDCG over all P patches with binary relevance, patches ranked by descending score; NaN for rows without a positive."""
    labels = labels.expand_as(scores)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    rel = labels.float().gather(-1, order)
    discount = 1.0 / torch.log2(torch.arange(2, scores.shape[-1] + 2, device=scores.device, dtype=torch.float32))
    dcg = (rel * discount).sum(-1)
    ideal = (labels.float().sort(-1, descending=True).values * discount).sum(-1)
    return torch.where(ideal > 0, dcg / ideal.clamp(min=1e-12), torch.nan)


def choose_layers(layer_scores: torch.Tensor, m: int, how: str = "profiled", generator: torch.Generator | None = None,
                  exclude: list[int] | tuple[int, ...] = ()) -> list[int]:
    """m layers: `profiled` (top-m by calibration score, the paper's layer profiling), `shallow` (first m), `deep`
    (last m) or `random` (uniform without replacement; a control). A random draw avoids the layers in `exclude` (the
    profiled ones, so the control is a different set) when at least m others remain; otherwise it draws from all."""
    num_layers = len(layer_scores)
    m = min(m, num_layers)
    others = [i for i in range(num_layers) if i not in set(exclude)]
    if how == "random" and exclude and len(others) >= m:
        return sorted(others[i] for i in torch.randperm(len(others), generator=generator)[:m].tolist())
    if how == "profiled":
        return sorted(torch.nan_to_num(layer_scores, nan=-1.0).topk(m).indices.tolist())
    if how == "shallow":
        return list(range(m))
    if how == "deep":
        return list(range(num_layers - m, num_layers))
    if how == "random":
        return sorted(torch.randperm(num_layers, generator=generator)[:m].tolist())
    raise ValueError(f"layer choice must be profiled | shallow | deep | random, got {how!r}")


def sample_uniform(ids: torch.Tensor, k: int, seed: int, salt: int = 0) -> torch.Tensor:
    """(B, k) uniforms in [0, 1); row i depends only on (seed, salt, ids[i]): a sample draws the same numbers whichever
    batch, rank or process holds it (the random controls are then the same under DDP as on one process)."""
    rows = [torch.rand(k, generator=torch.Generator().manual_seed((seed * 1_000_003 + salt * 7919 + i) % 2**63))
            for i in ids.tolist()]
    return torch.stack(rows) if rows else torch.zeros(0, k)


def random_layer_weights(keys: torch.Tensor, m: int, exclude: list[int] | tuple[int, ...] = ()) -> torch.Tensor:
    """(B, L) 0/1 rows with m ones: the layers of the m smallest `keys` (uniform (B, L): m layers without replacement
    per sample), avoiding `exclude` when at least m other layers remain (as `choose_layers`' random draw)."""
    num_layers = keys.shape[1]
    m = min(m, num_layers)
    keys = keys.clone()
    if exclude and num_layers - len(set(exclude)) >= m:
        keys[:, list(exclude)] = 2.0  # after every uniform key
    return torch.zeros_like(keys).scatter_(1, keys.argsort(1)[:, :m], 1.0)


def aggregate_rows(att_img: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(B, L, N) image attention, (B, L) 0/1 layer choice per sample -> (B, N): mean over each sample's chosen layers,
    renormalised to sum 1 over patches (`aggregate` with one layer set per sample)."""
    a = (att_img * weights[..., None].to(att_img.dtype)).sum(1) / weights.sum(1, keepdim=True).clamp(min=1)
    return a / a.sum(-1, keepdim=True).clamp(min=1e-12)


def aggregate(att_img: torch.Tensor, layers: list[int]) -> torch.Tensor:
    """(B, L, N) image attention -> (B, N): mean over the chosen layers, renormalised to sum 1 over patches."""
    a = att_img[:, layers].mean(1)
    return a / a.sum(-1, keepdim=True).clamp(min=1e-12)


def gaussian_kernel(sigma: float, device=None) -> torch.Tensor:
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1, device=device, dtype=torch.float32)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    return k / k.sum()


def blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of (B, C, H, W) with replicate padding; sigma <= 0 returns x."""
    if sigma <= 0:
        return x
    k = gaussian_kernel(sigma, x.device)
    r = len(k) // 2
    c = x.shape[1]
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    return F.conv2d(F.pad(x, (0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


def evidence_mask(a: torch.Tensor, grid: int, image_size: int, top_frac: float = 0.25, smooth_sigma: float = 0.5,
                  edge_sigma: float = 1.5) -> torch.Tensor:
    """VEA's mask M (B, 1, S, S) in [0, 1]: top-rho patches of the grid-smoothed attention, upsampled, soft-edged."""
    s = blur(a.view(-1, 1, grid, grid), smooth_sigma).flatten(1)
    k = max(1, round(top_frac * grid * grid))
    keep = torch.zeros_like(s).scatter_(1, s.topk(k, dim=1).indices, 1.0)
    m = F.interpolate(keep.view(-1, 1, grid, grid), size=(image_size, image_size), mode="nearest")
    return blur(m, edge_sigma).clamp(0, 1)


def random_scores(batch: int, grid: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniform random patch scores (B, grid^2): the random-mask control, with the same number of kept patches."""
    return torch.rand(batch, grid * grid, generator=generator)


def augment(x: torch.Tensor, mask: torch.Tensor, gamma: float = 0.3, context: str = "blur", context_sigma: float = 2.0
            ) -> torch.Tensor:
    """x' = M x + (1 - M)(gamma x + (1 - gamma) c(x)): highlight the evidence, attenuate the rest toward c(x).

    context: `blur` (Gaussian, sigma in pixels), `mean` (the image's mean) or `zero`.
    """
    if context == "blur":
        c = blur(x, context_sigma)
    elif context == "mean":
        c = x.mean((-1, -2), keepdim=True).expand_as(x)
    elif context == "zero":
        c = torch.zeros_like(x)
    else:
        raise ValueError(f"context must be blur | mean | zero, got {context!r}")
    return mask * x + (1 - mask) * (gamma * x + (1 - gamma) * c)


def crop_zoom(x: torch.Tensor, a: torch.Tensor, grid: int, top_frac: float = 0.25, margin: float = 0.5) -> torch.Tensor:
    """Attention-guided cropping baseline (ViCrop-style): the bounding box of the top-rho patches, grown by `margin`
    patches, cropped and resized to the full image (bilinear, one affine grid per item)."""
    b, _, h, w = x.shape
    k = max(1, round(top_frac * grid * grid))
    idx = a.topk(k, dim=1).indices
    rows, cols = (idx // grid).float(), (idx % grid).float()
    # box in normalised [-1, 1] coordinates
    y0, y1 = (rows.min(1).values - margin) / grid, (rows.max(1).values + 1 + margin) / grid
    x0, x1 = (cols.min(1).values - margin) / grid, (cols.max(1).values + 1 + margin) / grid
    y0, x0, y1, x1 = (v.clamp(0, 1) * 2 - 1 for v in (y0, x0, y1, x1))
    theta = torch.zeros(b, 2, 3, device=x.device)
    theta[:, 0, 0], theta[:, 0, 2] = (x1 - x0) / 2, (x1 + x0) / 2
    theta[:, 1, 1], theta[:, 1, 2] = (y1 - y0) / 2, (y1 + y0) / 2
    g = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, g, mode="bilinear", padding_mode="border", align_corners=False)


def top_patch_hit(a: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the most attended patch lies in the evidence (the 'seeing' half of seeing-but-not-believing)."""
    return labels.gather(1, a.argmax(1, keepdim=True)).squeeze(1)
