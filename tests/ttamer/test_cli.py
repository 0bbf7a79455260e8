"""The policies through the CLI on exit tables in the real layout, the real configs parsed, the generator (slow)."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.cli import main
from lit_iclr.ttamer import ExitTableData
from lit_iclr.ttamer.exits import ExitTable, read_exit_table
from tests.twin import fit_twin, metric_rows, print_config, twin_config


def write_tables(folder, n=600, seed=0, stages=3):
    """Exits of a synthetic network (3 stages by default): deeper stages are right more often, with some overthinking."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 5, (n,), generator=g)
    logits = torch.randn(n, stages, 5, generator=g)
    for k in range(stages):
        logits[torch.arange(n), k, labels] += (k + 1.0) * torch.rand(n, generator=g) * 2
    folder.mkdir(parents=True, exist_ok=True)
    cost = torch.tensor([1.0] + [0.5] * (stages - 1), dtype=torch.float64)
    for name, sl in (("calibration", slice(0, n // 2)), ("test", slice(n // 2, n))):
        ExitTable(logits[sl], labels[sl], cost, "nested").save(folder / f"{name}.npz")


def test_policies_fit_and_score_through_the_cli(tmp_path):
    write_tables(tmp_path / "exits")
    fit_twin("ttamer", tmp_path, "--data.init_args.root", str(tmp_path / "exits"))
    row = {k: float(v) for k, v in metric_rows(tmp_path)[-1].items() if v and k.startswith("val/")}
    # the oracle bounds every policy; every fitted policy beats always exiting at the first stage, whose accuracy is
    # computed here from the tables (on both halves, whichever the validation split draws from)
    first = max(float((t.logits[:, 0].argmax(-1) == t.labels).double().mean())
                for t in (read_exit_table(tmp_path / "exits" / f"{n}.npz") for n in ("calibration", "test")))
    for name in ("threshold", "no_recall", "recall"):
        assert first + 0.02 < row[f"val/auc_{name}"] <= row["val/auc_oracle"] + 1e-9, (name, row, first)
    assert list((tmp_path / "figures").glob("val_tradeoff*.png"))
    # the fitted policies live in the checkpoint: `test` from it needs no refit
    main(["test", "--config", twin_config("ttamer"), "--data.init_args.root", str(tmp_path / "exits"),
          "--trainer.default_root_dir", str(tmp_path / "t"), "--ckpt_path", str(tmp_path / "checkpoints" / "last.ckpt")])


def test_stage_count_mismatch_is_refused(tmp_path, capsys):
    """Policies fitted on a 3-stage network, then `test` on a 4-stage network's tables: one line naming both counts
    and the fix, before any policy runs."""
    write_tables(tmp_path / "exits3")
    write_tables(tmp_path / "exits4", stages=4)
    assert ExitTableData(root=str(tmp_path / "exits4")).stages == 4
    fit_twin("ttamer", tmp_path, "--data.init_args.root", str(tmp_path / "exits3"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["test", "--config", twin_config("ttamer"), "--data.init_args.root", str(tmp_path / "exits4"),
              "--trainer.default_root_dir", str(tmp_path / "t"),
              "--ckpt_path", str(tmp_path / "checkpoints" / "last.ckpt")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "fitted on a 3-stage network" in err and "have 4 stages" in err and "Traceback" not in err
    assert not list((tmp_path / "t").rglob("metrics.csv"))  # nothing scored


def test_real_configs_parse(capsys):
    assert "ExitPolicies" in print_config("configs/ttamer.yaml", capsys)
    out = print_config("configs/ttamer_cascade.yaml", capsys)
    assert "source: cascade" in out and "resnet10t" in out


@pytest.mark.slow
def test_default_tables_come_from_trained_networks(tmp_path):
    dm = ExitTableData(data_dir=str(tmp_path), train_images=256, epochs=1)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.calibration.logits.shape == (5000, 4, 10) and dm.test.logits.shape == (5000, 4, 10)
    assert (dm.calibration.cost > 0).all() and dm.calibration.latency is not None
    assert dm.calibration.correct()[:, -1].float().mean() > 0.3   # trained, not chance (0.1)
