"""timm backbones on small grey images: pooled width, per-stage maps, local weights (with a 3->1 channel stem fold)."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.core.backbones import create_backbone, create_stage_features, feature_shapes
from lit_iclr.core.errors import CheckpointError, ConfigError


def test_pooled_features_have_num_features_width():
    torch.manual_seed(0)
    net = create_backbone("resnet10t", in_chans=1)
    out = net(torch.randn(3, 1, 32, 32))
    assert out.shape == (3, net.num_features) and net.num_features == 512
    assert feature_shapes(net, 1, 28) == [(512,)]
    assert not hasattr(net, "fc") or isinstance(net.fc, torch.nn.Identity)  # classifier removed


def test_stage_features_match_feature_info():
    net = create_stage_features("resnet10t", in_chans=1, out_indices=(1, 2, 3))  # stage 0 is the stem
    maps = net(torch.randn(2, 1, 64, 64))
    assert [m.shape[1] for m in maps] == net.feature_info.channels()
    assert [64 // m.shape[-1] for m in maps] == net.feature_info.reduction()


def test_local_weights_load_and_fold_a_colour_stem(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    rgb = create_backbone("resnet10t", in_chans=3)
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in rgb.state_dict().items()}, str(path))
    grey = create_backbone("resnet10t", in_chans=1, checkpoint_path=str(path))
    x = torch.rand(2, 1, 32, 32)
    rgb.eval(), grey.eval()
    # a grey image repeated over 3 channels through the RGB net equals the grey net with the summed stem (timm's fold)
    torch.testing.assert_close(grey(x), rgb(x.repeat(1, 3, 1, 1)), rtol=1e-4, atol=1e-4)
    pth = tmp_path / "w.pth"
    torch.save({"state_dict": rgb.state_dict()}, pth)
    grey2 = create_stage_features("resnet10t", in_chans=1, checkpoint_path=str(pth), out_indices=(4,))
    grey2.eval()
    (last,) = grey2(x)  # timm's stage 4 of a ResNet (0 is the stem): the map the pooled features average
    assert last.shape[1] == 512
    torch.testing.assert_close(last.mean((2, 3)), rgb(x.repeat(1, 3, 1, 1)), rtol=1e-4, atol=1e-4)


def test_clear_errors():
    with pytest.raises(ConfigError, match="unknown timm backbone"):
        create_backbone("no_such_net", in_chans=1)
    with pytest.raises(CheckpointError, match="not found"):
        create_backbone("resnet10t", in_chans=1, checkpoint_path="/nonexistent/w.safetensors")
