"""Hub sharing: export -> load gives identical outputs; offline download of an unknown repo fails clearly."""
import pytest
import torch
import yaml

import tests.core.toy as toy
from lit_iclr.cli import main
from lit_iclr.core.errors import CheckpointError, LitIclrError
from lit_iclr.core.hub import download, export, load_model, read_checkpoint


@pytest.fixture(autouse=True)
def trust_the_toy_models(monkeypatch):
    """Hub loading imports only lit_iclr.* classes unless a prefix is trusted; the test models live in tests.core.toy."""
    monkeypatch.setenv("LIT_ICLR_TRUSTED_MODULES", "tests.core.toy")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hub")
    cli = main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp / "d"),
                "--model.init_args.hidden", "6", "--trainer.max_steps", "4", "--trainer.log_every_n_steps", "1",
                "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp / "run")])
    return tmp, cli


def test_export_then_load_gives_identical_outputs(trained):
    tmp, cli = trained
    folder = export(tmp / "run" / "checkpoints" / "last.ckpt", tmp / "export")
    assert {p.name for p in folder.iterdir()} == {"config.yaml", "model.safetensors", "README.md"}
    card = (folder / "README.md").read_text()
    assert "python cli.py" in card and "git sha" in card and "train/loss" in card and "torch:" in card
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    assert cfg["model"]["init_args"]["hidden"] == 6 and cfg["model"]["init_args"]["num_features"] == 3

    loaded = load_model(folder)
    assert isinstance(loaded, toy.ToyRegression)
    x = torch.randn(5, 3)
    cli.model.eval()
    torch.testing.assert_close(loaded(x), cli.model(x), rtol=0, atol=0)


def test_export_refuses_to_overwrite_and_leaves_nothing_on_failure(trained, tmp_path):
    tmp, _ = trained
    with pytest.raises(CheckpointError):
        export(tmp_path / "missing.ckpt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_read_checkpoint_refuses_pickled_objects(tmp_path):
    bad = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "obj": object()}, bad)  # needs unpickling of arbitrary classes
    with pytest.raises(CheckpointError, match="cannot be read safely"):
        read_checkpoint(bad)


def test_download_unknown_repo_offline_is_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(LitIclrError, match="HF_HUB_OFFLINE is set"):
        download("lit-iclr/no-such-model", revision="0123456789abcdef0123456789abcdef01234567")


def test_hub_cli_export(trained, tmp_path, capsys):
    tmp, _ = trained
    main(["hub", "export", str(tmp / "run" / "checkpoints" / "last.ckpt"), "--out", str(tmp_path / "cli_export")])
    assert (tmp_path / "cli_export" / "model.safetensors").exists()
    with pytest.raises(SystemExit) as e:
        main(["hub", "export", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "no such checkpoint" in capsys.readouterr().err
