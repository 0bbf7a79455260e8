"""timm image backbones for the platform's small grey (or few-channel) images.

Two entry points, both plain `nn.Module`s built by `timm.create_model`:

- `create_backbone(name, in_chans)`: pooled features, `forward(x: (B, in_chans, H, W)) -> (B, num_features)`; the
  module's `num_features` attribute is the feature width (timm's own attribute, classifier removed).
- `create_stage_features(name, in_chans, out_indices)`: per-stage feature maps, `forward(x) -> list[(B, C_i, H_i, W_i)]`;
  `feature_info.channels()` and `feature_info.reduction()` give each stage's width and stride.

Any timm architecture name works (`timm.list_models()`); for CPU-sized runs on 28-64 px images, `resnet10t`,
`test_resnet`, `test_convnext` or `test_vit` (pass `img_size=`) are small. Extra keyword arguments go to
`timm.create_model` (e.g. `drop_rate`, `img_size`, `patch_size`).

Weights never download at run time: `pretrained=True` uses timm's hub cache only when it is already there (set
`HF_HUB_OFFLINE=1`), and `checkpoint_path` loads a local `.safetensors` (or `.pth`/`.bin`, read with
`torch.load(weights_only=True)`), handed to timm's own loader, which folds a 3-channel stem into `in_chans` and drops a
classifier of another size.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .errors import CheckpointError, ConfigError


def _create(name: str, in_chans: int, pretrained: bool, checkpoint_path: str | None, **kwargs) -> nn.Module:
    import timm  # imported here so `lit_iclr.core` stays light

    if not timm.is_model(name):
        raise ConfigError(f"unknown timm backbone {name!r}; pick one of timm.list_models(), e.g. 'resnet10t' or 'test_resnet'")
    if checkpoint_path is not None:
        # timm's own pretrained path, fed a state dict read safely here: it folds a 3-channel stem into `in_chans`,
        # drops a classifier of another size and works with features_only
        kwargs["pretrained_cfg_overlay"] = {**kwargs.get("pretrained_cfg_overlay", {}),
                                            "state_dict": read_state_dict(checkpoint_path)}
        pretrained = True
    try:
        return timm.create_model(name, pretrained=pretrained, in_chans=in_chans, **kwargs)
    except (OSError, RuntimeError) as e:  # no cached weights offline, no network, or weights of another architecture
        if not pretrained:
            raise
        where = checkpoint_path or "timm's hub cache"
        raise CheckpointError(where, f"pretrained weights for {name!r} could not be loaded ({str(e).splitlines()[0]})",
                              "pass checkpoint_path pointing at local weights of this architecture, or pretrained: false") from e


def create_backbone(name: str, in_chans: int = 1, pretrained: bool = False, checkpoint_path: str | None = None,
                    **kwargs) -> nn.Module:
    """A timm model without classifier: `(B, in_chans, H, W) -> (B, model.num_features)` globally pooled features.

    Args:
        name: timm architecture name (e.g. `resnet10t`, `resnet18`, `test_resnet`, `convnext_atto`, `test_vit`).
        in_chans: Input channels (1 for grey images); timm builds the stem for it.
        pretrained: Load timm's pretrained weights from the local hub cache (never downloads when offline).
        checkpoint_path: Local weight file (`.safetensors`, or `.pth`/`.bin` read with `weights_only=True`).
        **kwargs: Passed to `timm.create_model` (`drop_rate`, `img_size`, `global_pool`, ...).
    """
    kwargs.setdefault("num_classes", 0)  # timm: num_classes=0 removes the head and returns pooled features
    return _create(name, in_chans, pretrained, checkpoint_path, **kwargs)


def create_stage_features(name: str, in_chans: int = 1, out_indices: tuple[int, ...] | None = None,
                          pretrained: bool = False, checkpoint_path: str | None = None, **kwargs) -> nn.Module:
    """A timm feature extractor: `(B, in_chans, H, W) -> [(B, C_i, H / r_i, W / r_i) for each stage i in out_indices]`.

    `model.feature_info.channels()` / `.reduction()` list C_i and r_i. `out_indices=None` returns every stage timm exposes.
    Same arguments as `create_backbone`; timm's `features_only=True` wraps the network so only the stages needed run.
    """
    if out_indices is not None:
        kwargs["out_indices"] = tuple(out_indices)
    return _create(name, in_chans, pretrained, checkpoint_path, features_only=True, **kwargs)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a local `.safetensors` file, or a `.pth`/`.bin` read with `torch.load(weights_only=True)`."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "backbone weight file not found", "point checkpoint_path at a local weight file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any unpickling refusal or corrupt file
        raise CheckpointError(path, f"not a plain tensor state dict ({e.__class__.__name__})",
                              "save the weights with safetensors or torch.save(model.state_dict())") from e
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise CheckpointError(path, "holds no state dict", "save the weights with torch.save(model.state_dict())")
    return state


def feature_shapes(model: nn.Module, in_chans: int, size: int | tuple[int, int]) -> list[tuple[int, ...]]:
    """Shapes (without batch) a backbone or stage extractor returns for one `size` image: a cheap dry run on zeros."""
    h, w = (size, size) if isinstance(size, int) else size
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(torch.zeros(1, in_chans, h, w))
    model.train(was_training)
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [tuple(o.shape[1:]) for o in outs]
