"""Run by test_ddp.py as its own process: fit the toy model with real DDP (gloo) and save each rank's result.

Usage: python tests/core/ddp_worker.py OUT_DIR DEVICES BATCH_SIZE [skip]
`skip`: rank 1 never reaches the all-reduce rank 0 makes in the first training step (it sleeps instead), under a
process-group timeout of 5 s.
"""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from lit_iclr.cli import main  # noqa: E402
from tests.core.toy import ToyRegression  # noqa: E402


class SkippingToy(ToyRegression):
    """Rank 1 skips a collective that rank 0 runs (a rank-dependent code path)."""

    def training_step(self, batch, batch_idx):
        if self.global_rank == 0:
            (out / "entered").write_text(str(time.time()))  # when rank 0 starts waiting
            dist.all_reduce(torch.ones(1))
        else:
            time.sleep(120)
        return super().training_step(batch, batch_idx)


out, devices, batch = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
skip = sys.argv[4:] == ["skip"]
model = "tests.core.ddp_worker.SkippingToy" if skip else "ToyRegression"
if skip:
    sys.modules.setdefault("tests.core.ddp_worker", sys.modules["__main__"])
strategy = ["--trainer.strategy", "ddp"] if int(devices) > 1 else []
if skip:
    strategy = ["--trainer.strategy.init_args.timeout_s", "5"]
overlay = ["--config", "configs/trainer/ddp.yaml"] if skip else []  # before --trainer.devices, which it sets
cli = main(["fit", *overlay, "--model", model, "--data", "ToyData", "--data.init_args.data_dir", str(out / "data"),
            "--data.init_args.batch_size", batch, "--trainer.accelerator", "cpu", "--trainer.devices", devices,
            *strategy, "--trainer.max_steps", "6", "--trainer.max_epochs", "10", "--trainer.num_sanity_val_steps", "0",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(out / f"run{devices}")])
cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)  # val/loss averaged over ranks
rank = cli.trainer.global_rank
torch.save({"state": cli.model.state_dict(), "val_loss": float(cli.trainer.callback_metrics["val/loss"]),
            "world": cli.trainer.world_size, "pid": os.getpid()}, out / f"devices{devices}_rank{rank}.pt")
