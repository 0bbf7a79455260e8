"""Run a method's tiny twin config (tests/configs/<name>.yaml) through the CLI and read back what it logged."""
from __future__ import annotations

import csv
from pathlib import Path

from lit_iclr.cli import main

ROOT = Path(__file__).resolve().parents[1]


def twin_config(name: str) -> str:
    return str(ROOT / "tests" / "configs" / f"{name}.yaml")


def fit_twin(name: str, run_dir: Path, *extra: str, subcommand: str = "fit"):
    """`cli.py <subcommand> --config tests/configs/<name>.yaml` writing into `run_dir`, data cached in run_dir/data."""
    return main([subcommand, "--config", twin_config(name), "--trainer.default_root_dir", str(run_dir),
                 "--data.init_args.data_dir", str(Path(run_dir) / "data"), *extra])


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def print_config(config: str, capsys) -> str:
    """The fully resolved YAML that `cli.py fit --config <config> --print_config` prints (it must exit 0)."""
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(ROOT / config), "--print_config"])
    assert e.value.code in (0, None)
    return capsys.readouterr().out
