"""Scene composition: placement, intensity, textures and occlusion checked against direct pixel arithmetic."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lit_iclr.core.scenes import compose_scene, resize_item, texture, to_uint8


def _sprite(h=28, w=28, seed=0):
    rng = np.random.default_rng(seed)
    s = np.zeros((h, w), np.uint8)
    s[6:22, 8:20] = rng.integers(80, 256, size=(16, 12))  # an opaque blob on a black background, like Fashion-MNIST
    return s


def test_resize_matches_pil_bilinear():
    s = _sprite()
    ref = np.asarray(Image.fromarray(s).resize((14, 20), Image.Resampling.BILINEAR), np.float32) / 255
    np.testing.assert_allclose(resize_item(s, 20, 14), ref)
    np.testing.assert_allclose(resize_item(s, 28, 28), s / 255, atol=1e-7)  # same size: no resampling


def test_item_lands_in_its_box_with_its_intensity():
    s = _sprite()
    out = compose_scene((40, 50), [s], boxes=[(5, 7, 28, 28)], intensities=[0.5])
    inside = out[5:33, 7:35]
    opaque = s / 255 >= 0.25
    np.testing.assert_allclose(inside[opaque], 0.5 * s[opaque] / 255, rtol=1e-6)  # opaque pixels: intensity * item
    assert out[:5].max() == 0 and out[:, :7].max() == 0 and out[33:].max() == 0  # nothing outside the box
    assert (inside[s == 0] == 0).all()  # the sprite's black background stays transparent


def test_later_items_occlude_and_background_shows_through():
    s = _sprite()
    bg = np.full((28, 28), 0.3, np.float32)
    out = compose_scene(28, [s, s], boxes=[(0, 0, 28, 28), (0, 0, 28, 28)], intensities=[1.0, 0.2], background=bg)
    opaque = s / 255 >= 0.25
    np.testing.assert_allclose(out[opaque], 0.2 * s[opaque] / 255, rtol=1e-6)  # the second, dim item is on top
    np.testing.assert_allclose(out[s == 0], 0.3)


def test_textures_have_their_period_and_multiply_the_item():
    t = texture("stripes", 8, 6, period=4)
    np.testing.assert_array_equal(t[:, 0], [1, 1, 0.25, 0.25, 1, 1, 0.25, 0.25])
    assert (t == t[:, :1]).all()  # horizontal stripes are constant along a row
    c = texture("checker", 4, 4, period=2)
    np.testing.assert_array_equal(c, [[1, .25, 1, .25], [.25, 1, .25, 1], [1, .25, 1, .25], [.25, 1, .25, 1]])
    assert (texture("solid", 3, 3) == 1).all() and (texture("dots", 8, 8) < 1).mean() == 0.25
    s = np.full((8, 6), 255, np.uint8)
    out = compose_scene(8, [s], boxes=[(0, 0, 8, 6)], textures=[t])
    np.testing.assert_allclose(out[:, :6], t)


def test_bad_boxes_and_sizes_raise():
    s = _sprite()
    with pytest.raises(ValueError, match="does not fit"):
        compose_scene(20, [s], boxes=[(0, 0, 28, 28)])
    with pytest.raises(ValueError, match="texture"):
        compose_scene(28, [s], boxes=[(0, 0, 28, 28)], textures=[texture("solid", 5, 5)])
    with pytest.raises(ValueError):
        texture("zigzag", 4, 4)
    assert to_uint8(np.array([[0.0, 0.5, 1.2]])).tolist() == [[0, 128, 255]]
