"""Real DDP with 2 CPU processes (gloo): ranks agree, and training equals one process with the same global batch."""
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_iclr.cli import main
from tests.core.toy import ToyRegression

WORKER = Path(__file__).with_name("ddp_worker.py")


def run(out: Path, devices: int, batch: int) -> None:
    proc = subprocess.run([sys.executable, str(WORKER), "toy", str(out), str(devices), str(batch)], capture_output=True,
                          text=True, timeout=300, cwd=WORKER.parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_ddp_two_processes_match_one_process(tmp_path):
    run(tmp_path, 2, 4)  # 2 ranks x 4 samples
    run(tmp_path, 1, 8)  # 1 process x 8 samples: the same global batch
    r0, r1 = (torch.load(tmp_path / f"devices2_rank{r}.pt", weights_only=True) for r in (0, 1))
    single = torch.load(tmp_path / "devices1_rank0.pt", weights_only=True)
    assert r0["world"] == r1["world"] == 2 and r0["pid"] != r1["pid"]
    for k in r0["state"]:
        torch.testing.assert_close(r0["state"][k], r1["state"][k], rtol=0, atol=0)  # identical on both ranks
        torch.testing.assert_close(r0["state"][k], single["state"][k], rtol=1e-5, atol=1e-6)
    assert abs(r0["val_loss"] - single["val_loss"]) < 1e-5
    # the runs did train: parameters moved away from the seeded initialisation
    init = torch.load(tmp_path / "devices1_rank0.pt", weights_only=True)["state"]["net.2.bias"]
    assert init.abs().sum() > 0


def test_rank_skipping_a_collective_fails_within_the_timeout_naming_the_rank(tmp_path):
    """Rank 1 never reaches an all-reduce of rank 0 (it sleeps 120 s): with `timeout_s: 5` the run ends with one line
    naming rank 0 (waiting) and rank 1 (missing) a few seconds after rank 0 began to wait, and rank 1 is stopped."""
    proc = subprocess.run([sys.executable, str(WORKER), "skip", str(tmp_path)], capture_output=True, text=True,
                          timeout=240, cwd=WORKER.parents[2])
    ended = time.time()
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("lit-iclr: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]  # rank 1 was stopped, not left to fail on its own later
    assert "rank 0 of 2: a collective did not complete within 5 s: rank(s) 1 never reached it" in lines[0]
    waited = ended - float((tmp_path / "entered").read_text())
    assert 5 <= waited < 5 + 30, waited  # the timeout, the 3 s look for the other ranks, the process's exit


@pytest.mark.slow  # 2 processes and a 5 s timeout: 20-60 s; test_rank_skipping_a_collective... is the fast one
def test_ranks_in_different_collectives_end_in_one_line_within_the_timeout(tmp_path):
    """Model interactions' hang: rank 0 alone reads `trainer.log_dir` (a broadcast) while rank 1 goes on to the step's
    gradient all-reduce. Both wait in a collective the other never reaches; with `timeout_s: 5` the run ends in one
    line naming the ranks within seconds, whichever rank's timeout (or closed connection) comes first."""
    proc = subprocess.run([sys.executable, str(WORKER), "skip", str(tmp_path), "BroadcastOnRankZeroToy"],
                          capture_output=True, text=True, timeout=240, cwd=WORKER.parents[2])
    ended = time.time()
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("lit-iclr: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith("lit-iclr: error: rank 0 of 2: ") and "fix: make every rank run the same collectives" \
        in lines[0], lines[0]
    assert ("every rank reached a collective, but not the same one" in lines[0]
            or "rank(s) 1 timed out after 5 s in a collective that rank(s) 0 never reached" in lines[0]), lines[0]
    waited = ended - float((tmp_path / "entered").read_text())
    assert 5 <= waited < 5 + 40, waited


def test_one_process_method_is_refused_before_processes_start(tmp_path, capsys):
    """A method with `single_process_reason` on 2 devices: one line naming it, the reason and the fix, before
    anything is launched; on one device it trains."""
    args = ["fit", "--model", "tests.core.test_ddp.OneProcessToy", "--data", "ToyData", "--data.init_args.data_dir",
            str(tmp_path / "data"), "--trainer.accelerator", "cpu", "--trainer.max_steps", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as e:
        main([*args, "--config", "configs/trainer/ddp.yaml", "--trainer.devices", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("lit-iclr: error: OneProcessToy runs on one process only (a toy stream: each update needs "
                          "the previous one), but the trainer asks for 2 processes")
    assert "--trainer.devices 1 --trainer.num_nodes 1" in err
    assert not (tmp_path / "data").exists()  # refused before the data was made
    cli = main([*args, "--trainer.devices", "1"])
    assert cli.trainer.global_step == 1


def test_ddp_overlay_and_names_get_the_platform_timeout():
    from datetime import timedelta

    from lightning.pytorch import Trainer

    from lit_iclr.core.ddp import DDPStrategy

    for name, unused in (("ddp", False), ("ddp_find_unused_parameters_true", True)):
        t = Trainer(strategy=name, accelerator="cpu", devices=2, logger=False, enable_checkpointing=False)
        assert type(t.strategy) is DDPStrategy and t.strategy._timeout == timedelta(minutes=5)
        assert t.strategy._ddp_kwargs.get("find_unused_parameters", False) is unused
    assert DDPStrategy(timeout_s=7)._timeout == timedelta(seconds=7)


class OneProcessToy(ToyRegression):
    single_process_reason = "a toy stream: each update needs the previous one"


def test_figures_and_summary_only_on_rank_zero(tmp_path, capsys):
    """On a rank other than 0 `log_figure` writes no file and calls no logger, and the summary prints nothing."""
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    from lit_iclr.core.figures import log_figure
    from lit_iclr.core.summary import print_summary

    calls = []
    logger = SimpleNamespace(log_dir=str(tmp_path), log_image=lambda **kw: calls.append(kw))
    for rank in (1, 0):
        trainer = SimpleNamespace(global_step=3, loggers=[logger], is_global_zero=rank == 0,
                                  default_root_dir=str(tmp_path))
        log_figure(SimpleNamespace(_trainer=trainer), "val/curve", plt.figure())
        print_summary(trainer, None, "test") if rank else None
        written = sorted(p.name for p in (tmp_path / "figures").glob("*.png")) if (tmp_path / "figures").exists() else []
        assert written == ([] if rank else ["val_curve_step3.png"])
    assert capsys.readouterr().out == ""


def test_evaluation_split_counts_each_sample_once():
    """Validation/test loaders under 2 ranks: 5 samples split 3 + 2 (Lightning's default pads to 3 + 3, counting
    sample 0 twice); training loaders keep Lightning's sampler."""
    from types import SimpleNamespace

    from lightning.pytorch.trainer.connectors.data_connector import _DataConnector
    from lightning.pytorch.trainer.states import RunningStage
    from torch.utils.data import DataLoader

    from lit_iclr.core.ddp import use_unrepeated_eval_sampler

    shares = {}
    for rank in (0, 1):
        connector = object.__new__(_DataConnector)
        trainer = SimpleNamespace(_data_connector=connector, distributed_sampler_kwargs={"num_replicas": 2, "rank": rank},
                                  overfit_batches=0, state=SimpleNamespace(fn=None))
        connector.trainer = trainer
        connector._requires_distributed_sampler = lambda dl: True
        use_unrepeated_eval_sampler(trainer)
        loader = DataLoader(list(range(5)))
        shares[rank] = list(connector._resolve_sampler(loader, shuffle=False, mode=RunningStage.VALIDATING))
        train = list(connector._resolve_sampler(loader, shuffle=False, mode=RunningStage.TRAINING))
        assert len(train) == 3  # Lightning's padded DistributedSampler, unchanged for training
    assert sorted(shares[0] + shares[1]) == [0, 1, 2, 3, 4]


def test_evaluation_set_smaller_than_the_ranks_is_refused_in_one_line():
    """1 validation sample on 2 ranks: a clear error naming the fix, not Lightning's bare AssertionError on rank 1;
    a loader whose sampler already gives every rank every index (`EveryIndexOnEveryRank`) is kept as it is."""
    from types import SimpleNamespace

    from lightning.pytorch.trainer.connectors.data_connector import _DataConnector
    from lightning.pytorch.trainer.states import RunningStage
    from torch.utils.data import DataLoader

    from lit_iclr.core.ddp import use_unrepeated_eval_sampler
    from lit_iclr.core.errors import ConfigError
    from lit_iclr.core.loader import EveryIndexOnEveryRank

    connector = object.__new__(_DataConnector)
    trainer = SimpleNamespace(_data_connector=connector, distributed_sampler_kwargs={"num_replicas": 2, "rank": 1},
                              overfit_batches=0, state=SimpleNamespace(fn=None), datamodule=None,
                              _accelerator_connector=SimpleNamespace(use_distributed_sampler=True, is_distributed=True))
    connector.trainer = trainer
    use_unrepeated_eval_sampler(trainer)
    with pytest.raises(ConfigError, match=r"validation loader holds 1 sample\(s\) for 2 ranks.*EveryIndexOnEveryRank"):
        connector._resolve_sampler(DataLoader([0]), shuffle=False, mode=RunningStage.VALIDATING)
    whole = DataLoader([0], sampler=EveryIndexOnEveryRank(1))
    assert list(connector._resolve_sampler(whole, shuffle=False, mode=RunningStage.VALIDATING)) == [0]


def test_logged_mean_over_ranks_counts_an_odd_total_exactly(monkeypatch):
    """Lightning reduces a `sync_dist` epoch mean as mean(sum) / mean(count) over ranks; on gloo its mean of the int64
    count truncates: ranks with 144 and 143 samples gave 143, not 143.5 (AIRE-Prune's val/acc was hits / 286 of 287
    samples). With `exact_mean_reduction` the count is averaged in float64. Lightning's own gloo code path runs; only
    the other rank is faked (its all-reduce adds rank 1's value)."""
    from types import SimpleNamespace

    import lightning.fabric.utilities.distributed as fabric_dist
    import torch.distributed as dist

    from lit_iclr.core.ddp import DDPStrategy, exact_mean_reduction

    monkeypatch.setattr(fabric_dist, "_distributed_is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda group=None: None)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None, async_op=False: t.add_(torch.tensor(143)))
    trainer = SimpleNamespace(strategy=DDPStrategy())
    assert trainer.strategy.reduce(torch.tensor(144), reduce_op="mean").item() == 143  # Lightning's truncation
    exact_mean_reduction(trainer)
    exact_mean_reduction(trainer)  # idempotent: wrapped once
    count = trainer.strategy.reduce(torch.tensor(144), reduce_op="mean")
    assert count.dtype == torch.float64 and count.item() == 143.5
    assert trainer.strategy.reduce(torch.tensor(144.0), reduce_op="mean").item() == 143.5
    summed = trainer.strategy.reduce(torch.tensor(144), reduce_op="sum")  # other reductions keep their dtype
    assert summed.dtype == torch.int64 and summed.item() == 287
