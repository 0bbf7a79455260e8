"""`core/timing.py`: every side runs once per round, in an order that rotates, and its own block is what is timed;
the pinned worker process of the speed comparisons."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from lit_iclr.core.timing import PinnedWorker, interleaved_cpu_times


def test_sides_rotate_and_each_block_is_timed_on_its_own():
    order = []

    def busy(seconds: float):
        def block():
            order.append(seconds)
            t = time.process_time()
            while time.process_time() - t < seconds:
                pass
        return block

    times = interleaved_cpu_times({"short": busy(0.01), "long": busy(0.05)}, rounds=4)
    assert order == [0.01, 0.05, 0.05, 0.01, 0.01, 0.05, 0.05, 0.01]  # the order flips every round
    assert len(times["short"]) == len(times["long"]) == 4
    assert all(0.008 <= t < 0.04 for t in times["short"])
    assert all(0.045 <= t < 0.2 for t in times["long"])


def test_pinned_worker_answers_each_request_on_its_core(tmp_path):
    """`PinnedWorker`: one JSON line in, one out, in order; the child runs on the one core it was given; a child that
    dies is reported with its exit code instead of hanging the comparison."""
    echo = tmp_path / "echo.py"
    echo.write_text("import json, os, sys\n"
                    "for line in sys.stdin:\n"
                    "    req = json.loads(line)\n"
                    "    if req.get('die'):\n"
                    "        sys.exit(3)\n"
                    "    print(json.dumps({'twice': 2 * req['x'], 'cores': sorted(os.sched_getaffinity(0))}), flush=True)\n")
    core = sorted(os.sched_getaffinity(0))[-1]
    w = PinnedWorker([sys.executable, str(echo)], dict(os.environ), tmp_path, core)
    assert [w.ask({"x": x})["twice"] for x in (1, 5, -2)] == [2, 10, -4]
    assert w.ask({"x": 0})["cores"] == [core]
    w.close()
    assert w.proc.returncode == 0
    dying = PinnedWorker([sys.executable, str(echo)], dict(os.environ), tmp_path)
    with pytest.raises(RuntimeError, match="exited with 3"):
        dying.ask({"die": True})


def test_fit_block_server_times_the_asked_steps_in_whole_batches_and_ends_the_fit_with_stdin(tmp_path, monkeypatch):
    import io

    from lightning.pytorch import Trainer

    from lit_iclr.core.timing import fit_block_server
    from tests.core.toy import ToyData, ToyRegression

    monkeypatch.setattr(sys, "stdin", io.StringIO('{"n": 2}\n{"n": 3}\n'))  # then stdin closes
    proto = io.StringIO()
    dm = ToyData(data_dir=str(tmp_path), batch_size=8, num_samples=64)
    model = ToyRegression(num_features=dm.num_features)
    trainer = Trainer(max_steps=100, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      default_root_dir=tmp_path, limit_val_batches=0,
                      callbacks=[fit_block_server(proto, key="n", per_batch=2)])
    trainer.fit(model, datamodule=dm)
    blocks = [json.loads(line) for line in proto.getvalue().splitlines()]
    # 2 steps ask one 2-step batch, 3 steps round up to two; the fit stops when the requests end
    assert [b["steps"] for b in blocks] == [2, 4] and trainer.global_step == 3
    assert blocks[0]["first_step"] == blocks[0]["wall"] > 0 and blocks[1]["first_step"] == 0.0
    assert all(b["cpu"] > 0 for b in blocks)
