"""Runs that cannot be lost or mixed up: run identity, resume, concurrency, signals, safe loading, one-line errors.

Each test reproduces a fault found by trying the platform as a hostile user would (see seeds/platform.md).
"""
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import tests.core.toy as toy
from lit_iclr.cli import main
from lit_iclr.core.data import atomic_dir, clean_stale_tmp, ensure_generated
from lit_iclr.core.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["--trainer.num_sanity_val_steps", "0", "--trainer.accelerator", "cpu"]


def toy_config(path: Path, hidden: int = 8, max_steps: int = 2, data_dir: Path | None = None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "model": {"class_path": "tests.core.toy.ToyRegression", "init_args": {"hidden": hidden}},
        "data": {"class_path": "tests.core.toy.ToyData", "init_args": {"data_dir": str(data_dir or path.parent / "d")}},
        "trainer": {"max_steps": max_steps, "log_every_n_steps": 1, "limit_val_batches": 2, "val_check_interval": 2}}))
    return str(path)


def one_line_error(capsys, *argv) -> str:
    """Run the CLI, expect exit code 2 and return the message (which must be short and traceback-free)."""
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("lit-iclr: error:"), err
    return err


# ------------------------------------------------------------------------------------- 1. run identity and resume
def test_resume_continues_only_a_run_of_the_same_model_and_data(tmp_path, monkeypatch, capsys):
    """`--ckpt_path last` with another config of the same file name must not resume (or rewrite) that run's folder;
    the matching config resumes it with a changed max_steps, which is recorded, and config.yaml stays as written."""
    monkeypatch.chdir(tmp_path)
    mine = toy_config(tmp_path / "a" / "toy.yaml", hidden=8, max_steps=2, data_dir=tmp_path / "d")
    other = toy_config(tmp_path / "b" / "toy.yaml", hidden=5, max_steps=2, data_dir=tmp_path / "d")
    main(["fit", "--config", mine, *QUIET])
    (run,) = (tmp_path / "runs" / "toy").iterdir()
    saved = (run / "config.yaml").read_text()
    out = capsys.readouterr().out
    # the end-of-run summary: run folder, checkpoint, headline metrics
    assert f"run folder {run.relative_to(tmp_path)}" in out and "checkpoint:" in out and "val/loss" in out

    err = one_line_error(capsys, "fit", "--config", other, "--ckpt_path", "last", *QUIET)
    assert "model.init_args.hidden: 8 -> 5" in err
    assert (run / "config.yaml").read_text() == saved and len(list((tmp_path / "runs" / "toy").iterdir())) == 1

    cli = main(["fit", "--config", mine, "--ckpt_path", "last", "--trainer.max_steps", "3", *QUIET])
    assert cli.trainer.global_step == 3 and Path(cli.trainer.default_root_dir).resolve() == run.resolve()
    assert (run / "config.yaml").read_text() == saved  # written once, never overwritten
    info = json.loads((run / "run_info.json").read_text())
    assert info["resume"]["config_changes"]["trainer.max_steps"] == [2, 3]


def test_a_run_folder_of_another_config_is_refused_even_when_named_explicitly(tmp_path, capsys):
    data = ["--data", "ToyData", "--data.init_args.data_dir", str(tmp_path / "d"), *QUIET]
    main(["fit", "--model", "ToyRegression", *data, "--trainer.max_steps", "1", "--trainer.default_root_dir",
          str(tmp_path / "r")])
    saved = (tmp_path / "r" / "config.yaml").read_text()
    err = one_line_error(capsys, "fit", "--model", "ToyRegression", "--model.init_args.hidden", "3", *data,
                         "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path / "r"))
    assert "belongs to another run" in err and (tmp_path / "r" / "config.yaml").read_text() == saved


RACE = """
import sys, time, types
from pathlib import Path
root, me, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name in ("lit_iclr", "lit_iclr.core"):  # load runs.py (and errors.py) without the packages' heavy imports
    pkg = types.ModuleType(name)
    pkg.__path__ = [name.replace(".", "/")]
    sys.modules[name] = pkg
from lit_iclr.core import runs
runs.time.strftime = lambda fmt: "20260101-000000"  # both start in the same second
(Path(root) / f"ready-{me}").touch()
while len(list(Path(root).glob("ready-*"))) < n:  # a file barrier: create folders at the same moment
    time.sleep(0.001)
print(runs.resolve_run_dir(None, ["configs/toy.yaml"], runs_root=root)[0])
"""


def test_concurrent_runs_get_distinct_folders(tmp_path):
    """Two processes started in the same second get their own folders (exclusive mkdir, suffix on collision)."""
    n = 2
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path), str(i), str(n)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True) for i in range(n)]
    dirs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(dirs)) == n and all(Path(d).is_dir() for d in dirs)
    assert sorted(Path(d).name for d in dirs) == ["20260101-000000", "20260101-000000-1"]


@pytest.mark.parametrize("subcommand", ["fit", "test"])
def test_ckpt_path_last_with_nothing_to_resume_fails(tmp_path, monkeypatch, capsys, subcommand):
    monkeypatch.chdir(tmp_path)
    cfg = toy_config(tmp_path / "toy.yaml")
    err = one_line_error(capsys, subcommand, "--config", cfg, "--ckpt_path", "last", *QUIET)
    assert "no earlier run of this config holds a checkpoint" in err and "fix:" in err
    err = one_line_error(capsys, subcommand, "--config", cfg, "--ckpt_path", "last", *QUIET,
                         "--trainer.default_root_dir", str(tmp_path / "empty"))
    assert "no checkpoint to resume" in err


def test_missing_checkpoint_file_is_one_line(tmp_path, capsys):
    err = one_line_error(capsys, "test", "--model", "ToyRegression", "--data", "ToyData", "--ckpt_path",
                         str(tmp_path / "nope.ckpt"), "--trainer.default_root_dir", str(tmp_path / "r"))
    assert "nope.ckpt: no such checkpoint file" in err


def test_metrics_rows_after_the_checkpoint_are_dropped_on_resume(tmp_path):
    """Checkpoint at step 4, crash at step 6: rows of steps 4 and 5 were logged twice before."""
    args = ["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp_path / "d"),
            "--trainer.default_root_dir", str(tmp_path / "r"), "--trainer.max_steps", "10",
            "--trainer.log_every_n_steps", "1", "--trainer.limit_val_batches", "0", *QUIET]
    crash = '{"class_path": "tests.core.toy.CrashAtStep", "init_args": {"step": 6}}'
    with pytest.raises(toy.Crash):
        main([*args, "--trainer.callbacks+", crash, "--checkpoint.every_n_train_steps", "4"])
    main([*args, "--ckpt_path", "last", "--checkpoint.every_n_train_steps", "4"])
    with open(tmp_path / "r" / "metrics.csv", newline="") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert steps == list(range(10))


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_signal_saves_a_checkpoint_and_says_so(tmp_path, capsys, sig):
    send = json.dumps({"class_path": "tests.core.toy.SignalAtStep", "init_args": {"step": 3, "signal": sig}})
    cli = main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp_path / "d"),
                "--trainer.default_root_dir", str(tmp_path / "r"), "--trainer.max_steps", "20",
                "--trainer.callbacks+", send, *QUIET])
    ckpt = torch.load(tmp_path / "r" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == cli.trainer.global_step == 4  # stopped after the step that was running
    err = capsys.readouterr().err
    assert f"{sig} received: saved" in err and "--ckpt_path last" in err


# -------------------------------------------------------------------------------------- 6-7. generated data folders
def test_stale_temporary_folders_of_killed_generators_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".toy-v1.tmp-{dead_pid}"  # the old name (no host) of a SIGKILLed generator
    stale.mkdir()
    alive = tmp_path / f".toy-v1.tmp-{os.getppid()}"  # a generator still running
    alive.mkdir()
    ensure_generated(tmp_path / "toy-v1", lambda out: (out / "f").write_text("x"))
    assert not stale.exists() and alive.exists() and (tmp_path / "toy-v1" / "f").exists()
    assert clean_stale_tmp(tmp_path / "toy-v1") == []


def test_failed_generation_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "x"):
        raise RuntimeError("generator failed")
    assert list(tmp_path.iterdir()) == []


def test_configs_with_different_data_options_share_a_data_dir(tmp_path):
    """Two configs that shape the generated data differently never read each other's folder."""
    a = toy.ToyData(data_dir=str(tmp_path), num_samples=64)
    b = toy.ToyData(data_dir=str(tmp_path), num_samples=32)
    for dm in (a, b):
        dm.prepare_data()
        dm.setup("fit")
    assert a.path != b.path and len(a.ds) == 64 and len(b.ds) == 32
    assert toy.ToyData(data_dir=str(tmp_path), num_samples=64, batch_size=4).path == a.path  # loader options do not


# ----------------------------------------------------------------------------------------------- 8-9. safe loading
def test_no_unsafe_torch_load_on_user_paths():
    offenders = []
    for f in [*ROOT.glob("lit_iclr/**/*.py"), *ROOT.glob("benchmarks/*.py"), ROOT / "cli.py"]:
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if "weights_only=False" in line and not line.lstrip().startswith("#"):
                offenders.append(f"{f.relative_to(ROOT)}:{i}")
    assert offenders == []


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory):
    from lit_iclr.core.hub import export

    tmp = tmp_path_factory.mktemp("hub")
    main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp / "d"),
          "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp / "run"), *QUIET])
    return export(tmp / "run" / "checkpoints" / "last.ckpt", tmp / "export")


def _copy(folder: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(folder, dest)
    return dest


def test_hub_refuses_a_foreign_class_before_importing_it(hub_folder, tmp_path, monkeypatch):
    from lit_iclr.core.hub import HASHED_FILES, load_model, sha256

    monkeypatch.setenv("LIT_ICLR_TRUSTED_MODULES", "tests.core.toy")
    marker = tmp_path / "imported"
    (tmp_path / "evil_module.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = _copy(hub_folder, tmp_path / "evil")
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg["model"]["class_path"] = "evil_module.Model"
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    card = (folder / "README.md").read_text()  # a consistent card: the checksum is not what stops it
    for name in HASHED_FILES:
        card = re.sub(rf"{re.escape(name)}: [0-9a-f]+", f"{name}: {sha256(folder / name)}", card)
    (folder / "README.md").write_text(card)
    with pytest.raises(CheckpointError, match="not a lit-iclr model"):
        load_model(folder)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_hub_checksum_catches_a_changed_weight_byte(hub_folder, tmp_path, monkeypatch, damage):
    from lit_iclr.core.hub import load_model

    monkeypatch.setenv("LIT_ICLR_TRUSTED_MODULES", "tests.core.toy")
    assert isinstance(load_model(hub_folder), toy.ToyRegression)  # the intact folder loads
    folder = _copy(hub_folder, tmp_path / "f")
    data = bytearray((folder / "model.safetensors").read_bytes())
    if damage == "flip":
        data[-3] ^= 0x10  # one bit of the last weight
    else:
        data = data[: len(data) // 2]
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        load_model(folder)


def test_hub_garbled_safetensors_with_matching_card_is_one_line(hub_folder, tmp_path, monkeypatch):
    from lit_iclr.core.hub import load_model, sha256

    monkeypatch.setenv("LIT_ICLR_TRUSTED_MODULES", "tests.core.toy")
    folder = _copy(hub_folder, tmp_path / "g")
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    card = (folder / "README.md").read_text()
    card = re.sub(r"model.safetensors: [0-9a-f]+", f"model.safetensors: {sha256(folder / 'model.safetensors')}", card)
    (folder / "README.md").write_text(card)
    with pytest.raises(CheckpointError, match="cannot be read as safetensors"):
        load_model(folder)


# ---------------------------------------------------------------------------------------------- one-line errors
def test_batch_size_must_be_positive(capsys):
    err = one_line_error(capsys, "fit", "--model", "ToyRegression", "--data", "ToyData",
                         "--data.init_args.batch_size", "0")
    assert "batch_size must be a positive integer, got 0" in err


def test_abbreviated_argument_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--trainer.max_epoch", "3"])
    assert e.value.code == 2
    assert "max_epoch" in capsys.readouterr().err


def test_model_that_does_not_fit_the_data_names_both_sizes(tmp_path, capsys):
    """Data with 5 features in a folder read by a model built for ToyData's 3: one line, not a matmul traceback."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "toy.npz", x=rng.normal(size=(16, 5)).astype(np.float32), y=np.zeros(16, np.float32))
    err = one_line_error(capsys, "fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.root",
                         str(tmp_path), "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path / "r"),
                         *QUIET)
    assert "ToyRegression does not fit the data of ToyData" in err and "num_features=3" in err


def test_progress_lines_are_throttled_by_time(tmp_path, capfd):
    main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp_path / "d"),
          "--trainer.max_steps", "24", "--trainer.limit_val_batches", "0", "--trainer.default_root_dir",
          str(tmp_path / "r"), *QUIET])
    lines = [ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("[train]")]
    assert 3 <= len(lines) <= 6  # 3 epochs of 8 batches: the epoch ends (+ the first batch), not 24 batch lines


# ------------------------------------------------------------------------- classes named in files: one allow-list
@pytest.mark.parametrize("name, why", [
    ("subprocess.Popen", "outside lit_iclr."),
    ("this.s", "outside lit_iclr."),
    ("lit_iclr.evil_pkg.Model", "neither a method package"),
    ("os.system; x", "not a dotted class path"),
])
def test_allow_list_refuses_names_before_importing_anything(monkeypatch, name, why):
    from lit_iclr.core import classes
    from lit_iclr.core.module import BaseModule

    imported = []
    monkeypatch.setattr(classes.importlib, "import_module", lambda m, *a: imported.append(m))
    with pytest.raises(CheckpointError, match=f"names the class .*{re.escape(why)}.*nothing was imported"):
        classes.resolve_class(name, BaseModule, "f.ckpt", "fix it")
    assert imported == []


def test_allow_list_resolves_lit_iclr_classes_of_the_expected_base(monkeypatch):
    from lit_iclr.core.classes import resolve_class
    from lit_iclr.core.module import BaseModule
    from lit_iclr.trajectory_sampler import LandscapePredictor

    assert resolve_class("lit_iclr.trajectory_sampler.LandscapePredictor", BaseModule, "f", "x") is LandscapePredictor
    for name in ("lit_iclr.core.data.Path", "lit_iclr.core.hub.importlib", "lit_iclr.core.data.BaseDataModule"):
        with pytest.raises(CheckpointError, match="not a lit-iclr model \\(a BaseModule subclass\\)"):
            resolve_class(name, BaseModule, "f", "x")  # inside lit_iclr, but not a model class defined there
    with pytest.raises(CheckpointError, match="outside lit_iclr"):
        resolve_class("tests.core.toy.ToyRegression", BaseModule, "f", "x")
    monkeypatch.setenv("LIT_ICLR_TRUSTED_MODULES", "tests.core.toy")  # a prefix the user chose to trust
    assert resolve_class("tests.core.toy.ToyRegression", BaseModule, "f", "x") is toy.ToyRegression


def _forged_checkpoint(path: Path, **fields) -> str:
    torch.save({"state_dict": {}, "global_step": 1, "epoch": 0, **fields}, path)
    return str(path)


def test_ckpt_path_naming_this_s_never_imports_this(tmp_path, capsys):
    """`this.s` (importing `this` prints the Zen of Python) was imported by the class comparison before the refusal."""
    ckpt = _forged_checkpoint(tmp_path / "this.ckpt", lit_iclr_class="this.s")
    sys.modules.pop("this", None)
    err = one_line_error(capsys, "fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir",
                         str(tmp_path / "d"), "--ckpt_path", ckpt, "--trainer.default_root_dir", str(tmp_path / "r"),
                         *QUIET)
    assert "this" not in sys.modules and "Beautiful is better" not in capsys.readouterr().out
    assert "was written by this.s (lit_iclr_class)" in err and "not imported" in err


def test_ckpt_path_with_only_a_class_path_of_another_model_is_refused_before_building(tmp_path, capsys, monkeypatch):
    """A VGF checkpoint without `lit_iclr_class` given to the wn_sensing config: Lightning swapped in VGF from the
    hyperparameters' `_class_path` and ended in a traceback; now one line, and VGF is never built."""
    from lit_iclr.vgf import VGF

    built = []
    monkeypatch.setattr(VGF, "__init__", lambda self, *a, **k: built.append(k) or (_ for _ in ()).throw(AssertionError))
    ckpt = _forged_checkpoint(tmp_path / "vgf.ckpt", hyper_parameters={"_class_path": "lit_iclr.vgf.VGF", "obs_dim": 3})
    err = one_line_error(capsys, "fit", "--config", str(ROOT / "tests/configs/wn_sensing.yaml"), "--ckpt_path", ckpt,
                         "--trainer.default_root_dir", str(tmp_path / "r"))
    assert "was written by lit_iclr.vgf.VGF (hyper_parameters._class_path), but the config selects " \
           "lit_iclr.wn_sensing.module.MatrixSensing" in err
    assert built == [] and not (tmp_path / "r").exists()


def test_ckpt_path_with_a_class_path_outside_lit_iclr_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "ran"
    ckpt = _forged_checkpoint(tmp_path / "popen.ckpt", hyper_parameters={
        "_class_path": "subprocess.Popen", "args": f"touch {marker}", "shell": True})
    err = one_line_error(capsys, "fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir",
                         str(tmp_path / "d"), "--ckpt_path", ckpt, "--trainer.default_root_dir", str(tmp_path / "r"),
                         *QUIET)
    assert "was written by subprocess.Popen" in err and not marker.exists()


def test_resume_checks_the_class_path_when_lit_iclr_class_is_absent():
    model = toy.ToyRegression(num_features=3, hidden=4)
    ckpt = {"state_dict": model.state_dict(), "hyper_parameters": {"_class_path": "tests.core.toy.OtherToy"}}
    with pytest.raises(CheckpointError, match=r"written by tests.core.toy.OtherToy \(hyper_parameters._class_path\)"):
        model.on_load_checkpoint(ckpt)
    ckpt["hyper_parameters"]["_class_path"] = "tests.core.toy.ToyRegression"
    model.on_load_checkpoint(ckpt)  # its own class: loads


def test_hub_refuses_a_lit_iclr_name_that_is_not_a_model(hub_folder, tmp_path, monkeypatch):
    from lit_iclr.core.hub import HASHED_FILES, load_model, sha256

    folder = _copy(hub_folder, tmp_path / "notmodel")
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg["model"] = {"class_path": "lit_iclr.core.data.Path", "init_args": {}}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    card = (folder / "README.md").read_text()
    for name in HASHED_FILES:
        card = re.sub(rf"{re.escape(name)}: [0-9a-f]+", f"{name}: {sha256(folder / name)}", card)
    (folder / "README.md").write_text(card)
    with pytest.raises(CheckpointError, match="not a lit-iclr model"):
        load_model(folder)


# ------------------------------------------------------------------- places that cannot be written: one line each
@pytest.fixture
def read_only(monkeypatch):
    """`read_only(folder)`: writes under `folder` fail with EROFS, as on a read-only mount. Tests run as root, where
    chmod stops no write, and bind mounts need privileges: so the OS calls that create, open for writing or rename
    files are wrapped, and the platform's own path is exercised (its probe write and its error handling)."""
    import builtins
    import errno

    folders: list[Path] = []

    def blocked(path) -> bool:
        try:
            p = Path(os.fsdecode(path)).absolute()
        except TypeError:  # a file descriptor
            return False
        return any(p == f or f in p.parents for f in folders)

    def erofs(path):
        raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))

    real_open, real_os_open, real_mkdir, real_replace = builtins.open, os.open, os.mkdir, os.replace

    def fake_open(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+") and not isinstance(file, int) and blocked(file):
            erofs(file)
        return real_open(file, mode, *a, **k)

    def fake_os_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and blocked(path):
            erofs(path)
        return real_os_open(path, flags, *a, **k)

    def fake_mkdir(path, *a, **k):
        if blocked(path):
            erofs(path)
        return real_mkdir(path, *a, **k)

    def fake_replace(src, dst, *a, **k):
        if blocked(src) or blocked(dst):
            erofs(dst)
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr(os, "replace", fake_replace)
    monkeypatch.setattr(os, "rename", fake_replace)
    return lambda folder: folders.append(Path(folder).absolute())


def test_read_only_data_dir_is_one_line(tmp_path, capsys, read_only):
    (tmp_path / "data").mkdir()
    read_only(tmp_path / "data")
    err = one_line_error(capsys, "fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir",
                         str(tmp_path / "data"), "--trainer.default_root_dir", str(tmp_path / "r"), *QUIET)
    assert "cannot be generated" in err and "read-only file system" in err and "data.init_args.data_dir" in err
    assert list((tmp_path / "data").iterdir()) == []


def test_read_only_runs_folder_is_one_line(tmp_path, capsys, monkeypatch, read_only):
    monkeypatch.chdir(tmp_path)
    cfg = toy_config(tmp_path / "toy.yaml", data_dir=tmp_path / "d")
    (tmp_path / "runs").mkdir()
    read_only(tmp_path / "runs")
    err = one_line_error(capsys, "fit", "--config", cfg, *QUIET)
    assert "run folder cannot be created" in err and "read-only file system" in err and "default_root_dir" in err


def test_resume_from_a_read_only_checkpoint_folder_refuses_before_training(tmp_path, capsys, read_only):
    args = ["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(tmp_path / "d"),
            "--trainer.default_root_dir", str(tmp_path / "r"), "--trainer.limit_val_batches", "0", *QUIET]
    main([*args, "--trainer.max_steps", "2"])
    files = sorted(p.relative_to(tmp_path) for p in (tmp_path / "r").rglob("*"))
    read_only(tmp_path / "r" / "checkpoints")
    err = one_line_error(capsys, *args, "--trainer.max_steps", "4", "--ckpt_path", "last")
    assert "checkpoints: is on a read-only file system" in err and "--checkpoint.dirpath" in err
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "r").rglob("*")) == files  # nothing trained or written
