import numpy as np
import torch
from scipy.spatial.distance import jensenshannon

from lit_iclr.model_interactions.homogenisation import linear_cka, pairwise_cka, pairwise_js


def test_js_matches_scipy():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    p = torch.softmax(logits, -1).double().numpy()
    ref = np.mean([jensenshannon(p[0, i], p[1, i]) ** 2 for i in range(5)])  # scipy returns the sqrt (natural log)
    assert abs(float(pairwise_js(logits)) - ref) < 1e-5
    assert float(pairwise_js(torch.stack([logits[0], logits[0]]))) < 1e-6


def test_cka_against_hsic_formula_and_invariances():
    torch.manual_seed(0)
    x, y = torch.randn(20, 4, dtype=torch.float64), torch.randn(20, 3, dtype=torch.float64)
    H = torch.eye(20, dtype=torch.float64) - 1 / 20
    Kx, Ky = H @ x @ x.T @ H, H @ y @ y.T @ H
    ref = (Kx * Ky).sum() / ((Kx * Kx).sum().sqrt() * (Ky * Ky).sum().sqrt())
    assert torch.allclose(linear_cka(x, y), ref)
    q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    assert torch.allclose(linear_cka(x, 3 * x @ q + 1), torch.tensor(1.0, dtype=torch.float64))
    assert float(pairwise_cka(torch.stack([x, x]))) > 0.999
