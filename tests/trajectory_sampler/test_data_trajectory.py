"""Readers on real-format files (good and malformed), the generated defaults read back, and checkpoint folders."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_iclr.core.errors import CheckpointError, DatasetFormatError, DatasetNotFoundError
from lit_iclr.trajectory_sampler import BooleanLandscapeData, LandscapePredictor, PointLandscapeData, SequenceAffinityData
from lit_iclr.trajectory_sampler.formats import read_bit_table, read_fasta, read_point_table, read_scores
from lit_iclr.trajectory_sampler.trajectory import as_score, load_trajectory, select


def test_generated_defaults_are_read_back_by_the_real_readers(tmp_path):
    dm = BooleanLandscapeData(data_dir=str(tmp_path), n_bits=10, needle_size=4, num_samples=200)
    dm.prepare_data()
    dm.setup("fit")
    assert (dm.path / "scores.csv").read_text().startswith("x,y\n")
    f = dm.landscape()
    assert torch.allclose(f(dm.x), dm.y, atol=1e-4)  # the scores are the landscape's values
    assert 0.1 < float(f.in_needle(dm.x).float().mean()) < 0.35  # oversampled needle positives (20 %)

    dm = SequenceAffinityData(data_dir=str(tmp_path), length=12, num_samples=100, pairs=3)
    dm.prepare_data()
    dm.setup("fit")
    assert (dm.path / "sequences.fasta").read_text().startswith(">seq000000\n")
    assert dm.x.shape == (100, 12, 4) and torch.allclose(dm.landscape()(dm.x), dm.y, atol=1e-4)

    dm = PointLandscapeData(data_dir=str(tmp_path), num_samples=100)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.x.shape == (100, 2) and torch.allclose(dm.landscape()(dm.x), dm.y, atol=1e-4)
    batch = next(iter(dm.predict_dataloader()))
    assert batch["x0"].shape == (dm.batch_size, 2)


@pytest.mark.parametrize("text, problem", [
    ("bits,score\n0101,1\n", "header"),
    ("x,y\n0102,1\n", "not a string of 0/1"),
    ("x,y\n0101,1\n011,2\n", "3 bits"),
    ("x,y\n0101,nan\n", "NaN"),
    ("x,y\n0101,abc\n", "not a number"),
    ("x,y\n", "no rows"),
])
def test_bit_table_errors_name_the_problem(tmp_path, text, problem):
    p = tmp_path / "scores.csv"
    p.write_text(text)
    with pytest.raises(DatasetFormatError, match=problem):
        read_bit_table(p)


def test_point_table_and_fasta_errors(tmp_path):
    p = tmp_path / "scores.csv"
    p.write_text("x1,x2,y\n0.5,1.0\n")
    with pytest.raises(DatasetFormatError, match="line 2"):
        read_point_table(p)
    with pytest.raises(DatasetNotFoundError):
        read_point_table(tmp_path / "missing.csv")
    fa = tmp_path / "s.fasta"
    fa.write_text(">a\nACGT\n>b\nACGN\n")
    with pytest.raises(DatasetFormatError, match="letters"):
        read_fasta(fa)
    fa.write_text(">a\nACGT\n>b\nACG\n")
    with pytest.raises(DatasetFormatError, match="lengths"):
        read_fasta(fa)
    fa.write_text(">a\nAC\ngt\n>b\nTTTT\n")
    assert read_fasta(fa) == (["a", "b"], ["ACGT", "TTTT"])  # multi-line, lower case accepted
    tsv = tmp_path / "scores.tsv"
    tsv.write_text("id\tscore\na\t1.5\n")
    with pytest.raises(DatasetFormatError, match="no score"):
        read_scores(tsv, ["a", "b"])
    tsv.write_text("id\tscore\nb\t2\na\t1.5\n")
    assert read_scores(tsv, ["a", "b"]).tolist() == [1.5, 2.0]


def test_select_keeps_the_final_checkpoint():
    steps = [10, 20, 40, 80, 160, 320, 640]
    assert select(steps, None) == list(range(7))
    assert select(steps, 3) == [0, 3, 6]
    log = select(steps, 4, "log")
    assert log[0] == 0 and log[-1] == 6 and len(log) <= 4


def test_checkpoint_folder_loads_in_step_order_with_last_deduplicated(tmp_path):
    dm = BooleanLandscapeData(data_dir=str(tmp_path / "data"), n_bits=8, needle_size=3, num_samples=200, batch_size=32)
    L.seed_everything(0)
    model = LandscapePredictor(input_dim=8, hidden=8)
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=3, save_top_k=-1, save_last=True,
                         filename="{step:03d}")
    trainer = L.Trainer(max_steps=9, logger=False, callbacks=[ck], enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    steps, models = load_trajectory(tmp_path / "ck")
    assert steps == [3, 6, 9] and (tmp_path / "ck" / "last.ckpt").exists()
    x = torch.rand(5, 8).round()
    assert torch.allclose(as_score(models[-1])(x), model(x))  # the final checkpoint is the trained model
    assert not torch.allclose(models[0](x), models[-1](x))
    assert not any(p.requires_grad for p in models[0].parameters())
    # a glob picks the folder; a class given explicitly is used
    steps2, _ = load_trajectory(str(tmp_path / "c*"), predictor_class="lit_iclr.trajectory_sampler.LandscapePredictor")
    assert steps2 == steps


def test_checkpoint_folder_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint folder"):
        load_trajectory(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no .ckpt"):
        load_trajectory(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be read safely"):
        load_trajectory(bad)
    anon = tmp_path / "anon"
    anon.mkdir()
    torch.save({"state_dict": {}, "global_step": 1}, anon / "a.ckpt")
    with pytest.raises(CheckpointError, match="does not say which module"):
        load_trajectory(anon)


def test_classifier_score_is_the_target_log_probability():
    net = torch.nn.Linear(3, 4)
    x = torch.randn(6, 3)
    target = torch.tensor([0, 1, 2, 3, 0, 1])
    expected = torch.log_softmax(net(x), -1)[torch.arange(6), target]
    assert torch.allclose(as_score(net, target)(x), expected)
    with pytest.raises(ValueError, match="target"):
        as_score(net)(x)


@pytest.mark.parametrize("where", ["lit_iclr_class", "_class_path", "predictor_class"])
def test_a_checkpoint_naming_popen_runs_nothing(tmp_path, where):
    """A checkpoint naming `subprocess.Popen` with shell args was called by the loader (a shell command ran)."""
    marker = tmp_path / "ran"
    folder = tmp_path / "ck"
    folder.mkdir()
    hp = {"args": f"touch {marker}", "shell": True}
    ckpt = {"state_dict": {}, "global_step": 1, "hyper_parameters": hp}
    if where == "lit_iclr_class":
        ckpt["lit_iclr_class"] = "subprocess.Popen"
    elif where == "_class_path":
        hp["_class_path"] = "subprocess.Popen"
    torch.save(ckpt, folder / "a.ckpt")
    with pytest.raises(CheckpointError, match="names the class 'subprocess.Popen', which is not a lit-iclr model"):
        load_trajectory(folder, predictor_class="subprocess.Popen" if where == "predictor_class" else None)
    assert not marker.exists()


def test_a_checkpoint_naming_a_non_model_inside_lit_iclr_is_refused(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    torch.save({"state_dict": {}, "global_step": 1, "lit_iclr_class": "lit_iclr.core.data.Path",
                "hyper_parameters": {}}, folder / "a.ckpt")
    with pytest.raises(CheckpointError, match="not a lit-iclr model"):
        load_trajectory(folder)
    torch.save({"state_dict": {}, "global_step": 1, "lit_iclr_class": "lit_iclr.trajectory_sampler.LandscapePredictor",
                "hyper_parameters": {"_class_path": "lit_iclr.trajectory_sampler.ImageClassifier"}}, folder / "a.ckpt")
    with pytest.raises(CheckpointError, match="names different modules"):
        load_trajectory(folder)
