"""What varies between training steps and epochs of a fit: the flow-matching t and noise (seeded by the step,
`core.global_batch.step_rng`) and each item's paraphrase (a function of (seed, epoch, index), `data.item_rng`, with the
dataset's epoch set by the module each epoch). A draw frozen across steps, or an epoch never set, trains on one noise
sample or one paraphrase per item for the whole run."""
from __future__ import annotations

import torch

from lit_iclr.core.global_batch import step_rng
from lit_iclr.mosa.module import MoSA
from tests.twin import fit_twin


def test_each_step_draws_its_own_t_and_noise_and_each_epoch_sets_the_items_epoch(tmp_path, monkeypatch):
    steps: list[dict] = []
    draw, training_step = MoSA.draw, MoSA.training_step

    def recording_draw(self, fn, shape):
        out = draw(self, fn, shape)
        if self.training:
            steps[-1]["draws"].append(out.detach().clone())
        return out

    def recording_step(self, batch, batch_idx):
        ds = self.trainer.train_dataloader.dataset
        steps.append({"step": self.global_step, "epoch": self.current_epoch, "data_epoch": ds.epoch, "draws": [],
                      "text": batch["text_ids"].clone()})
        return training_step(self, batch, batch_idx)

    monkeypatch.setattr(MoSA, "draw", recording_draw)
    monkeypatch.setattr(MoSA, "training_step", recording_step)
    fit_twin("mosa", tmp_path, "--trainer.max_epochs", "2", "--trainer.limit_val_batches", "0")

    assert [s["step"] for s in steps] == list(range(6)) and [s["epoch"] for s in steps] == [0, 0, 0, 1, 1, 1]
    assert [s["data_epoch"] for s in steps] == [s["epoch"] for s in steps]  # the items' epoch follows the fit's
    for s in steps:
        assert len(s["draws"]) == 4  # video t, video noise, structure t, structure noise
        with step_rng(s["step"]):  # independent: the step's seeded stream, in the module's order
            t = torch.rand(s["draws"][0].shape)
        torch.testing.assert_close(s["draws"][0], t, rtol=0, atol=0)
    for a in range(len(steps)):
        for b in range(a):
            for da, db in zip(steps[a]["draws"], steps[b]["draws"], strict=True):
                assert not torch.equal(da, db), (steps[a]["step"], steps[b]["step"])


def test_an_items_paraphrase_changes_with_the_epoch(small_data):
    train = small_data.splits["train"]
    i = next(i for i, c in enumerate(train.clips) if len(c["text_ids"]) > 1)
    chosen = set()
    for epoch in range(20):
        train.epoch = epoch
        ids = train[i]["text_ids"]
        chosen.add(next(k for k, row in enumerate(train.clips[i]["text_ids"]) if torch.equal(torch.as_tensor(row), ids)))
        torch.manual_seed(epoch)  # the process's RNG plays no part
        assert torch.equal(train[i]["text_ids"], ids)
    train.epoch = 0
    assert len(chosen) == len(train.clips[i]["text_ids"])  # every paraphrase of the item is trained on
