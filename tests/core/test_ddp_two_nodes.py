"""Two "nodes" x 1 process on this machine over loopback, as SLURM or torchrun would start them (each process started
by the launcher with MASTER_ADDR, MASTER_PORT, NODE_RANK, LOCAL_RANK=0 and WORLD_SIZE=2; `num_nodes: 2, devices: 1`):
one optimiser step of the STORM twin equals the 1-node x 2-process run, parameters and validation metrics."""
import socket

import pytest
import torch

from tests.core.ddp_worker import ROOT, compare, first_step, run_worker, twin_batch_args

CONFIG = ROOT / "tests" / "configs" / "storm.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(out):
    """Start node 0 and node 1 (one process each, the environment a cluster launcher sets), wait for both."""
    import subprocess
    import sys

    batch, _ = twin_batch_args(CONFIG, 2)
    port = str(_free_port())
    procs = []
    for node in (0, 1):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NODE_RANK": str(node), "LOCAL_RANK": "0",
               "WORLD_SIZE": "2", "TWIN_NUM_NODES": "2"}
        argv = [sys.executable, str(ROOT / "tests" / "core" / "ddp_worker.py"), "twin", str(out), str(CONFIG), "1",
                *batch, "--trainer.strategy", "ddp"]
        procs.append(subprocess.Popen(argv, cwd=ROOT, env={**__import__("os").environ, **env}, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=540) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [torch.load(out / f"devices1_rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.mark.slow
def test_two_nodes_equal_one_node_two_processes(tmp_path):
    # the data once, by a one-process run (the nodes share this folder as a cluster's shared file system)
    # (each node's local rank 0 would otherwise generate it into the same folder)
    assert run_worker("twin", str(tmp_path / "prep"), str(CONFIG), "1", "--data.init_args.data_dir",
                      str(tmp_path / "nodes" / "data")).returncode == 0
    nodes = two_nodes(tmp_path / "nodes")
    assert [r["world"] for r in nodes] == [2, 2]
    one_node = first_step(CONFIG, tmp_path / "one_node")
    assert one_node["status"] == "ok", one_node["reason"]
    # 2 nodes x 1 process against 1 node x 2 processes: the same ranks, the same data, the same step
    assert not compare({"single": one_node["ranks"][0], "ranks": nodes}, rtol=1e-5, atol=1e-5)  # measured: at most 3e-7 apart
    assert not compare(one_node)
