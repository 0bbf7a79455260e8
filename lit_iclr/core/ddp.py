"""Data-parallel runs of the platform: which methods run on one process, the process-group timeout, evaluation that
counts each sample once.

- **One-process methods.** A LightningModule whose algorithm cannot be split across ranks (a bandit's stream of rounds,
  a cascade policy that updates after every query) sets the class attribute (or property)
  ``single_process_reason = "a bandit stream: each round's update depends on the previous round"``. When the Trainer
  would start more than one process, ``check_process_count`` refuses in one line naming the method, the reason and the
  fix, before any process is launched or any process group started; with one process it simply runs.
- **Timeout.** ``DDPStrategy`` is Lightning's with a process-group timeout of ``timeout_s`` (5 minutes unless set),
  and the registered names (``ddp``, ``ddp_spawn``, ``ddp_find_unused_parameters_true`` ...) build it, so
  ``--trainer.strategy ddp`` has the same timeout. A collective that one rank never reaches then fails within the
  timeout instead of hanging for Lightning's 30 minutes; on gloo (CPU) ``collective_timeout`` turns the error into one
  line naming this rank and the ranks that never arrived. NCCL's watchdog already names the rank in its own message.
- **Evaluation samples once.** Lightning's ``DistributedSampler`` pads the validation/test set with repeated samples
  so every rank has as many; the padded samples would be counted twice in every metric. ``use_unrepeated_eval_sampler``
  makes validation and test loaders split the data without padding (ranks may then hold one batch less); epoch metrics
  logged with ``self.log(..., sync_dist=True)`` are sums and counts reduced over ranks (Lightning's mean is
  ``sum(value * batch) / sum(batch)`` over all ranks), and torchmetrics states are reduced by torchmetrics, so each
  sample is counted once. A method that logs per-step values with ``sync_dist`` in evaluation, or gathers itself,
  must not assume equal batch counts per rank. Lightning's mean over ranks of the integer sample count truncates on
  gloo (``copy_(count / world)`` into an int64: 144 + 143 samples became 2 x 143 = 286); ``exact_mean_reduction``
  averages integer tensors in float64, so the count is 287.
"""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from lightning.pytorch.strategies import DDPStrategy as _LightningDDP
from lightning.pytorch.strategies import StrategyRegistry

from .errors import ConfigError, LitIclrError

DEFAULT_TIMEOUT_S = 300.0  # 5 minutes: one step of any twin or paper config on one device is far shorter
REPORT_DELAY_S = 10.0  # a rank other than 0 waits this long before reporting a timeout rank 0 reports as well
DEFAULT_RENDEZVOUS_TIMEOUT_S = 1800.0  # torch's default for starting the group: nodes of a job start minutes apart


class CollectiveTimeoutError(LitIclrError, RuntimeError):
    """A collective (all-reduce, broadcast, barrier) that another rank never reached within the process-group timeout."""


def single_process_reason(model: Any) -> str | None:
    """Why `model` runs on one process only (its `single_process_reason`), or None for a data-parallel method."""
    reason = getattr(model, "single_process_reason", None)
    return str(reason) if reason else None


def world_size(trainer: Any) -> int:
    """Processes the trainer runs on (nodes x devices), known before any is launched."""
    return int(getattr(trainer.strategy, "world_size", 1) or 1)


def check_process_count(trainer: Any, model: Any) -> None:
    """Refuse, before processes are launched, to run a one-process method on several processes (`ConfigError`)."""
    reason = single_process_reason(model)
    world = world_size(trainer)
    if reason is None or world <= 1:
        return
    name = type(model).__name__
    raise ConfigError(
        f"{name} runs on one process only ({reason}), but the trainer asks for {world} processes "
        f"({trainer.num_nodes} node(s) x {trainer.num_devices} device(s)); fix: run it without configs/trainer/ddp.yaml, "
        "with `--trainer.devices 1 --trainer.num_nodes 1` (and one SLURM task)")


class DDPStrategy(_LightningDDP):
    """Lightning's DDP strategy with a process-group timeout of `timeout_s` seconds (5 minutes by default).

    Args:
        timeout_s: Seconds a collective may wait for the other ranks before it fails (Lightning's default: 1800).
        timeout: The same as a `timedelta` (wins over `timeout_s` when given).
        rendezvous_timeout_s: Seconds the processes may take to find each other when the group starts (a slow
            node start is not a hang).
        **kwargs: Lightning's `DDPStrategy` arguments (`find_unused_parameters`, `process_group_backend`, ...).
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, timeout: timedelta | None = None,
                 rendezvous_timeout_s: float = DEFAULT_RENDEZVOUS_TIMEOUT_S, **kwargs: Any):
        super().__init__(timeout=timeout if timeout is not None else timedelta(seconds=float(timeout_s)), **kwargs)
        self.rendezvous_timeout = timedelta(seconds=float(rendezvous_timeout_s))

    def setup_distributed(self) -> None:
        """Rendezvous under `rendezvous_timeout_s` (processes and nodes start at different times), then every
        collective under `timeout_s`."""
        import torch.distributed as dist

        timeout, self._timeout = self._timeout, max(self._timeout or self.rendezvous_timeout, self.rendezvous_timeout)
        try:
            super().setup_distributed()
        finally:
            self._timeout = timeout
        if timeout is not None and dist.is_initialized():
            dist.set_timeout(timeout)

    @property
    def timeout_s(self) -> float:
        return self._timeout.total_seconds() if self._timeout is not None else float("inf")


def _register_names() -> None:
    """Point Lightning's registered DDP names (`ddp`, `ddp_spawn`, `ddp_find_unused_parameters_true` ...) at
    `DDPStrategy`, with their own init arguments, so a strategy given by name has the platform's timeout."""
    for name, entry in list(StrategyRegistry.items()):
        if entry["strategy"] is _LightningDDP:
            StrategyRegistry.register(name, DDPStrategy, description=entry.get("description"), override=True,
                                      **entry["init_params"])


_register_names()


# gloo: "Timed out waiting 5000ms for recv operation", "Connection closed by peer", "Application timeout caused pair
# closure"; c10d: "DistBackendError", "wait timeout"; NCCL: "Watchdog caught collective operation timeout"
_TIMEOUT = re.compile(r"timed out|timeout|connection closed by peer|connection reset by peer", re.IGNORECASE)


def _is_collective_timeout(error: BaseException) -> bool:
    name = type(error).__name__
    return isinstance(error, RuntimeError) and (name == "DistBackendError" or "gloo" in str(error).lower()
                                                or "c10d" in str(error).lower()) and bool(_TIMEOUT.search(str(error)))


def _missing_ranks(rank: int, world: int, grace_s: float = 3.0) -> list[int] | None:
    """Ranks that did not also time out: each rank that timed out marks itself in the process group's store and waits
    `grace_s` for the others' marks; the ranks without one never reached the collective. None when the store is gone."""
    try:
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store()
        store.set(f"lit_iclr/timed_out/{rank}", "1")
        deadline = time.monotonic() + grace_s
        while True:
            marked = [r for r in range(world) if store.check([f"lit_iclr/timed_out/{r}"])]
            if len(marked) == world or time.monotonic() > deadline:
                return [r for r in range(world) if r not in marked]
            time.sleep(0.1)
    except Exception:  # noqa: BLE001 - the store died with the group: say nothing about the others
        return None


def _ranks_that_timed_out(rank: int, world: int, wait_s: float = 3.0) -> list[int] | None:
    """Other ranks that marked a collective timeout in the store (`_missing_ranks`), waiting up to `wait_s` for the
    first mark: a peer that closed its connection mid-collective because it timed out marks itself just before or
    after. None when the store is gone."""
    try:
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store()
        deadline = time.monotonic() + wait_s
        while True:
            marked = [r for r in range(world) if r != rank and store.check([f"lit_iclr/timed_out/{r}"])]
            if marked or time.monotonic() > deadline:
                return marked
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - the store died with the group
        return None


def collective_timeout(trainer: Any, error: BaseException) -> CollectiveTimeoutError | None:
    """A one-line `CollectiveTimeoutError` naming this rank (and the ranks that never arrived) when `error` is a
    process-group timeout, or a peer lost during a collective, of a multi-process run; else None."""
    world = world_size(trainer)
    if world <= 1 or not _is_collective_timeout(error):
        return None
    rank = int(getattr(trainer, "global_rank", 0))
    timeout = getattr(trainer.strategy, "_timeout", None)
    limit = f"{timeout.total_seconds():g} s" if timeout is not None else "the process-group timeout"
    first = str(error).strip().splitlines()[0][:160]
    if re.search(r"closed by peer|reset by peer", str(error), re.IGNORECASE):
        # a peer that timed out closes its connections: it waited in a collective that the ranks without a timeout
        # mark (this one included) never reached, e.g. this rank was in another collective (a broadcast read on one
        # rank only) or stopped
        timed_out = _ranks_that_timed_out(rank, world)
        if timed_out:
            never = [r for r in range(world) if r not in timed_out]
            what = (f"rank(s) {', '.join(map(str, timed_out))} timed out after {limit} in a collective that rank(s) "
                    f"{', '.join(map(str, never))} never reached (they were in another collective or stopped)")
        else:
            what = ("a collective failed: another rank stopped during it (it crashed, timed out or was killed; see "
                    "its error)")
    else:
        missing = _missing_ranks(rank, world)
        who = (f"rank(s) {', '.join(map(str, missing))} never reached it" if missing else
               "every rank reached a collective, but not the same one (ranks took different code paths)"
               if missing == [] else "another rank never reached it")
        what = f"a collective did not complete within {limit}: {who}"
    if rank != 0 and 0 in (_ranks_that_timed_out(rank, world, wait_s=0.0) or []):
        # rank 0 timed out too and reports the same collective (and, under Lightning's launcher, stops this rank): a
        # moment's wait leaves its one line alone on the console; under torchrun/SLURM this rank's line follows
        time.sleep(REPORT_DELAY_S)
    return CollectiveTimeoutError(
        f"rank {rank} of {world}: {what} ({first}); fix: make every rank run the same collectives (same number of "
        "batches and steps, no rank-dependent `self.log(sync_dist=True)` or early return), or raise `timeout_s` of the "
        "strategy (configs/trainer/ddp.yaml) if one step takes that long")


def _stop_launched_ranks(trainer: Any) -> None:
    """Kill the ranks this process launched (Lightning's `popen` launcher leaves them running after an error other than
    Ctrl-C, so a rank stuck outside any collective would never end). SLURM and torchrun stop the others themselves."""
    import signal

    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    launcher = getattr(trainer.strategy, "launcher", None)
    if isinstance(launcher, _SubprocessScriptLauncher) and getattr(trainer, "global_rank", 0) == 0:
        launcher.kill(signal.SIGKILL)


@contextmanager
def data_parallel_guard(trainer: Any, model: Any):
    """Around `Trainer.fit/validate/test/predict`: refuse one-process methods on several processes before launching,
    and report a process-group timeout as one line naming the rank."""
    if model is not None:
        check_process_count(trainer, model)
    try:
        yield
    except Exception as e:
        error = collective_timeout(trainer, e)
        if error is None:
            raise
        _stop_launched_ranks(trainer)
        raise error from e


def _check_every_rank_has_a_sample(trainer: Any, dataloader: Any, mode: Any, world: int) -> None:
    """Refuse (`ConfigError`) an evaluation set with fewer samples than ranks: split without padding, a rank would
    hold no batch (Lightning stops it with a bare `AssertionError` while the others wait in a collective)."""
    try:
        n = len(dataloader.sampler)
    except TypeError:  # an iterable without a length: Lightning does not split it
        return
    if 0 < n < world:
        owner = type(getattr(trainer, "datamodule", None) or dataloader.dataset).__name__
        stage = "test" if getattr(mode, "value", mode) == "test" else "validation"
        raise ConfigError(
            f"{owner}: the {stage} loader holds {n} sample(s) for {world} ranks, so a rank would evaluate nothing; "
            "fix: give the loader `sampler=lit_iclr.core.loader.EveryIndexOnEveryRank(n)` (every rank runs the whole, "
            "small evaluation), or evaluate on fewer processes")


def _is_mean(reduce_op: Any) -> bool:
    from torch.distributed import ReduceOp

    if isinstance(reduce_op, str):
        return reduce_op.lower() in ("mean", "avg")
    return reduce_op == ReduceOp.AVG


def exact_mean_reduction(trainer: Any) -> None:
    """`trainer.strategy.reduce` (what `self.log(..., sync_dist=True)` calls) averages an integer tensor in float64.

    Lightning reduces a logged epoch mean as mean(sum of value x batch) / mean(sample count) over ranks, and on gloo
    its mean of the int64 count is `count.copy_(count_sum / world)`, truncated: with the unpadded evaluation split the
    ranks' counts may differ by one, and an odd total lost half a sample (val/acc of AIRE-Prune's 287 digits was
    hits / 286). Idempotent; any strategy (DDP, ModelParallel), a no-op reduction on one process."""
    import torch

    strategy = getattr(trainer, "strategy", None)
    reduce = getattr(strategy, "reduce", None)
    if reduce is None or getattr(reduce, "exact_mean", False):
        return

    def exact_reduce(tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if isinstance(tensor, torch.Tensor) and not tensor.is_floating_point() and _is_mean(reduce_op):
            tensor = tensor.to(torch.float64)
        return reduce(tensor, group=group, reduce_op=reduce_op)

    exact_reduce.exact_mean = True
    strategy.reduce = exact_reduce


def use_unrepeated_eval_sampler(trainer: Any) -> None:
    """Validation and test loaders of `trainer` split their data across ranks without padding (each sample once)."""
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSamplerWrapper
    from lightning.pytorch.trainer.connectors.data_connector import _DataConnector
    from lightning.pytorch.trainer.states import RunningStage

    connector = trainer._data_connector
    if type(connector) is not _DataConnector:
        return
    resolve = connector._resolve_sampler

    def _resolve_sampler(dataloader, shuffle: bool, mode: RunningStage | None = None):
        evaluating = mode in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)
        if evaluating and connector._requires_distributed_sampler(dataloader):
            kwargs = dict(trainer.distributed_sampler_kwargs or {})
            kwargs["shuffle"] = False
            _check_every_rank_has_a_sample(trainer, dataloader, mode, int(kwargs.get("num_replicas", 1)))
            return UnrepeatedDistributedSamplerWrapper(dataloader.sampler, **kwargs)
        return resolve(dataloader, shuffle, mode=mode)

    connector._resolve_sampler = _resolve_sampler
