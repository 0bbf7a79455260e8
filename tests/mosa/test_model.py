"""Structure maps, HADC's region gating and the networks' invariances."""
from __future__ import annotations

import torch

from lit_iclr.mosa.maps import control_maps, human_region
from lit_iclr.mosa.model import VideoDiT, patchify, unpatchify
from lit_iclr.mosa.module import MoSA


def test_limb_maps_peak_on_bones_and_depth_orders_limbs():
    uv = torch.full((1, 1, 22, 2), 8.0)
    uv[0, 0, 1] = torch.tensor([2.0, 2.0])  # left hip far from the other joints: bone 0 (pelvis -> left hip) is a segment
    z = torch.full((1, 1, 22), 5.0)
    z[0, 0, 1] = 4.0  # the left hip is nearer to the camera than the pelvis
    maps = control_maps(uv, 16, z)
    assert maps.shape == (1, 1, 6, 16, 16)
    assert float(maps[0, 0, 1, 4, 4]) > 0.9  # pixel centre (4.5, 4.5) lies on the pelvis -> hip segment (left leg group)
    assert float(maps[0, 0, :5, 15, 0].max()) < 1e-3  # far from every bone
    assert float(maps[0, 0, 5, 3, 3]) < 0  # relative depth there is negative: in front of the pelvis
    assert control_maps(uv, 16).shape[2] == 5  # no depth channel without depths


def test_human_region_is_dilated_occupancy():
    maps = torch.zeros(1, 1, 6, 16, 16)
    maps[0, 0, 0, 5, 5] = 1.0  # one lit pixel in patch (1, 1) of a 4 x 4 grid of 4-pixel patches
    region = human_region(maps, 4, dilate=1).view(4, 4)
    want = torch.zeros(4, 4)
    want[0:3, 0:3] = 1
    torch.testing.assert_close(region, want)


def test_patchify_roundtrip():
    x = torch.randn(2, 3, 3, 16, 16)
    torch.testing.assert_close(unpatchify(patchify(x, 4), 4, 3, 16), x)


def test_hadc_injects_only_inside_the_human_region():
    torch.manual_seed(0)
    net = VideoDiT(32, 2, 16, "hadc", 6, dim=16, depth=1, heads=2, patch=4).eval()
    for p in net.hadc.projs:
        torch.nn.init.normal_(p.weight)  # leave the zero init so that the control has an effect
    maps = torch.zeros(1, 2, 6, 16, 16)
    maps[:, :, 0, 2:6, 2:6] = 1.0
    f, region = net.hadc.features(maps)
    h = torch.zeros(1, 2, 16, 16)
    out = net.hadc.inject(0, h, f, region, torch.zeros(1, 16))
    inside = region[0, 0, :, 0] > 0
    assert inside.any() and (~inside).any()
    assert out[0, :, ~inside].abs().max() == 0 and out[0, :, inside].abs().max() > 0


def test_zero_initialised_control_leaves_the_video_model_unchanged_at_start():
    torch.manual_seed(0)
    net = VideoDiT(32, 2, 16, "hadc", 6, dim=16, depth=1, heads=2, patch=4).eval()
    for b in net.blocks:  # give the blocks a non-trivial function
        torch.nn.init.normal_(b.ada[1].weight, std=0.1)
    torch.nn.init.normal_(net.out.weight, std=0.1)
    x, t = torch.randn(1, 2, 3, 16, 16), torch.rand(1)
    ids, mask = torch.tensor([[1, 5, 6, 0]]), torch.tensor([[True, True, True, False]])
    a = net(x, t, ids, mask, torch.zeros(1, 2, 6, 16, 16))
    b = net(x, t, ids, mask, torch.rand(1, 2, 6, 16, 16))
    torch.testing.assert_close(a, b)  # ControlNet-style zero projections: training starts from the text-only model


def test_padding_does_not_change_the_caption_encoding():
    torch.manual_seed(0)
    m = MoSA(vocab_size=32, num_frames=2, image_size=16, dim=16, depth=1, heads=2, structure_dim=16, structure_layers=1).eval()
    ids, mask = torch.tensor([[1, 5, 6, 0, 0]]), torch.tensor([[True, True, True, False, False]])
    ids2 = torch.tensor([[1, 5, 6, 9, 9]])  # different padding tokens, same mask
    a = m.video_net.text(ids, mask)[1]
    b = m.video_net.text(ids2, mask)[1]
    torch.testing.assert_close(a, b)


def test_num_threads_is_set_at_setup_and_checked():
    import pytest

    from lit_iclr.core import ConfigError

    before = torch.get_num_threads()
    want = 2 if before == 1 else 1
    try:
        model = MoSA(vocab_size=8, num_frames=4, image_size=16, dim=16, depth=1, heads=2, patch=4, structure_dim=16,
                     structure_layers=1, num_threads=want)
        model.setup("fit")
        assert torch.get_num_threads() == want
        model.teardown("fit")
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match="num_threads"):
        MoSA(vocab_size=8, num_frames=4, image_size=16, dim=16, depth=1, heads=2, patch=4, num_threads=0)
