"""VEA's math against independent computation: sklearn AUROC / NDCG, brute-force patch overlap, closed-form masks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import ndcg_score, roc_auc_score

from lit_iclr.vea import vea


def test_auroc_matches_sklearn_with_ties():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (20, 36), generator=g).float()  # many ties
    labels = torch.rand(20, 36, generator=g) < 0.2
    labels[:, 0], labels[:, 1] = True, False
    got = vea.auroc(scores, labels)
    want = [roc_auc_score(labels[i].numpy(), scores[i].numpy()) for i in range(20)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    assert torch.isnan(vea.auroc(scores[:1], torch.zeros(1, 36, dtype=torch.bool))).all()


def test_ndcg_matches_sklearn():
    g = torch.Generator().manual_seed(1)
    scores = torch.rand(10, 16, generator=g)  # no ties: sklearn averages ties, we break them by position
    labels = torch.rand(10, 16, generator=g) < 0.3
    labels[:, 3] = True
    want = [ndcg_score(labels[i : i + 1].float().numpy(), scores[i : i + 1].numpy()) for i in range(10)]
    np.testing.assert_allclose(vea.ndcg(scores, labels).numpy(), want, rtol=1e-5)
    perfect = vea.ndcg(labels.float(), labels)
    np.testing.assert_allclose(perfect.numpy(), 1.0, rtol=1e-6)


def test_patch_labels_match_brute_force_pixel_count():
    boxes = torch.tensor([[[3.0, 5.0, 19.0, 21.0], [-1, -1, -1, -1]], [[0.0, 0.0, 32.0, 8.0], [16.0, 16.0, 32.0, 32.0]]])
    got = vea.patch_labels(boxes, 32, 4, min_overlap=0.5)
    for b in range(2):
        covered = np.zeros((32, 32), bool)
        for x0, y0, x1, y1 in boxes[b].tolist():
            if x1 > x0:
                covered[int(y0):int(y1), int(x0):int(x1)] = True
        frac = covered.reshape(4, 8, 4, 8).mean((1, 3)).reshape(-1)
        np.testing.assert_array_equal(got[b].numpy(), frac >= 0.5)


def test_rapt_shares_sum_and_normalise_by_token_count():
    att = torch.tensor([[[0.5, 0.3, 0.2, 0.0]]])  # 2 image tokens, 2 text tokens (1 real + padding)
    r = vea.rapt(att, 2, torch.tensor([1]))
    assert r["image"].item() == pytest.approx(0.4) and r["text"].item() == pytest.approx(0.2)
    assert r["share"].item() == pytest.approx(0.4 / 0.6) and r["image_mass"].item() == pytest.approx(0.8)


def test_choose_layers():
    s = torch.tensor([0.5, 0.9, 0.6, 0.8])
    assert vea.choose_layers(s, 2, "profiled") == [1, 3]
    assert vea.choose_layers(s, 2, "shallow") == [0, 1] and vea.choose_layers(s, 2, "deep") == [2, 3]
    r = vea.choose_layers(s, 2, "random", torch.Generator().manual_seed(0))
    assert len(set(r)) == 2 and all(0 <= i < 4 for i in r)


def test_evidence_mask_keeps_top_patches_and_augment_closed_form():
    a = torch.zeros(1, 16)
    a[0, 5] = 1.0  # patch (1, 1) of a 4x4 grid of 8-px patches
    m = vea.evidence_mask(a, 4, 32, top_frac=1 / 16, smooth_sigma=0.0, edge_sigma=0.0)
    want = torch.zeros(32, 32)
    want[8:16, 8:16] = 1
    torch.testing.assert_close(m[0, 0], want)
    x = torch.rand(1, 1, 32, 32)
    out = vea.augment(x, m, gamma=0.25, context="zero")
    torch.testing.assert_close(out[0, 0, 8:16, 8:16], x[0, 0, 8:16, 8:16])
    torch.testing.assert_close(out[0, 0, :8], 0.25 * x[0, 0, :8])
    torch.testing.assert_close(vea.augment(x, m, gamma=1.0), x)  # gamma = 1 keeps the whole image
    soft = vea.evidence_mask(a, 4, 32, top_frac=1 / 16, smooth_sigma=0.0, edge_sigma=1.5)
    assert 0 < soft[0, 0, 8, 12] < 1 and soft[0, 0, 12, 12] > 0.95 and soft.min() >= 0


def test_blur_preserves_constants_and_mass():
    x = torch.full((1, 1, 20, 20), 0.7)
    torch.testing.assert_close(vea.blur(x, 2.0), x)
    k = vea.gaussian_kernel(1.3)
    assert k.sum().item() == pytest.approx(1.0) and torch.allclose(k, k.flip(0))


def test_crop_zoom_recovers_the_attended_quadrant():
    x = torch.zeros(1, 1, 32, 32)
    x[0, 0, 16:, :16] = torch.linspace(0, 1, 16)[:, None]  # content only in the bottom-left quadrant
    a = torch.zeros(1, 16)
    a[0, [8, 9, 12, 13]] = 1.0  # the 2x2 patches of that quadrant
    out = vea.crop_zoom(x, a, 4, top_frac=4 / 16, margin=0.0)
    small = torch.nn.functional.avg_pool2d(out, 2)  # back at the quadrant's resolution
    # interior only: the crop edges sample across the border
    torch.testing.assert_close(small[0, 0, 1:-1, 1:-1], x[0, 0, 17:-1, 1:15], atol=0.05, rtol=0)


def test_top_patch_hit():
    a = torch.tensor([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]])
    labels = torch.tensor([[False, True, False], [False, True, True]])
    assert vea.top_patch_hit(a, labels).tolist() == [True, False]


def test_random_layers_avoid_the_profiled_ones_when_enough_others_remain():
    s = torch.tensor([0.5, 0.9, 0.6, 0.8, 0.1, 0.2])
    for seed in range(20):
        r = vea.choose_layers(s, 2, "random", torch.Generator().manual_seed(seed), exclude=[1, 3])
        assert len(set(r)) == 2 and not set(r) & {1, 3}
    # 3 layers, m = 2: one other layer only, so the draw is from all layers, as before (the default config)
    s3 = torch.tensor([0.5, 0.9, 0.8])
    a = vea.choose_layers(s3, 2, "random", torch.Generator().manual_seed(0), exclude=[1, 2])
    assert a == vea.choose_layers(s3, 2, "random", torch.Generator().manual_seed(0))


def test_per_sample_draws_and_weighted_aggregation():
    u = vea.sample_uniform(torch.tensor([4, 9, 4]), 5, seed=3, salt=1)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1]) and ((u >= 0) & (u < 1)).all()
    assert torch.equal(u[1], vea.sample_uniform(torch.tensor([9]), 5, seed=3, salt=1)[0])  # batch-independent
    assert not torch.equal(u[0], vea.sample_uniform(torch.tensor([4]), 5, seed=3, salt=2)[0])  # salts differ
    keys = torch.tensor([[0.3, 0.1, 0.9, 0.2], [0.5, 0.4, 0.1, 0.8]])
    w = vea.random_layer_weights(keys, 2)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]))
    torch.testing.assert_close(vea.random_layer_weights(keys, 2, [1]), torch.tensor([[1.0, 0.0, 0.0, 1.0],
                                                                                     [1.0, 0.0, 1.0, 0.0]]))
    att = torch.rand(2, 4, 9)
    rows = vea.aggregate_rows(att, w)
    torch.testing.assert_close(rows[0], vea.aggregate(att[:1], [1, 3])[0])
    torch.testing.assert_close(rows[1], vea.aggregate(att[1:], [1, 2])[0])
