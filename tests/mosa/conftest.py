from __future__ import annotations

import pytest
import torch

from lit_iclr.mosa import HumanMotionVideo


@pytest.fixture(scope="session")
def small_data(tmp_path_factory):
    """12 generated clips (4 frames, 16 px) read back by the real readers."""
    torch.set_num_threads(1)
    dm = HumanMotionVideo(data_dir=str(tmp_path_factory.mktemp("mosa")), num_clips=12, num_frames=4, image_size=16,
                          batch_size=4)
    dm.prepare_data()
    dm.setup("fit")
    return dm
