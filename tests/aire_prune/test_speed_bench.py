"""benchmarks/aire_prune_speed.py, the project's side: the keep mask it reports for a prune is the one the authors'
code selects from the same weights, computed here from the raw parameters with numpy as `s5/ssm.py` (`S5SSM.setup`:
ZOH, the AIRE score, the LAMP line) and `s5/train.py` (`_topk_mask_desc`, K = floor((1 - ratio) * states)) do. The
official code is not needed to run this test."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.benchmark_script import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("aire_prune_speed")


def official_keep_mask(weights: dict[str, np.ndarray], layers: int, ratio: float) -> np.ndarray:
    """The official selection, written out in numpy (float64) from the parameters."""
    scores = []
    for i in range(layers):
        w = {k.split(".")[-1]: v.astype(np.float64) for k, v in weights.items() if k.startswith(f"layers.{i}.ssm.")}
        lam = np.minimum(w["Lambda_re"], -1e-4) + 1j * w["Lambda_im"]  # clip_eigs
        lam_bar = np.exp(lam * np.exp(w["log_step"]))
        b_bar = ((lam_bar - 1) / lam)[:, None] * (w["B"][..., 0] + 1j * w["B"][..., 1])
        c = w["C"][..., 0] + 1j * w["C"][..., 1]
        s = np.linalg.norm(c, axis=0) ** 2 * np.linalg.norm(b_bar, axis=1) ** 2 / ((1 - np.abs(lam_bar) ** 2) + 1e-8)
        energy = np.empty_like(s)
        energy[np.argsort(s)] = np.sort(s) / np.cumsum(np.sort(s)[::-1])[::-1]
        scores.append(energy)
    flat = np.concatenate(scores)
    keep = max(int(flat.size * (100.0 - 100.0 * ratio) / 100.0), 1)
    order = np.lexsort((np.arange(flat.size)[::-1], -flat))
    mask = np.zeros(flat.size, dtype=int)
    mask[order[:keep]] = 1
    return mask


@pytest.mark.parametrize("what", ["plan", "prune"])
@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.8])
def test_reported_keep_mask_is_the_official_selection(bench, tmp_path, what, ratio):
    torch.manual_seed(0)
    model = bench.project_model(28)
    with torch.no_grad():  # spread the states' scores as training does (|Lambda_bar| and the B, C norms vary)
        for block in model.layers:
            block.ssm.log_step.add_(torch.randn_like(block.ssm.log_step))
            block.ssm.C.mul_(torch.rand(1, block.ssm.C.shape[1], 1) * 3)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    np.savez(tmp_path / "w.npz", **weights)
    mask = np.array(bench.prune_runner(str(tmp_path / "w.npz"), 28, ratio, what)(2)["mask"])
    expected = official_keep_mask(weights, bench.LAYERS, ratio)
    assert mask.size == bench.LAYERS * bench.P // 2 == 64
    assert mask.sum() == int(64 * (1 - ratio) + 1e-9)
    np.testing.assert_array_equal(mask, expected)
