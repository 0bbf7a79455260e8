"""Figures reach whichever logger runs: TensorBoard as an image event, CSV as a PNG in the run folder."""
import lightning as L
import matplotlib.pyplot as plt
import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger

from lit_iclr.core.figures import figure_to_array, log_figure
from lit_iclr.core.loggers import RunCSVLogger
from tests.core.toy import ToyRegression


def test_log_figure_to_csv_and_tensorboard(tmp_path):
    trainer = L.Trainer(logger=[RunCSVLogger(str(tmp_path)), TensorBoardLogger(str(tmp_path), name="", version="")],
                        enable_progress_bar=False, enable_checkpointing=False)
    module = ToyRegression(num_features=3)
    module.trainer = trainer
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.imshow(np.eye(4))
    rgb = figure_to_array(fig)
    assert rgb.shape == (200, 200, 3) and rgb.dtype == np.uint8 and rgb.std() > 0
    log_figure(module, "val/map", fig, step=7)
    assert (tmp_path / "figures" / "val_map_step7.png").stat().st_size > 500
    trainer.loggers[1].experiment.flush()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    assert "val/map" in events.Tags()["images"]
