"""Compose grey scene images from Fashion-MNIST items (or any small grey sprites), for generated image datasets.

A scene is a float32 canvas in [0, 1]. Each item is resized to its box (PIL bilinear), optionally multiplied by a texture
(`texture`) and an intensity, then drawn over what is already there ("over" compositing with opacity min(1, 4 * item), so
a later item occludes an earlier one and the items' black background stays transparent). Everything is seeded by the caller: these
functions draw no random numbers.

    from lit_iclr.core.idx import load_fashion_mnist
    images, labels = load_fashion_mnist(split="train")
    scene = compose_scene(48, [images[0], images[1]], boxes=[(2, 2, 20, 20), (20, 24, 24, 22)],
                          intensities=[1.0, 0.6], textures=[None, texture("stripes", 24, 22, period=4)])
    to_uint8(scene)  # (48, 48) uint8, ready for PIL.Image.fromarray(...).save("x.jpg")
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

TEXTURES = ("solid", "stripes", "checker", "dots")


def resize_item(item: np.ndarray, height: int, width: int | None = None) -> np.ndarray:
    """A (H, W) uint8 or [0, 1] float sprite resized to (height, width) with PIL bilinear, as float32 in [0, 1]."""
    width = height if width is None else width
    if height < 1 or width < 1:
        raise ValueError(f"item size must be positive, got {height}x{width}")
    arr = np.asarray(item)
    if arr.ndim != 2:
        raise ValueError(f"items must be 2-D grey images, got shape {arr.shape}")
    if arr.dtype != np.uint8:
        arr = (np.clip(arr, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if arr.shape == (height, width):
        return arr.astype(np.float32) / 255.0
    out = Image.fromarray(arr, mode="L").resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(out, dtype=np.float32) / 255.0


def texture(kind: str, height: int, width: int, period: int = 4, phase: int = 0) -> np.ndarray:
    """A (height, width) multiplicative texture in {low, 1}: `solid` (all 1), horizontal `stripes`, `checker`, `dots`.

    Dark cells are 0.25 rather than 0 so a textured item keeps its outline. `period` is the cell size in pixels times 2.
    """
    if kind not in TEXTURES:
        raise ValueError(f"texture kind must be one of {TEXTURES}, got {kind!r}")
    if period < 2:
        raise ValueError(f"texture period must be >= 2 pixels, got {period}")
    rows = (np.arange(height)[:, None] + phase) // (period // 2) % 2
    cols = (np.arange(width)[None, :] + phase) // (period // 2) % 2
    if kind == "solid":
        on = np.ones((height, width), dtype=bool)
    elif kind == "stripes":
        on = np.broadcast_to(rows == 0, (height, width))
    elif kind == "checker":
        on = (rows ^ cols) == 0
    else:  # dots: one lit cell in every 2x2 block of cells
        on = (rows == 1) & (cols == 1)
        on = ~on  # dark dots on a lit item
    return np.where(on, 1.0, 0.25).astype(np.float32)


def compose_scene(size: int | tuple[int, int], items: Sequence[np.ndarray], boxes: Sequence[tuple[int, int, int, int]],
                  intensities: Sequence[float] | None = None, textures: Sequence[np.ndarray | None] | None = None,
                  background: float | np.ndarray = 0.0) -> np.ndarray:
    """Draw `items` into a (H, W) canvas, each resized to its box `(top, left, height, width)`; float32 in [0, 1].

    Args:
        size: Canvas side, or (H, W).
        items: Grey sprites (uint8 0-255 or float 0-1), e.g. Fashion-MNIST images.
        boxes: One (top, left, height, width) per item; the box must lie inside the canvas.
        intensities: Per-item brightness factor in [0, 1] (default 1).
        textures: Per-item (height, width) multiplicative texture, or None for solid.
        background: A constant or a (H, W) array in [0, 1] the items are drawn over.
    """
    h, w = (size, size) if isinstance(size, int) else size
    if len(items) != len(boxes):
        raise ValueError(f"{len(items)} items but {len(boxes)} boxes")
    canvas = np.broadcast_to(np.asarray(background, dtype=np.float32), (h, w)).copy()
    for k, (item, (top, left, bh, bw)) in enumerate(zip(items, boxes, strict=True)):
        if top < 0 or left < 0 or top + bh > h or left + bw > w:
            raise ValueError(f"box {(top, left, bh, bw)} of item {k} does not fit a {h}x{w} canvas")
        sprite = resize_item(item, bh, bw)
        # opacity from the item's own brightness: its black background stays transparent, pixels >= 0.25 are opaque
        alpha = np.minimum(1.0, 4.0 * sprite)
        value = sprite * (1.0 if intensities is None else float(intensities[k]))
        if textures is not None and textures[k] is not None:
            if textures[k].shape != (bh, bw):
                raise ValueError(f"texture of item {k} has shape {textures[k].shape}, box is {(bh, bw)}")
            value = value * textures[k]
        region = canvas[top:top + bh, left:left + bw]
        canvas[top:top + bh, left:left + bw] = region * (1.0 - alpha) + value * alpha
    return canvas


def to_uint8(scene: np.ndarray) -> np.ndarray:
    """A [0, 1] float canvas as uint8 0-255 (rounded), for PIL and image files."""
    return (np.clip(scene, 0.0, 1.0) * 255.0).round().astype(np.uint8)
