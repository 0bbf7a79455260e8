"""Hugging Face VLMs behind the same interface as `model.CompactVLM`: per-layer attention of the answer position.

Works with `transformers` VLM classes that place one placeholder token per image feature in `input_ids` and return the
language model's attentions with `output_attentions=True` under `attn_implementation="eager"` (LLaVA / LLaVA-1.5, Gemma 3;
Qwen2-VL and InternVL give the rows too, but their pixel inputs are flattened patches, so `vea_answer`'s pixel mask is
only for models with (B, C, H, W) `pixel_values`). Real checkpoints are for GPU users:

    model = LlavaForConditionalGeneration.from_pretrained("llava-hf/llava-1.5-7b-hf", attn_implementation="eager")
    inputs = processor(images=img, text=prompt, return_tensors="pt")
    rows = image_attention(model, inputs)          # rows.att_img: (B, L, 576) over LLaVA-1.5's 24x24 grid

Nothing here downloads; tests build tiny random instances from configs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import vea


@dataclass
class HFAttention:
    logits: torch.Tensor    # (B, V) next-token logits at the answer position
    att_img: torch.Tensor   # (B, L, N) head-mean attention of the last position over the image tokens, in input order
    att_text: torch.Tensor  # (B, L) attention mass on the (non-padding) text tokens
    num_text: torch.Tensor  # (B,) non-padding text tokens


def image_token_id(model) -> int:
    cfg = model.config
    for name in ("image_token_id", "image_token_index"):
        if getattr(cfg, name, None) is not None:
            return int(getattr(cfg, name))
    raise ValueError(f"{type(model).__name__}'s config names no image token (image_token_id / image_token_index)")


@torch.no_grad()
def image_attention(model, inputs: dict[str, torch.Tensor]) -> HFAttention:
    """One forward pass with `output_attentions=True`; rows of the last position, averaged over heads, per layer.

    Every item of the batch must hold the same number of image tokens (fixed-resolution models).
    """
    out = model(**inputs, output_attentions=True, return_dict=True)
    if not out.attentions:
        raise ValueError("the model returned no attentions: load it with attn_implementation='eager'")
    rows = torch.stack([a[:, :, -1].float().mean(1) for a in out.attentions], 1)  # (B, L, T)
    is_img = inputs["input_ids"] == image_token_id(model)
    n = int(is_img[0].sum())
    if n == 0 or not (is_img.sum(1) == n).all():
        raise ValueError("every item needs the same positive number of image tokens in input_ids")
    b, num_layers, t = rows.shape
    att_img = rows[is_img[:, None, :].expand(b, num_layers, t)].view(b, num_layers, n)
    real = inputs.get("attention_mask", torch.ones_like(inputs["input_ids"])).bool() & ~is_img
    att_text = (rows * real[:, None, :]).sum(-1)
    return HFAttention(out.logits[:, -1].float(), att_img, att_text, real.sum(1))


@torch.no_grad()
def vea_answer(model, inputs: dict[str, torch.Tensor], layers: list[int], grid: tuple[int, int] | int,
               top_frac: float = 0.25, gamma: float = 0.3, smooth_sigma: float = 0.5, edge_sigma_frac: float = 0.02,
               context_sigma_frac: float = 0.03) -> tuple[HFAttention, torch.Tensor]:
    """VEA on a (B, C, H, W) `pixel_values` model: the first pass's rows, and the next-token logits of the masked image.

    Pixel-space sigmas are given as fractions of the image side so they scale with the model's input resolution.
    """
    first = image_attention(model, inputs)
    gh, gw = (grid, grid) if isinstance(grid, int) else grid
    if gh != gw or first.att_img.shape[-1] != gh * gw:
        raise ValueError(f"{first.att_img.shape[-1]} image tokens do not form a square {gh}x{gw} grid")
    x = inputs["pixel_values"]
    side = x.shape[-1]
    a = vea.aggregate(first.att_img, layers)
    mask = vea.evidence_mask(a, gh, side, top_frac, smooth_sigma, edge_sigma_frac * side).to(x.dtype)
    x_aug = vea.augment(x, mask, gamma, "blur", context_sigma_frac * side)
    out = model(**{**inputs, "pixel_values": x_aug}, return_dict=True)
    return first, out.logits[:, -1].float()
