"""`cli.py plan`: what a config costs at the paper's scale, without allocating or training anything.

The model is built from the config on the meta device (shapes and dtypes, no storage), then one training step runs on
meta tensors of the real input shapes (the method's `lit_iclr/<m>/plan.py` gives the batch and the step's loss):

- parameters: total, trainable and per top-level child module;
- FLOPs of one step (forward + backward) per device, counted by `torch.utils.flop_counter.FlopCounterMode`;
- memory per device (`core/plan_memory.py`): weights, gradients and optimiser state by dtype and strategy (DDP: a full
  copy per device; FSDP: 1/N of each), and activations measured as the bytes of the tensors autograd saves for the
  backward (`saved_tensors_hooks`) in that same meta step;
- the dataset's size on disk and the estimated wall time of the paper's schedule on a named accelerator (its peak dense
  bf16 rate times a stated MFU), with the number of devices needed to fit memory.

    python cli.py plan --config configs/paper/storm.yaml [--config configs/trainer/fsdp.yaml] [--accelerator H100] [--mfu 0.4]

A method's plan.py (PLAN_INTERFACE in the docs): `example_batch(datamodule, batch_size, device)`, `step_loss(module,
batch)` (None for methods without gradient training: the plan then counts one forward evaluation step), `DATASET` and
`PAPER` dicts, and optionally `memory(module, batch, strategy, devices, precision)` returning terms in bytes that replace
the measured ones (the MoE fine-tunes use the closed form of `core/moe/memory.py`).
"""
from __future__ import annotations

import importlib
import math
import sys
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from .errors import ConfigError
from .plan_memory import GiB, Strategy, activation_bytes, as_strategy, optimizer_state_bytes, parse_strategy
from .plan_memory import memory_per_device as _memory_terms


@dataclass(frozen=True)
class Accelerator:
    name: str
    bf16_tflops: float  # peak dense bf16 tensor-core rate (no sparsity)
    memory_gb: float  # per device, in 10^9 bytes as vendors state it

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


# Vendors' data sheets: H100 SXM5 989.4 TFLOP/s dense bf16 (1979 with sparsity), 80 GB HBM3; H200 SXM the same compute
# with 141 GB HBM3e; A100 SXM 312 TFLOP/s, 80 GB HBM2e.
ACCELERATORS = {
    "H100": Accelerator("H100", 989.0, 80.0),
    "H200": Accelerator("H200", 989.0, 141.0),
    "A100": Accelerator("A100", 312.0, 80.0),
}


def accelerator(name: str) -> Accelerator:
    try:
        return ACCELERATORS[name.upper()]
    except KeyError:
        raise ConfigError(f"unknown accelerator {name!r} for `plan`: choose one of {', '.join(ACCELERATORS)}") from None


# ---------------------------------------------------------------------------------------------------------------------
# building


def _plan_cli():
    from ..cli import LitIclrCLI

    class PlanCLI(LitIclrCLI):
        """Parses and links the config like `fit`, instantiates the model and the DataModule, but no Trainer (its
        devices/strategy describe the cluster, not this machine) and no run folder."""

        def before_instantiate_classes(self) -> None:
            self.config["trainer"]["logger"] = False
            self.config["trainer"]["callbacks"] = []

        def instantiate_classes(self) -> None:
            self.config_init = self.parser.instantiate_classes(self.config)
            self.datamodule = self._get(self.config_init, "data")
            self.model = self._get(self.config_init, "model")
            self.trainer = None

    return PlanCLI


def build(config_paths: list[str] | tuple[str, ...], device: str | torch.device = "meta",
          overrides: list[str] | tuple[str, ...] = ()) -> tuple[Any, Any, dict]:
    """(module, datamodule, trainer config) of the configs stacked in order, the model built on `device`
    (`configure_model` called there as the Trainer would). Nothing is read from disk but the configs."""
    args: list[str] = []
    for path in config_paths:
        args += ["--config", str(path)]
    args += list(overrides)
    import warnings

    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    with torch.device(device):
        cli = _plan_cli()(args=args, run=False)
        module, datamodule = cli.model, cli.datamodule
        if hasattr(module, "configure_model"):
            module.configure_model()
    trainer_cfg = _plain(cli.config["trainer"])
    return module, datamodule, trainer_cfg


def build_on_meta(config_paths: list[str], overrides: list[str] | tuple[str, ...] = ()) -> tuple[Any, Any, dict]:
    """`build` on the meta device: every parameter has its shape and dtype and no storage."""
    return build(config_paths, "meta", overrides)


def _plain(node: Any) -> Any:
    """A parsed config as plain dicts and lists. A jsonargparse `Namespace` is turned into a dict with `as_dict()`: its
    `items()` yields flattened keys (`strategy.class_path`), which would lose a `strategy: {class_path: ...}` node."""
    if hasattr(node, "as_dict"):
        node = node.as_dict()
    if hasattr(node, "items"):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain(v) for v in node]
    return node


def method_hooks(module) -> ModuleType:
    """The method's plan.py: `lit_iclr.<m>.plan` for a module defined in `lit_iclr.<m>` (or the module path a class
    names in its `plan_hooks` attribute)."""
    package = type(module).__module__.rsplit(".", 1)[0]
    name = getattr(type(module), "plan_hooks", None) or f"{package}.plan"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        path = name.replace(".", "/") + ".py"
        raise ConfigError(f"{type(module).__name__} has no plan: {path} is missing (it defines example_batch, step_loss, "
                          f"DATASET and PAPER, see `lit_iclr/core/plan.py`)") from None


# ---------------------------------------------------------------------------------------------------------------------
# counting


def count_params(module: torch.nn.Module) -> dict:
    """Parameters (shared ones once): total, trainable and per top-level child (`(own)` for the module's direct ones)."""
    seen: set[int] = set()
    per_group: dict[str, int] = {}
    total = trainable = 0
    for name, p in module.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = p.numel()
        total += n
        trainable += n if p.requires_grad else 0
        group = name.split(".", 1)[0] if "." in name else "(own)"
        per_group[group] = per_group.get(group, 0) + n
    return {"total": total, "trainable": trainable, "per_group": per_group}


def step_flops(module, batch, step_loss) -> int:
    """FLOPs of one step (forward + backward; forward only when `step_loss` returns None or a loss without graph) as
    `FlopCounterMode` counts them (matrix products, convolutions and attention; element-wise ops are not counted)."""
    return measure_step(module, batch, step_loss)[0]


def measure_step(module, batch, step_loss) -> tuple[int, dict[str, int], bool]:
    """(FLOPs, saved-activation bytes as `plan_memory.activation_bytes` counts them, whether the step has a gradient)
    of one step, from a single forward + backward."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        acts, loss = activation_bytes(module, batch, step_loss, keep_loss=True)
        gradient = loss is not None
        if loss is not None and loss.requires_grad:
            loss.backward()
    del loss
    module.zero_grad(set_to_none=True)
    return int(counter.get_total_flops()), acts, gradient


# ---------------------------------------------------------------------------------------------------------------------
# the plan


@dataclass
class Plan:
    name: str
    params: dict
    flops: int  # one step, per device, at the per-device batch
    batch_size: int
    strategy: Strategy
    precision: str
    memory: dict  # bytes per device
    dataset: dict
    paper: dict
    steps: int | None
    steps_source: str
    accelerator: Accelerator
    mfu: float
    devices_to_fit: int | None
    hours: float | None
    gradient: bool
    seconds: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    fsdp_devices_to_fit: int | None = None  # when the config's DDP / single device does not fit

    @property
    def fit_text(self) -> str:
        if self.devices_to_fit:
            return str(self.devices_to_fit)
        if self.strategy.kind != "fsdp":
            return f"no ({self.strategy.kind}); FSDP: {self.fsdp_devices_to_fit or '> 4096'}"
        return "> 4096"

    @property
    def gpu_hours(self) -> float | None:
        return self.hours * self.strategy.world if self.hours is not None else None

    @property
    def params_vs_paper(self) -> float | None:
        stated = self.paper.get("params")
        return self.params["total"] / stated - 1 if stated else None


def _steps(trainer_cfg: dict, paper: dict, dataset: dict, global_batch: int) -> tuple[int | None, str]:
    if paper.get("steps"):
        return int(paper["steps"]), "paper"
    max_steps = trainer_cfg.get("max_steps") or -1
    if max_steps > 0:
        return int(max_steps), "trainer.max_steps"
    epochs = trainer_cfg.get("max_epochs")
    samples = dataset.get("samples")
    if epochs and samples:
        return int(epochs * math.ceil(samples / global_batch)), f"{epochs} epochs x {samples:,} samples / {global_batch}"
    return None, "unknown (no max_steps, max_epochs x DATASET samples or PAPER steps)"


def devices_to_fit(module, batch, strategy: Strategy, precision: str, capacity: float, hooks=None,
                   max_devices: int = 4096) -> int | None:
    """The fewest devices whose per-device memory fits `capacity` bytes: under FSDP the shards shrink with the devices
    of a node (HSDP replicates across nodes), under DDP every device holds everything (1 or None)."""
    def total(n: int) -> float:
        s = Strategy(strategy.kind, n, 1)
        return _memory(module, batch, s, precision, hooks)["total"]

    if strategy.kind != "fsdp":
        return 1 if total(1) <= capacity else None
    n = 1
    while n <= max_devices:
        if total(n) <= capacity:
            return n
        n *= 2
    return None


_ACT_CACHE: dict[int, tuple] = {}


def _memory(module, batch, strategy, precision, hooks, acts: dict | None = None) -> dict:
    custom = getattr(hooks, "memory", None) if hooks is not None else None
    if custom is not None:
        terms = custom(module, batch, strategy, strategy.devices, precision)
        if terms is not None:
            terms = dict(terms)
            terms["total"] = sum(v for k, v in terms.items() if k != "total")
            return terms
    key = id(module)
    cached = _ACT_CACHE.get(key)
    if cached is None or cached[0] is not batch:
        acts = acts if acts is not None else activation_bytes(module, batch, hooks.step_loss)
        _ACT_CACHE.clear()
        _ACT_CACHE[key] = cached = (batch, acts, optimizer_state_bytes(module))
    _, acts, opt = cached
    return _memory_terms(module, batch, strategy, precision, activations=acts, optimizer=opt)


def memory_per_device(module, batch, strategy: Strategy | str = "ddp", devices: int = 1, precision: str = "32-true",
                      step_loss=None, nodes: int = 1, hooks: ModuleType | None = None) -> dict:
    """Bytes per device of each term of `core/plan_memory.py` (and `total`) for `strategy` (`ddp`, `fsdp`, `single`, or a
    `Strategy`) over `devices` devices per node; activations measured with `step_loss` (default: the method's)."""
    if step_loss is not None:
        hooks = _Hooks(hooks, step_loss)
    hooks = hooks or method_hooks(module)
    return _memory(module, batch, as_strategy(strategy, devices, nodes), precision, hooks)


class _Hooks:
    def __init__(self, base, step_loss):
        self._base, self.step_loss = base, step_loss

    def __getattr__(self, name):
        return getattr(self._base, name) if self._base is not None else None


def plan(config_paths: list[str], accelerator_name: str = "H100", mfu: float = 0.4, hooks: ModuleType | None = None,
         overrides: list[str] | tuple[str, ...] = (), batch_size: int | None = None) -> Plan:
    """The plan of the stacked configs (see the module docstring). `hooks` replaces the method's plan.py (tests)."""
    acc = accelerator(accelerator_name)
    seconds = {}
    t0 = time.perf_counter()
    module, datamodule, trainer_cfg = build_on_meta(config_paths, overrides)
    seconds["build"] = time.perf_counter() - t0
    hooks = hooks or method_hooks(module)
    b = int(batch_size or getattr(datamodule, "batch_size", 1) or 1)
    batch = hooks.example_batch(datamodule, b, "meta")
    strategy = parse_strategy(trainer_cfg)
    precision = str(trainer_cfg.get("precision") or "32-true")
    t0 = time.perf_counter()
    flops, acts, gradient = measure_step(module, batch, hooks.step_loss)
    seconds["step"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    memory = _memory(module, batch, strategy, precision, hooks, acts)
    fit = devices_to_fit(module, batch, strategy, precision, acc.memory_bytes, hooks)
    fsdp_fit = None
    if fit is None and strategy.kind != "fsdp":  # a full copy per device does not fit: how many would FSDP need
        fsdp_fit = devices_to_fit(module, batch, Strategy("fsdp", 1), precision, acc.memory_bytes, hooks)
    seconds["memory"] = time.perf_counter() - t0
    paper = dict(getattr(hooks, "PAPER", {}) or {})
    dataset = dict(getattr(hooks, "DATASET", {}) or {})
    accumulate = int(trainer_cfg.get("accumulate_grad_batches") or 1)
    global_batch = b * strategy.world * accumulate
    steps, steps_source = _steps(trainer_cfg, paper, dataset, global_batch)
    # one optimiser step processes `accumulate` micro-batches on each of the `world` devices
    step_total = flops * strategy.world * accumulate
    hours = steps * step_total / (strategy.world * acc.bf16_tflops * 1e12 * mfu) / 3600 if steps else None
    notes = []
    if memory["total"] > acc.memory_bytes:
        notes.append(f"does not fit one {acc.name} ({acc.memory_gb:.0f} GB) with {strategy.describe()}")
    name = " + ".join(str(p) for p in config_paths)
    return Plan(name, count_params(module), flops, b, strategy, precision, memory, dataset, paper, steps, steps_source,
                acc, mfu, fit, hours, gradient, seconds, notes, fsdp_fit)


# ---------------------------------------------------------------------------------------------------------------------
# rendering


def human(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}".strip()
    return f"{x:.3g} {unit}".strip()


def gib(x: float) -> str:
    return f"{x / GiB:.3g} GiB" if x >= GiB / 100 else f"{x / 2**20:.3g} MiB"


def format_plan(p: Plan) -> str:
    """The printed plan of one config: a markdown table."""
    prm = p.params
    paper_params = p.paper.get("params")
    vs = f" (paper: {human(paper_params)}, {p.params_vs_paper:+.1%}; {p.paper.get('params_source', '')})" \
        if paper_params else ""
    groups = ", ".join(f"{k} {human(v)}" for k, v in sorted(prm["per_group"].items(), key=lambda kv: -kv[1])[:8])
    step_kind = "forward + backward" if p.gradient else "forward only (no gradient training)"
    m = p.memory
    mem = ", ".join(f"{k} {gib(v)}" for k, v in m.items() if k != "total" and v)
    ds = p.dataset
    dataset = f"{ds.get('name', '-')}: {gib(ds['bytes']) if ds.get('bytes') else '-'}" + (
        f", {ds['samples']:,} samples" if ds.get("samples") else "")
    fit = p.fit_text
    hours = (f"{p.hours:.3g} h on {p.strategy.world} x {p.accelerator.name} ({p.gpu_hours:.3g} GPU-hours) at MFU "
             f"{p.mfu:.0%}" if p.hours is not None else "- (no schedule length)")
    if p.paper.get("gpu_hours"):
        hours += f"; paper: {p.paper['gpu_hours']:g} GPU-hours" + (f" on {p.paper['hardware']}" if p.paper.get(
            "hardware") else "")
    rows = [
        ("parameters", f"{human(prm['total'])} total, {human(prm['trainable'])} trainable{vs}"),
        ("per module", groups),
        (f"FLOPs / step / device (batch {p.batch_size})", f"{human(p.flops, 'FLOP')} ({step_kind})"),
        ("strategy", f"{p.strategy.describe()}, precision {p.precision}"),
        ("memory / device", f"{gib(m['total'])} ({mem})"),
        (f"devices to fit {p.accelerator.memory_gb:.0f} GB", fit),
        ("dataset on disk", dataset),
        ("schedule", f"{p.steps:,} optimiser steps ({p.steps_source})" if p.steps else p.steps_source),
        ("estimated wall time", hours),
    ]
    rows += [("note", n) for n in p.notes]
    body = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"plan: {p.name} on {p.accelerator.name} ({p.accelerator.bf16_tflops:.0f} TFLOP/s bf16, MFU {p.mfu:.0%})\n\n" \
           f"| | |\n|---|---|\n{body}"


def format_rows(plans: list[Plan]) -> str:
    """One line per config, for the platform card's table."""
    acc = plans[0].accelerator.name if plans else ""
    head = ("| config | params (plan) | params (paper) | FLOPs / step / device | batch / device | strategy, precision | "
            f"memory / device | devices to fit ({acc}) | optimiser steps | hours (devices) | GPU-hours | paper's compute |\n"
            "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    lines = [head]
    for p in plans:
        paper = human(p.paper.get("params")) + (f" ({p.params_vs_paper:+.1%})" if p.paper.get("params") else "")
        hours = f"{p.hours:.3g} ({p.strategy.world})" if p.hours is not None else "-"
        gpu_h = f"{p.gpu_hours:.3g}" if p.gpu_hours is not None else "-"
        stated = (f"{p.paper['gpu_hours']:g} GPU-h" if p.paper.get("gpu_hours") else "-") + (
            f" ({p.paper['hardware']})" if p.paper.get("hardware") else "")
        lines.append(f"| {p.name} | {human(p.params['total'])} | {paper} | {human(p.flops)} | {p.batch_size} | "
                     f"{p.strategy.describe()}, {p.precision} | {gib(p.memory['total'])} | {p.fit_text} | "
                     f"{p.steps if p.steps else '-'} | {hours} | {gpu_h} | {stated} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """`cli.py plan --config A.yaml [--config B.yaml] [--accelerator H100] [--mfu 0.4] [--batch-size N] [overrides]`."""
    import argparse

    ap = argparse.ArgumentParser(prog="cli.py plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", "-c", action="append", required=True, help="config files, stacked in order")
    ap.add_argument("--accelerator", default="H100", help=f"one of {', '.join(ACCELERATORS)}")
    ap.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation assumed for the wall time")
    ap.add_argument("--batch-size", type=int, default=None, help="per-device batch (default: the DataModule's)")
    ap.add_argument("--rows", action="store_true", help="print one table row per config instead of the full plan")
    args, overrides = ap.parse_known_args(argv)
    if not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu {args.mfu} must be in (0, 1]")
    if args.rows:  # one row per config; a config that cannot be planned is named with its error, the rest go on
        plans, failed = [], []
        for c in args.config:
            try:
                plans.append(plan([c], args.accelerator, args.mfu, batch_size=args.batch_size))
            except Exception as e:  # noqa: BLE001
                failed.append(f"| {c} | not planned: {type(e).__name__}: {str(e).splitlines()[0][:200]} |")
            print(f"planned {c}", file=sys.stderr, flush=True)
        print(format_rows(plans) + ("\n" + "\n".join(failed) if failed else ""))
        return
    print(format_plan(plan(args.config, args.accelerator, args.mfu, overrides=overrides, batch_size=args.batch_size)))
