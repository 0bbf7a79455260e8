"""FSDP2 on 2 CPU processes (gloo) through the CLI: a NAMEx fine-tune of a tiny random Qwen2-MoE is sharded, matches one
process, checkpoints as a distributed checkpoint, resumes exactly and exports one consolidated safetensors file."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from lit_iclr.core.dist_ckpt import is_distributed_checkpoint, read_distributed_checkpoint
from lit_iclr.core.hub import export

from .fsdp_worker import run

WORKER = Path(__file__).with_name("fsdp_worker.py")
ROOT = WORKER.parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sharded_fit_matches_one_process_resumes_exactly_and_exports(tmp_path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", NODE_RANK="0",
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=dict(env, LOCAL_RANK=str(r), RANK=str(r)))
             for r in range(2)]
    run(tmp_path, "single", 1, 4, 4, None)  # meanwhile, in this process: 1 process with the same global batch
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-3000:]
    single = json.loads((tmp_path / "single_rank0.json").read_text())
    ranks = [json.loads((tmp_path / f"sharded_rank{r}.json").read_text()) for r in range(2)]
    resumed = json.loads((tmp_path / "resumed_rank0.json").read_text())
    # the loss curve of the sharded run is the one-process curve (same global batches, gradients averaged)
    assert len(ranks[0]["losses"]) == 4 and ranks[0]["world"] == 2
    torch.testing.assert_close(torch.tensor(ranks[0]["losses"]), torch.tensor(single["losses"]), rtol=1e-5, atol=1e-5)
    assert single["losses"][-1] != single["losses"][0]  # it trained
    # each rank holds about half of the parameters (FSDP2 shards dim 0 of every tensor)
    total = ranks[0]["total"]
    assert sum(r["local"] for r in ranks) == total
    assert all(abs(r["local"] / total - 0.5) < 0.02 for r in ranks)
    # the step-2 checkpoint is a distributed checkpoint (one shard per rank), and resuming it continues the same curve
    ckpt = tmp_path / "sharded" / "checkpoints" / "epoch=0-step=2.ckpt"
    assert is_distributed_checkpoint(ckpt) and {p.name for p in ckpt.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}
    torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(ranks[0]["losses"][2:]), rtol=0, atol=1e-6)
    # final weights: sharded == resumed == one process; the consolidated export holds exactly the gathered weights
    state = torch.load(tmp_path / "sharded_state.pt", weights_only=True)
    for name in ("resumed", "single"):
        other = torch.load(tmp_path / f"{name}_state.pt", weights_only=True)
        for k in state:
            torch.testing.assert_close(other[k], state[k], rtol=1e-4, atol=1e-6, msg=k)
    last = tmp_path / "sharded" / "checkpoints" / "epoch=0-step=4.ckpt"
    assert read_distributed_checkpoint(last)["global_step"] == 4
    folder = export(last, tmp_path / "hub")
    from safetensors.torch import load_file

    exported = load_file(str(folder / "model.safetensors"))
    assert sorted(folder.glob("*.safetensors")) == [folder / "model.safetensors"]
    assert exported.keys() == state.keys()
    for k in state:
        torch.testing.assert_close(exported[k], state[k], rtol=0, atol=0, msg=k)
