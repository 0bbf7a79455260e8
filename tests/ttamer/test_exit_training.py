"""Seeded exit tables: the networks' initial weights follow `seed`, not whatever torch's global generator holds."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.ttamer import exit_training, networks


@pytest.fixture
def tiny_images(monkeypatch):
    """24 training and 8 test images instead of Fashion-MNIST (fixed, independent of the global generator); no timing."""
    g = torch.Generator().manual_seed(7)
    data = {"train": (torch.randn(24, 1, 32, 32, generator=g), torch.randint(0, 10, (24,), generator=g)),
            "test": (torch.randn(8, 1, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))}
    monkeypatch.setattr(exit_training, "fashion_tensors", lambda split, n=None: data[split])
    monkeypatch.setattr(networks, "_seconds", lambda fn, repeats=3: 1.0)  # latency is measured, not seeded
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny convolutions: more threads only contend on a loaded machine
    yield
    torch.set_num_threads(threads)


def tables(kind, backbones, seed, global_seed):
    torch.manual_seed(global_seed)  # another process (or an earlier training) leaves another global state
    cal, test = exit_training.make_tables(kind, backbones, train_images=24, epochs=1, lr=2e-3, seed=seed)
    return torch.cat([cal.logits, test.logits]), cal.cost


@pytest.mark.parametrize("kind, backbones", [("nested", ["test_resnet"]), ("cascade", ["test_resnet", "test_convnext"])])
def test_seed_fixes_the_networks(tiny_images, kind, backbones):
    a, cost_a = tables(kind, backbones, seed=0, global_seed=123)
    b, cost_b = tables(kind, backbones, seed=0, global_seed=456)
    assert torch.equal(a, b) and torch.equal(cost_a, cost_b)
    c, _ = tables(kind, backbones, seed=1, global_seed=123)
    assert not torch.allclose(a, c)
