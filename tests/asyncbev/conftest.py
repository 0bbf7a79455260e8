"""One tiny generated nuScenes world shared by the reader and evaluation tests."""
from __future__ import annotations

import pytest

from lit_iclr.asyncbev.world import WorldConfig, generate_world


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("nuscenes")
    cfg = WorldConfig(num_train_scenes=1, num_val_scenes=1, scene_seconds=1.5, objects_per_scene=14, azimuth_steps=90,
                      image_width=48, image_height=32, seed=3)
    return generate_world(root, cfg)
