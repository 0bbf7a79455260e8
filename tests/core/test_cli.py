"""The CLI: run folders, overlays, links, `prepare`, and clear errors instead of tracebacks."""
import json
from pathlib import Path

import pytest
import torch

import tests.core.toy as toy
from lit_iclr.cli import LitIclrCLI, _explain_parse_error, main
from lit_iclr.core.errors import ConfigError
from lit_iclr.core.runs import config_name, resolve_run_dir
from lit_iclr.core.slurm import check_slurm_matches_trainer

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.num_sanity_val_steps", "0"]


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_configs_compose_left_to_right_and_data_sizes_link(tmp_path):
    base = write(tmp_path / "toy.yaml", f"""
model: {{class_path: tests.core.toy.ToyRegression, init_args: {{hidden: 8}}}}
data: {{class_path: tests.core.toy.ToyData, init_args: {{data_dir: {tmp_path / 'data'}}}}}
trainer: {{max_steps: 2, accelerator: cpu}}
""")
    overlay = write(tmp_path / "more.yaml", "model: {init_args: {hidden: 5}}\ntrainer: {max_steps: 3}\n")
    cli = LitIclrCLI(args=["--config", base, "--config", overlay, "--trainer.default_root_dir", str(tmp_path / "r"),
                           *QUIET], run=False)
    assert cli.model.net[0].out_features == 5  # the later file wins
    assert cli.model.net[0].in_features == cli.datamodule.num_features == 3  # linked, never written in YAML
    assert cli.trainer.max_steps == 3


def test_fit_writes_run_folder_with_config_checkpoints_and_run_info(tmp_path):
    cli = main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir",
                str(tmp_path / "data"), "--trainer.max_steps", "3", "--trainer.log_every_n_steps", "1",
                "--trainer.default_root_dir", str(tmp_path / "r"),
                *QUIET])
    run = tmp_path / "r"
    assert (run / "config.yaml").exists() and (run / "checkpoints" / "last.ckpt").exists()
    assert (run / "metrics.csv").exists() and list(run.glob("events.out.tfevents.*"))
    info = json.loads((run / "run_info.json").read_text())
    assert info["versions"]["torch"] == torch.__version__.split("+")[0] or info["versions"]["torch"] in torch.__version__
    assert "fit" in info["command"] or info["stage"] == "fit"
    assert cli.trainer.global_step == 3


def test_run_folder_names(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert config_name(["configs/storm.yaml", "configs/trainer/ddp.yaml"]) == "storm"
    run, _ = resolve_run_dir(None, ["configs/storm.yaml"], runs_root=str(tmp_path))
    assert run.parent == tmp_path / "storm" and run.is_dir()  # created here, atomically
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert resolve_run_dir(None, ["configs/storm.yaml"], runs_root=str(tmp_path))[0] == tmp_path / "storm" / "4242"
    # resume outside SLURM continues the newest run that has a last checkpoint
    monkeypatch.delenv("SLURM_JOB_ID")
    for name in ("20260101-000000", "20260102-000000"):
        (tmp_path / "storm" / name / "checkpoints").mkdir(parents=True)
        (tmp_path / "storm" / name / "checkpoints" / "last.ckpt").write_bytes(b"x")
    run, _ = resolve_run_dir(None, ["configs/storm.yaml"], resume=True, runs_root=str(tmp_path))
    assert run.name == "20260102-000000"


def test_save_config_survives_requeue_in_same_folder(tmp_path):
    args = ["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp_path / "d"),
            "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path / "same"), *QUIET]
    main(args)
    main(args)  # a requeued job starts again in the same folder: config.yaml is kept, not an error
    assert (tmp_path / "same" / "config.yaml").exists()


def test_prepare_generates_data_without_training(tmp_path, capsys):
    main(["prepare", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp_path)])
    assert len(list(tmp_path.glob("toy-v1-*/toy.npz"))) == 1  # keyed by the options that shape the data
    assert not list(tmp_path.glob(".toy-v1*.tmp-*"))


def test_unknown_class_suggests_closest_names(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--model", "ToyRegresion", "--data", "ToyData"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown class 'ToyRegresion'" in err and "ToyRegression" in err and "Traceback" not in err


def test_malformed_yaml_is_one_clear_line(tmp_path, capsys):
    bad = write(tmp_path / "bad.yaml", "model:\n  class_path: [unclosed\n")
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "lit-iclr: error:" in err and "bad.yaml" in err and "Traceback" not in err


def test_missing_data_root_names_the_path_and_the_fix(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.root", str(tmp_path / "nope"),
              "--trainer.default_root_dir", str(tmp_path / "r"), *QUIET])
    err = capsys.readouterr().err
    assert str(tmp_path / "nope") in err and "fix:" in err and "Traceback" not in err


def test_checkpoint_from_a_different_model_is_refused(tmp_path, capsys):
    data = ["--data", "ToyData", "--data.init_args.data_dir", str(tmp_path / "d"), *QUIET]
    main(["fit", "--model", "OtherToy", *data, "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path / "a")])
    ckpt = str(tmp_path / "a/checkpoints/last.ckpt")
    with pytest.raises(SystemExit):
        main(["fit", "--model", "ToyRegression", *data, "--trainer.max_steps", "2", "--ckpt_path", ckpt,
              "--trainer.default_root_dir", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert "was written by tests.core.toy.OtherToy" in err and "Traceback" not in err


def test_checkpoint_with_other_shapes_is_refused(tmp_path):
    from lit_iclr.core.errors import CheckpointError

    small, big = toy.ToyRegression(num_features=3, hidden=4), toy.ToyRegression(num_features=3, hidden=5)
    ckpt = {"state_dict": small.state_dict(), "lit_iclr_class": "tests.core.toy.ToyRegression"}
    with pytest.raises(CheckpointError, match=r"3 tensors of another shape \(e.g. net.0.bias: checkpoint \(4,\) vs model \(5,\)"):
        big.on_load_checkpoint(ckpt)
    small.on_load_checkpoint(ckpt)  # its own checkpoint loads


def test_explain_parse_error_lists_unavailable_methods():
    msg = _explain_parse_error("Parser key \"model\":\n  - Expected a dot import path string: Storrm\n"
                               "  Given value: Storrm", ["--model", "Storrm"])
    assert msg.startswith("unknown class 'Storrm'") and "Closest valid names" in msg


def test_slurm_preflight(monkeypatch):
    env = {"SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_JOB_NAME": "train"}
    check_slurm_matches_trainer(2, 4, env)  # matches
    with pytest.raises(ConfigError, match="num_nodes"):
        check_slurm_matches_trainer(1, 4, env)
    with pytest.raises(ConfigError, match="ntasks-per-node=2"):
        check_slurm_matches_trainer(2, 2, env)
    check_slurm_matches_trainer(1, 4, {})  # not under SLURM: nothing to check


def test_line_progress_prints_lines_not_carriage_returns(tmp_path, capfd):
    main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp_path / "d"),
          "--trainer.max_steps", "4", "--trainer.default_root_dir", str(tmp_path / "r"),
          "--trainer.num_sanity_val_steps", "0"])
    out = capfd.readouterr().out
    assert "[train] epoch 0" in out and "\r" not in out
    assert toy.ToyRegression  # the toy module is what ran


def test_invalid_value_names_the_argument(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model", "ToyRegression", "--model.init_args.hidden", "abc", "--data", "ToyData"])
    err = capsys.readouterr().err
    assert "ToyRegression: invalid value for 'hidden'" in err and "abc" in err


def test_error_raised_while_building_classes_is_one_clear_message(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model", "ToyRegression", "--data", "MisconfiguredData"])
    err = capsys.readouterr().err
    assert "era5.zarr: has no variable 'temperature'" in err and "fix:" in err and "Traceback" not in err


@pytest.mark.slow  # starts the wandb service process (several seconds)
def test_wandb_overlay_logs_offline_into_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cli = main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp_path / "d"),
                "--config", str(Path(__file__).parents[2] / "configs/trainer/wandb.yaml"), "--trainer.max_steps", "3",
                "--trainer.log_every_n_steps", "1", "--trainer.default_root_dir", str(tmp_path / "r"), *QUIET])
    assert [type(lg).__name__ for lg in cli.trainer.loggers] == ["RunCSVLogger", "WandbLogger"]
    assert list((tmp_path / "r" / "wandb").glob("offline-run-*")) and (tmp_path / "r" / "metrics.csv").exists()


@pytest.mark.parametrize("overlay", sorted(p.name for p in (Path(__file__).parents[2] / "configs/trainer").glob("*.yaml")))
def test_every_trainer_overlay_parses(overlay, capsys):
    path = Path(__file__).parents[2] / "configs/trainer" / overlay
    with pytest.raises(SystemExit) as e:
        main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--config", str(path), "--print_config"])
    assert e.value.code in (0, None), capsys.readouterr().err
    assert "trainer:" in capsys.readouterr().out
