"""benchmarks/juli.py measures the target its world's config trains: same generator options, so the same cached data
folder (the folder name hashes every option that changes the generated files, `base_steps` included)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_iclr.juli.data import PolicyChats
from tests.benchmark_script import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("juli")


@pytest.mark.parametrize("world", ["capital", "passphrase", "capital_ranked"])
def test_benchmark_data_is_the_configs(bench, world, tmp_path):
    config = yaml.safe_load((ROOT / bench.WORLD_CONFIGS[world]).read_text())
    assert config["data"]["init_args"]["world"] == world
    options = {k: v for k, v in config["data"]["init_args"].items()
               if k not in ("root", "data_dir", "batch_size", "num_workers", "policy_steps", "attack_steps")}
    from_config = PolicyChats(data_dir=str(tmp_path), **options)
    from_bench = bench.make_data(world, str(tmp_path), batch_size=16)
    assert from_bench.path == from_config.path
    assert from_bench.base_steps == config["data"]["init_args"]["base_steps"]
    # the benchmark aligns the way the config's module does
    assert bench.config_align_anchor(world) == config["model"]["init_args"].get("align_anchor", 0.0)
    # the scale knob: another base_steps is another target, in another folder
    other = bench.make_data(world, str(tmp_path), batch_size=16, base_steps=from_config.base_steps + 1)
    assert other.base_steps == from_config.base_steps + 1 and other.path != from_config.path


def test_a_bad_base_steps_in_the_config_is_one_line_naming_the_file(bench, tmp_path, monkeypatch):
    bad = tmp_path / "configs" / "juli_ranked.yaml"
    bad.parent.mkdir()
    bad.write_text("data:\n  init_args:\n    base_steps: -3\n")
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match="juli_ranked.yaml: data.init_args.base_steps must be a positive integer"):
        bench.config_base_steps("capital_ranked")
