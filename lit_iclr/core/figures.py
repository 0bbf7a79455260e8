"""Log matplotlib figures as images to whichever logger is active (TensorBoard, W&B, CSV run folder)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: clusters and CI have no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def figure_to_array(fig) -> np.ndarray:
    """RGB uint8 array (H, W, 3) of a drawn figure."""
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def log_figure(module, tag: str, fig, step: int | None = None, close: bool = True) -> None:
    """Send `fig` to every logger of `module.trainer` (on global rank 0 only); loggers without image support get a
    PNG in their folder."""
    trainer = getattr(module, "_trainer", None)
    step = int(step if step is not None else (trainer.global_step if trainer is not None else 0))
    # rank 0 only under DDP: the other ranks hold their share of the data, and would write the same files
    loggers = trainer.loggers if trainer is not None and trainer.is_global_zero else []
    for logger in loggers:
        name = type(logger).__name__
        if name == "TensorBoardLogger":
            logger.experiment.add_figure(tag, fig, global_step=step, close=False)
        elif name == "WandbLogger":
            logger.log_image(key=tag, images=[figure_to_array(fig)], step=step)
        elif logger.log_dir is not None:
            out = Path(logger.log_dir) / "figures" / f"{tag.replace('/', '_')}_step{step}.png"
            out.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(out, dpi=100)
    if close:
        plt.close(fig)
