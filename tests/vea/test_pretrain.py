"""Vision-tower pretraining: patch labels against a brute-force pixel count, scene labels against the image, learning,
the cache (same weights, no retraining, global RNG untouched), and the frozen tower during VQA training."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.vea import VEAModule, pretrain
from lit_iclr.vea.model import CompactVLM


def brute_force_targets(boxes, classes, size, grid):
    """Pixel ownership map (later items on top), then each patch's label by counting the pixels of each box."""
    p = size // grid
    out = np.full(grid * grid, pretrain.EMPTY)
    for (top, left, h, w), c in zip(boxes, classes, strict=True):
        inside = np.zeros((size, size), bool)
        inside[top:top + h, left:left + w] = True
        for i in range(grid * grid):
            r, col = divmod(i, grid)
            if inside[r * p:(r + 1) * p, col * p:(col + 1) * p].mean() >= 0.5:
                out[i] = c
    return out


@pytest.mark.parametrize("grid", [2, 4])
def test_patch_targets_match_a_pixel_count(grid):
    rng = np.random.default_rng(0)
    for _ in range(20):
        k = int(rng.integers(1, 4))
        boxes = [(int(rng.integers(0, 17)), int(rng.integers(0, 17)), 16, 16) for _ in range(k)]
        classes = rng.integers(0, 10, k).tolist()
        np.testing.assert_array_equal(pretrain.patch_targets(boxes, classes, 32, grid),
                                      brute_force_targets(boxes, classes, 32, grid))
    # a worked case: the 16 px box at (top 2, left 1) covers patches 0, 1, 4, 5 of the 8 px grid
    assert np.flatnonzero(pretrain.patch_targets([(2, 1, 16, 16)], [3], 32, 4) == 3).tolist() == [0, 1, 4, 5]


def test_pretraining_scenes_label_the_cells_that_hold_items():
    x, y = pretrain.pretraining_scenes(60, seed=0, image_size=32, grid=2, max_items=4)
    assert x.shape == (60, 3, 32, 32) and y.shape == (60, 4) and 0 <= x.min() and x.max() <= 1  # RGB scenes
    cells = x.amax(1).unflatten(1, (2, 16)).unflatten(3, (2, 16)).permute(0, 1, 3, 2, 4).flatten(1, 2)  # (n, 4, 16, 16)
    # jitter moves an item at most 2 px into the next cell: the centre of an EMPTY cell is black, an item's is not
    centre_mass = cells[..., 3:13, 3:13].flatten(2).amax(-1)
    empty = y == pretrain.EMPTY
    assert (centre_mass[empty] == 0).all() and (centre_mass[~empty] > 0).all()
    counts = (~empty).sum(1)
    assert counts.min() == 1 and counts.max() == 4  # 1..max_items items per scene


def test_pretraining_learns_to_recognise_items_and_leaves_global_rng_alone():
    vlm = CompactVLM(10, 64, image_size=32, patch_size=16, vision_dim=32, dim=16, depth=1)
    state = torch.get_rng_state()
    res = pretrain.pretrain_vision(vlm.vision, 32, 2, steps=100, seed=0, batch_size=64, num_scenes=1200)
    assert torch.equal(torch.get_rng_state(), state)
    assert res["item_acc"] > 0.35  # 10 classes: chance 0.1


def test_cache_returns_the_same_weights_without_retraining(tmp_path, monkeypatch):
    a = CompactVLM(10, 64, image_size=32, patch_size=16, vision_dim=16, dim=16, depth=1)
    first = pretrain.pretrained_vision(a.vision, tmp_path, 32, 2, steps=3, seed=1, batch_size=8)
    assert len(list(tmp_path.glob("vision-v*-*/tower.pt"))) == 1 and not list(tmp_path.glob(".*tmp*"))

    def fail(*args, **kwargs):
        raise AssertionError("retrained although cached")

    monkeypatch.setattr(pretrain, "pretrain_vision", fail)
    torch.manual_seed(5)
    b = CompactVLM(10, 64, image_size=32, patch_size=16, vision_dim=16, dim=16, depth=1)
    assert pretrain.pretrained_vision(b.vision, tmp_path, 32, 2, steps=3, seed=1, batch_size=8) == first
    for (k, v), w in zip(a.vision.state_dict().items(), b.vision.state_dict().values(), strict=True):
        assert torch.equal(v, w), k
    with pytest.raises(AssertionError, match="retrained"):  # another seed is another cache entry
        pretrain.pretrained_vision(b.vision, tmp_path, 32, 2, steps=3, seed=2, batch_size=8)


def test_frozen_tower_is_left_out_of_the_optimizer():
    m = VEAModule(num_answers=10, vocab_size=64, patch_size=16, vision_dim=16, dim=16, depth=2, heads=2, one_cycle=False,
                  freeze_vision=True)
    opt = m.configure_optimizers()
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert not any(id(p) in in_opt for p in m.vlm.vision.parameters())
    assert all(id(p) in in_opt for p in m.vlm.layers.parameters())
