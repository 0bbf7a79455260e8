"""The host-sync counter and the CPU-only-kernel check behind `scripts/gpu_check.sh --dry-run` (core/plan_devicecheck.py).

What is counted (per training batch, in code of the project only): `.item()`, `.tolist()`, `.numpy()`, `np.asarray(t)`,
`.cpu()`, `.to("cpu")`, `bool(t)`, `int(t)`, `float(t)`, a tensor used as a Python index, `nonzero`, `argwhere`,
`masked_select`, `unique(_consecutive)` and boolean-mask indexing: on a GPU each one waits for the device.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_iclr.core import plan_devicecheck as D

ROOT = Path(__file__).resolve().parents[2]
HERE = str(Path(__file__).resolve().parent)

# Syncs the dry run finds today in a method's step, with the owner's reason; anything else fails the dry run.
KNOWN_SYNCS = {
    # found by the first dry run (seeds/platform.md, "Planning for paper scale"); each is its method's to remove or to
    # keep as host-side by design (environment interaction, bandit bookkeeping, a Python loop over values)
    "lit_iclr/storm/module.py tolist": "lead_steps read to unroll the rollout loop",
    "lit_iclr/cibm/module.py __float__": "scalars read in the step",
    "lit_iclr/evotest/module.py __int__": "episode id read (agent/environment loop on the host by design)",
    "lit_iclr/evotest/actor.py numpy": "LLM/environment loop on the host by design",
    "lit_iclr/core/llm.py to(cpu)": "the local LM client moves ids to its configured device string (\"cpu\" here)",
    "lit_iclr/reimts/split.py __int__": "split sizes read from tensors",
    "lit_iclr/reimts/backbones.py nonzero": "observed entries of the irregular grid (value-dependent shape)",
    "lit_iclr/sooper/module.py __bool__": "safe-planning rollouts in the simulator (host by design)",
    "lit_iclr/sooper/module.py numpy": "safe-planning rollouts in the simulator (host by design)",
    "lit_iclr/sooper/module.py __float__": "safe-planning rollouts in the simulator (host by design)",
    "lit_iclr/sooper/planning.py x[bool mask]": "safe-planning rollouts in the simulator (host by design)",
    "lit_iclr/stageroute/module.py numpy": "bandit statistics kept in numpy (host by design)",
    "lit_iclr/stageroute/module.py cpu": "bandit statistics kept in numpy (host by design)",
}
FAST_TWINS = ["tests/configs/vgf.yaml", "tests/configs/three_dcs.yaml"]  # the default suite's subset (a few seconds each)


def _project_code(x: torch.Tensor, mask: torch.Tensor) -> None:
    """Every counted call once (this file stands for project code in the unit tests)."""
    x.sum().item()
    x.tolist()
    x.numpy()
    np.asarray(x)
    x.cpu()
    x.to("cpu")
    bool(x[0] > 0)
    int(x[0])
    float(x[0])
    [0, 1, 2][torch.tensor(1)]
    torch.nonzero(mask)
    x[mask]
    torch.unique(x)


def _not_syncs(x: torch.Tensor, mask: torch.Tensor) -> None:
    y = x * 2 + 1
    y = torch.where(mask, y, 0.0)  # three-argument where: no value-dependent shape
    y.to(torch.float64)
    y.to(x.device)  # the device-agnostic move (names the CPU on a CPU run)
    y.to(x.device, non_blocking=True) if x.device.type != "cpu" else y
    y.sum()
    x[1:3]
    x[torch.tensor([0, 2])]  # integer index tensor: shape known without reading values


def test_each_sync_is_counted_once_and_other_ops_are_not():
    x, mask = torch.randn(4), torch.tensor([True, False, True, False])
    counter = D.HostSyncCounter(package_dir=HERE)
    with counter:
        _project_code(x, mask)
    names = sorted(name for _, name in counter.sites)
    assert names == sorted(["item", "tolist", "numpy", "__array__", "cpu", "to(cpu)", "__bool__", "__int__", "__float__",
                            "__index__", "nonzero", "x[bool mask]", "unique"])
    assert counter.total == 13  # np.asarray's own .numpy() inside torch is not counted again
    assert all(site.startswith("core/test_host_syncs.py:") for site, _ in counter.sites)
    counter = D.HostSyncCounter(package_dir=HERE)
    with counter:
        _not_syncs(x, mask)
    assert counter.total == 0, counter.sites


def test_calls_made_by_torch_or_other_code_are_not_the_projects():
    p = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.Adam([p])
    p.grad = torch.ones(3)
    counter = D.HostSyncCounter(package_dir=HERE)
    with counter:
        opt.step()  # Adam reads its CPU step counter with .item() inside torch
        np.allclose(p.detach(), 0)  # numpy's own conversion, called from here: counted once as __array__
    assert [name for _, name in counter.sites] == ["__array__"]
    counter = D.HostSyncCounter()  # the package: nothing in this file is its code
    with counter:
        torch.randn(3).sum().item()
    assert counter.total == 0


def test_the_callback_counts_per_batch_after_the_first(tmp_path, monkeypatch):
    from tests.core.toy import ToyRegression

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self(batch["x"]), batch["y"])
        if loss.item() > 1e9:  # a per-step host sync
            raise AssertionError
        return loss

    monkeypatch.setattr(ToyRegression, "training_step", training_step)
    from lightning.pytorch import Trainer

    from tests.core.toy import ToyData

    counter = D.CountHostSyncs(skip=1, package_dir=HERE)
    dm = ToyData(data_dir=str(tmp_path), batch_size=8, num_samples=64)
    model = ToyRegression(num_features=dm.num_features)
    Trainer(max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[counter],
            default_root_dir=tmp_path, limit_val_batches=0).fit(model, datamodule=dm)
    report = counter.report()
    assert report["steps"] == 4 and report["syncs_per_step"] == 1
    assert list(report["sites"]) == [f"core/test_host_syncs.py:{training_step.__code__.co_firstlineno + 2} item"]


def test_no_cpu_only_kernel_outside_onednn_linear_which_falls_back_off_the_cpu(tmp_path):
    assert D.cpu_only_kernel_sites() == []
    assert D.onednn_falls_back_off_cpu()
    # the scan finds one where it is
    (tmp_path / "m.py").write_text("import torch\ny = torch.ops.mkldnn._linear_pointwise(x, w, None, 'none', [], '')\n")
    assert D.cpu_only_kernel_sites(str(tmp_path)) == ["lit_iclr/m.py:2"]


def _unexpected(report: dict) -> dict:
    found = {" ".join((site.split(":")[0], name)): n for site_name, n in report["sites"].items()
             for site, name in [site_name.rsplit(" ", 1)]}
    return {k: v for k, v in found.items() if k not in KNOWN_SYNCS}


@pytest.mark.parametrize("twin", FAST_TWINS)
def test_dry_run_training_steps_make_no_unknown_host_syncs(twin, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    report = D.count_step_syncs(twin, 3, str(tmp_path / "run"), ["--data.init_args.data_dir", str(tmp_path / "data")])
    assert report["steps"] >= 1
    assert not _unexpected(report), f"{twin}: host syncs in the training step: {report['sites']}"


def _all_twins() -> list[str]:
    return [f"tests/configs/{c.name}" for c in sorted((ROOT / "configs").glob("*.yaml"))
            if (ROOT / "tests" / "configs" / c.name).exists()]


@pytest.mark.slow
@pytest.mark.parametrize("twin", _all_twins())
def test_dry_run_all_default_configs(twin, tmp_path, monkeypatch):
    test_dry_run_training_steps_make_no_unknown_host_syncs(twin, tmp_path, monkeypatch)


def test_gpu_check_script_dry_run_and_help(tmp_path):
    script = ROOT / "scripts" / "gpu_check.sh"
    out = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, check=True).stdout
    assert "--dry-run" in out and "bf16-mixed" in out
    env = {**os.environ, "PY": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    gpu = subprocess.run(["bash", str(script), "configs/storm.yaml"], capture_output=True, text=True, env=env)
    assert gpu.returncode == 2 and "no CUDA device" in gpu.stderr
    bad = subprocess.run(["bash", str(script), "--frobnicate"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown option --frobnicate" in bad.stderr
    dry = subprocess.run(["bash", str(script), "--dry-run", "--steps", "3", "--run-dir", str(tmp_path),
                          "tests/configs/vgf.yaml"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "CPU-only kernel calls outside core/onednn_linear.py: none" in dry.stdout
    assert "| tests/configs/vgf.yaml | 2 | 0 | - |" in dry.stdout  # 3 batches, the first not counted, no sync
