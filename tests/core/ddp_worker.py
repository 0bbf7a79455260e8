"""Run by test_ddp.py as its own process: fit the toy model with real DDP (gloo) and save each rank's result.

Usage: python tests/core/ddp_worker.py OUT_DIR DEVICES BATCH_SIZE
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import tests.core.toy  # noqa: E402,F401
from lit_iclr.cli import main  # noqa: E402

out, devices, batch = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
strategy = ["--trainer.strategy", "ddp"] if int(devices) > 1 else []
cli = main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(out / "data"),
            "--data.init_args.batch_size", batch, "--trainer.accelerator", "cpu", "--trainer.devices", devices,
            *strategy, "--trainer.max_steps", "6", "--trainer.max_epochs", "10", "--trainer.num_sanity_val_steps", "0",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(out / f"run{devices}")])
cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)  # val/loss averaged over ranks
rank = cli.trainer.global_rank
torch.save({"state": cli.model.state_dict(), "val_loss": float(cli.trainer.callback_metrics["val/loss"]),
            "world": cli.trainer.world_size, "pid": os.getpid()}, out / f"devices{devices}_rank{rank}.pt")
