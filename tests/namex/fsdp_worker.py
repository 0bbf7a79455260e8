"""Fine-tune the tiny random Hugging Face Qwen2-MoE with NAMEx merging through the CLI, on 1 CPU process or sharded with
FSDP2 (configs/trainer/fsdp.yaml) on 2 gloo processes, recording per rank: the loss curve (mean over ranks), the
parameters the rank holds, and the gathered final weights.

test_fsdp.py starts this file as 2 processes (LOCAL_RANK/WORLD_SIZE set, as torchrun does); each runs a 4-step fit
that checkpoints at step 2, then resumes that step-2 checkpoint in a second fit (same processes, same process group).
Usage: LOCAL_RANK=r WORLD_SIZE=2 ... python tests/namex/fsdp_worker.py OUT_DIR
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402


class LossCurve(Callback):
    """The training loss of every step, averaged over the ranks (= the loss of the global batch)."""

    def __init__(self):
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(trainer.strategy.reduce(loss.detach().clone(), reduce_op="mean")))


def run(out: Path, name: str, devices: int, batch: int, steps: int, ckpt: str | None) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from lit_iclr.cli import main
    from lit_iclr.core.moe.sharding import local_numel

    overlay = ["--config", str(ROOT / "configs/trainer/fsdp.yaml")] if devices > 1 else []
    cli = main(["fit", "--config", str(ROOT / "tests/configs/namex_hf.yaml"), *overlay,
                "--trainer.accelerator", "cpu", "--trainer.devices", str(devices), "--trainer.precision", "32-true",
                "--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps",
                "0", "--trainer.enable_progress_bar", "false", "--trainer.callbacks+=tests.namex.fsdp_worker.LossCurve",
                "--checkpoint.every_n_train_steps", "2", "--checkpoint.save_top_k", "-1",
                "--data.init_args.batch_size", str(batch), "--data.init_args.data_dir", str(out / "data"),
                "--trainer.default_root_dir", str(out / name), *(["--ckpt_path", ckpt] if ckpt else [])])
    trainer = cli.trainer
    curve = next(c for c in trainer.callbacks if type(c).__name__ == "LossCurve")
    local, total = local_numel(cli.model.net)
    full = get_model_state_dict(cli.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    rank = trainer.global_rank
    (out / f"{name}_rank{rank}.json").write_text(json.dumps({
        "losses": curve.losses, "local": local, "total": total, "world": trainer.world_size,
        "ckpt_dir": str(Path(trainer.checkpoint_callback.dirpath))}))
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in full.items()}, out / f"{name}_state.pt")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    run(out, "sharded", 2, 2, 4, None)
    run(out, "resumed", 2, 2, 4, str(out / "sharded" / "checkpoints" / "epoch=0-step=2.ckpt"))
