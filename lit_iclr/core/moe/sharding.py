"""FSDP2 (`fully_shard`) for Hugging Face MoE LMs and recomputation helpers; runs on CPU (gloo) and GPU (nccl) alike.

`shard_model(model, mesh)` shards each decoder block (and, with `shard_experts`, each block's routed experts as their
own group, so only one layer's experts are ever gathered at a time) and then the root (embeddings, final norm, head),
as Lightning's `ModelParallelStrategy` expects from `configure_model`. Mixed precision is FSDP2's `MixedPrecisionPolicy`
(parameters gathered in `param_dtype`, gradients reduced in `reduce_dtype`, sharded master weights stay float32).

`checkpointed_layers(model)` wraps every decoder layer in `torch.utils.checkpoint` for one pass even in eval mode
(a calibration pass that only needs activation gradients), and restores them afterwards.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder blocks of a Hugging Face causal LM (`model.model.layers`, or any ModuleList named `layers`)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, nn.ModuleList):
        return list(layers)
    for name, mod in model.named_modules():
        if name.endswith("layers") and isinstance(mod, nn.ModuleList):
            return list(mod)
    raise ValueError(f"{type(model).__name__}: no decoder layers (a ModuleList named `layers`) to shard")


def shard_model(model: nn.Module, mesh, param_dtype: str | None = None, reduce_dtype: str | None = None,
                shard_experts: bool = False, reshard_after_forward: bool = True) -> nn.Module:
    """Apply FSDP2 per decoder block (+ per experts group), then to the root; returns the model (sharded in place)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype] if param_dtype else None,
                              reduce_dtype=DTYPES[reduce_dtype] if reduce_dtype else None)
    shard = partial(fully_shard, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    for layer in decoder_layers(model):
        if shard_experts:
            for mod in layer.modules():
                experts = getattr(mod, "experts", None)
                if isinstance(experts, nn.Module) and mod is not layer and any(True for _ in experts.parameters()):
                    shard(experts)
        shard(layer)
    shard(model)
    return model


def strategy_mesh(module):
    """The device mesh of Lightning's ModelParallelStrategy for a LightningModule (None under any other strategy).

    Its (nodes x devices per node) shape makes `fully_shard` shard within a node and replicate across nodes (HSDP);
    one node gives plain FSDP over its devices."""
    try:
        mesh = module.device_mesh
    except (RuntimeError, AttributeError):
        return None
    if mesh is None:
        return None
    return mesh if mesh.ndim == 1 or mesh.shape[0] > 1 else mesh[mesh.mesh_dim_names[-1]]


def local_numel(model: nn.Module) -> tuple[int, int]:
    """(parameters held by this rank, parameters of the whole model): a DTensor's local shard vs its global size."""
    local = total = 0
    for p in model.parameters():
        total += p.numel()
        local += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    return local, total


@contextmanager
def checkpointed_layers(model: nn.Module, use_reentrant: bool = False):
    """Within the block, every decoder layer recomputes its activations in the backward (train or eval mode)."""
    layers = decoder_layers(model)

    def wrap(layer):
        forward = layer.forward

        def run(*args, **kwargs):
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            # a KV cache would be appended to again by the replay (and its detached copy would take gradient share)
            kwargs = {k: (None if k in ("cache", "past_key_values", "layer_past") else v) for k, v in kwargs.items()}
            if "use_cache" in kwargs:
                kwargs["use_cache"] = False
            return checkpoint(partial(forward, **kwargs), *args, use_reentrant=use_reentrant)
        return run

    for layer in layers:
        layer.forward = wrap(layer)
    try:
        yield model
    finally:
        for layer in layers:
            del layer.forward
