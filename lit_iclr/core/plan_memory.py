"""Memory per device of one training step, for `core/plan.py`, from a model built on the meta device.

Terms (bytes per device; N parameters of `w` bytes each as built, D devices per node, G = gradient-carrying parameters):

    weights       N w            DDP / one device: a full copy;  FSDP: N w / D (one shard; HSDP replicates across nodes)
    buffers       as built       not sharded (FSDP2 keeps buffers whole)
    gradients     G w            DDP: full;  FSDP: G w / D (reduce-scattered)
    ddp buckets   G w            DDP's reducer keeps its own flat copy of every gradient (gradient_as_bucket_view=False)
    optimizer     measured       the state one `optimizer.step()` creates on meta tensors (Adam: m and v, 2 G w);
                                 FSDP: / D
    gathered      2 u c          FSDP: the largest FSDP unit u (a block of the model's ModuleList) unsharded in compute
                                 bytes c, current + prefetched; u c once when the whole model is the only unit
    weight copies N 2            `*-mixed`: autocast's bf16/fp16 copies of the weights, saved for the backward
    activations   measured       bytes of the tensors autograd saves for the backward in one forward at the real batch
                                 (`saved_tensors_hooks`, each storage once, parameters and buffers excluded); 16-bit
                                 precisions halve the floating ones

`*-true` 16-bit precisions store weights, gradients and optimiser state in 2 bytes. Not counted: the transient
gradients of activations during the backward (at most about one layer's activations at a time), the allocator's
fragmentation, CUDA context and workspace (about 0.5-1 GiB per device), communication buffers beyond DDP's buckets.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

GiB = 1024 ** 3


@dataclass(frozen=True)
class Strategy:
    kind: str  # single | ddp | fsdp
    devices: int  # per node
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.devices * self.nodes

    @property
    def shards(self) -> int:
        """How many ways FSDP shards (the devices of one node; HSDP replicates over nodes); 1 otherwise."""
        return self.devices if self.kind == "fsdp" else 1

    def describe(self) -> str:
        if self.kind == "single":
            return "1 device"
        where = f"{self.devices} devices" + (f" x {self.nodes} nodes" if self.nodes > 1 else "")
        return f"{self.kind.upper()}, {where}"


FSDP_NAMES = ("fsdp", "modelparallel", "fullyshard")


def parse_strategy(trainer_cfg: dict) -> Strategy:
    """The strategy a trainer config describes: `strategy` (a name or a class_path dict), `devices`, `num_nodes`.
    `devices: auto` counts as 1 per node (say the number in the paper config)."""
    raw = trainer_cfg.get("strategy") or "auto"
    name = raw.get("class_path", "") if isinstance(raw, dict) else str(raw)
    name = name.rsplit(".", 1)[-1].lower().replace("_", "")
    devices = trainer_cfg.get("devices", 1)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    elif isinstance(devices, str):
        devices = int(devices) if devices.strip().lstrip("-").isdigit() else 1
    devices = max(int(devices), 1)
    nodes = max(int(trainer_cfg.get("num_nodes") or 1), 1)
    if any(k in name for k in FSDP_NAMES):
        kind = "fsdp"
    elif devices * nodes > 1:
        kind = "ddp"  # Lightning's `auto` with several devices, and every ddp* name
    else:
        kind = "single"
    return Strategy(kind, devices, nodes)


def as_strategy(strategy: Strategy | str, devices: int = 1, nodes: int = 1) -> Strategy:
    if isinstance(strategy, Strategy):
        return strategy
    return parse_strategy({"strategy": strategy, "devices": devices, "num_nodes": nodes})


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def activation_bytes(module: torch.nn.Module, batch, step_loss, keep_loss: bool = False):
    """Bytes autograd keeps for the backward of one forward (`step_loss(module, batch)`), split into floating and other
    tensors: every saved tensor's storage once, leaving out parameters and buffers (they are counted as weights).
    With `keep_loss`, (bytes, loss) so the caller can run the backward."""
    excluded = {_storage_key(t) for t in list(module.parameters()) + list(module.buffers())}
    saved: dict[int, tuple[int, bool]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in excluded and key not in saved:
            saved[key] = (t.untyped_storage().nbytes(), t.is_floating_point() or t.is_complex())
        return t

    module.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step_loss(module, batch)
    out = {"float": sum(n for n, f in saved.values() if f), "other": sum(n for n, f in saved.values() if not f)}
    if keep_loss:
        return out, loss
    del loss
    return out


def _optimizers(out) -> list[torch.optim.Optimizer]:
    if isinstance(out, torch.optim.Optimizer):
        return [out]
    if isinstance(out, dict):
        return _optimizers(out.get("optimizer"))
    if isinstance(out, (list, tuple)):
        found = []
        for item in out:
            if isinstance(item, (torch.optim.Optimizer, dict)) or (
                    isinstance(item, (list, tuple)) and any(isinstance(x, (torch.optim.Optimizer, dict)) for x in item)):
                found += _optimizers(item)
        return found
    return []


def optimizer_state_bytes(module: torch.nn.Module) -> tuple[int, str]:
    """Bytes of the state `configure_optimizers()`'s optimisers hold after one step, measured by stepping them on the
    meta parameters with meta gradients; (2 x trainable bytes, "assumed Adam") when that cannot run without a Trainer."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    assumed = 2 * sum(p.numel() * p.element_size() for p in trainable)
    if not trainable or any(p.device.type != "meta" for p in trainable):
        return (assumed, "assumed Adam (2 states per parameter)") if trainable else (0, "no trainable parameters")
    try:
        opts = _optimizers(module.configure_optimizers())
    except Exception as e:  # noqa: BLE001 - e.g. a schedule reading trainer.estimated_stepping_batches
        return assumed, f"assumed Adam (configure_optimizers needs a Trainer: {type(e).__name__})"
    if not opts:
        return assumed, "assumed Adam (configure_optimizers returned no optimizer)"
    for p in trainable:
        p.grad = torch.zeros_like(p)
    total = 0
    try:
        for opt in opts:
            opt.step()
            for state in opt.state.values():
                total += sum(v.numel() * v.element_size() for v in state.values()
                             if isinstance(v, torch.Tensor) and v.device.type == "meta")
        names = ", ".join(sorted({type(o).__name__ for o in opts}))
        return total, f"measured ({names})"
    except Exception as e:  # noqa: BLE001 - an optimiser with data-dependent control flow cannot step on meta tensors
        return assumed, f"assumed Adam ({type(opts[0]).__name__}.step failed on meta tensors: {type(e).__name__})"
    finally:
        for p in trainable:
            p.grad = None


def _largest_unit(module: torch.nn.Module) -> tuple[int, int]:
    """(parameters of the largest FSDP unit, how many units): the members of the model's ModuleLists / ModuleDicts (the
    decoder blocks, expert groups), or the whole model as one unit when it has no repeated blocks."""
    best = count = 0
    for m in module.modules():
        if isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            for child in m.children():
                best = max(best, sum(p.numel() for p in child.parameters()))
                count += 1
    return (best, count) if best else (sum(p.numel() for p in module.parameters()), 1)


def precision_bytes(precision: str) -> tuple[int | None, int]:
    """(storage bytes of floating weights, None = as built; compute bytes) for a Lightning precision string."""
    p = str(precision).lower()
    if p.startswith(("bf16-true", "16-true", "transformer-engine")) or p in ("bf16", "16", "half"):
        return 2, 2
    if "mixed" in p:
        return None, 2
    if p.startswith("64"):
        return 8, 8
    return None, 4


def memory_per_device(module: torch.nn.Module, batch, strategy: Strategy, precision: str = "32-true", *,
                      activations: dict[str, int], optimizer: tuple[int, str]) -> dict[str, float]:
    """The module docstring's terms in bytes per device, and `total`. `activations` from `activation_bytes` (measured
    in the dtype the model was built in, fp32 in practice), `optimizer` from `optimizer_state_bytes`."""
    store, compute = precision_bytes(precision)
    mixed = "mixed" in str(precision).lower()

    def nbytes(t: torch.Tensor) -> int:
        width = store if (store is not None and t.is_floating_point()) else t.element_size()
        return t.numel() * width

    params = list(module.parameters())
    built = sum(p.numel() * p.element_size() for p in params)
    weights = sum(nbytes(p) for p in params)
    grads = sum(nbytes(p) for p in params if p.requires_grad)
    opt_bytes = optimizer[0] * (weights / built if built else 1.0)
    shards = strategy.shards
    out: dict[str, float] = {
        "weights": weights / shards,
        "buffers": float(sum(nbytes(b) for b in module.buffers())),
        "gradients": grads / shards,
        "optimizer": opt_bytes / shards,
    }
    if strategy.kind == "ddp":
        out["ddp buckets"] = float(grads)
    if strategy.kind == "fsdp":
        unit, units = _largest_unit(module)  # the current unit and the prefetched next one (one when it is all)
        out["gathered"] = float(min(units, 2) * unit * compute) if shards > 1 else 0.0
    if mixed:
        out["weight copies"] = float(2 * sum(p.numel() for p in params if p.is_floating_point()))
    scale = compute / 4 if compute < 4 else 1.0
    out["activations"] = activations["float"] * scale + activations["other"]
    out["total"] = sum(out.values())
    return out


def held_by_forward(forward) -> tuple[int, object]:
    """(bytes the CPU allocator still holds after `forward()` that it allocated during it, its result), from the
    profiler's memory events (`profile_memory=True`: every allocation and free of the CPU allocator). An independent
    measurement of what a forward keeps for its backward, to check `activation_bytes` on a real CPU step; tensors that
    existed before the call (the inputs) are not in it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = forward()
    return sum(e.self_cpu_memory_usage for e in prof.events()), out
