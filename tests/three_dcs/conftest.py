"""One tiny generated 3DCS folder (2 torsion scans, 2 stereo parents, 1 short trajectory) shared by the tests."""
from __future__ import annotations

import pytest

from lit_iclr.three_dcs.generator import generate


@pytest.fixture(scope="session")
def tiny_3dcs(tmp_path_factory):
    root = tmp_path_factory.mktemp("three_dcs")
    generate(root, n_rotation=2, n_chirality=2, n_traj=1, conformers_per_isomer=3, traj_frames=30, traj_stride=4)
    return root
