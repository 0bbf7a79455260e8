"""Small datasets in the real formats, generated once per test session."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ogbench_small(tmp_path_factory):
    """A tiny cube-single play dataset (2 + 1 episodes of 60 steps) made by OGBench's own oracles."""
    from lit_iclr.vgf.generate import generate_ogbench_manipulation

    out = tmp_path_factory.mktemp("ogbench")
    path = generate_ogbench_manipulation(out, "cube-single-v0", "play", num_episodes=2, episode_length=60, seed=0)
    return path, "cube-single-singletask-task2-v0"
