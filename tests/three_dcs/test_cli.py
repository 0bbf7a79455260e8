"""The tiny twin through the CLI, the real config parsed, embedding files scored, the QM9 (qm9pack) reader."""
from __future__ import annotations

import math

import numpy as np
import pytest

from lit_iclr.core import DatasetFormatError
from lit_iclr.three_dcs import DistanceHistogram, formats, qm9
from lit_iclr.three_dcs.evaluate import Benchmark, score, score_embedding_files, summarise
from tests.twin import fit_twin, metric_rows, print_config


def test_tiny_twin_fits_and_scores_through_the_cli(tmp_path, tiny_3dcs):
    fit_twin("three_dcs", tmp_path, "--data.init_args.benchmark_root", str(tiny_3dcs))
    rows = metric_rows(tmp_path)
    mae = [float(r["val/mae"]) for r in rows if r.get("val/mae")]
    assert mae and all(math.isfinite(v) for v in mae)
    # learned: the fit's last validation MAE is below the same config's untrained model on the same validation data
    fit_twin("three_dcs", tmp_path / "untrained", "--data.init_args.benchmark_root", str(tiny_3dcs),
             "--data.init_args.data_dir", str(tmp_path / "data"), subcommand="validate")
    untrained = [float(r["val/mae"]) for r in metric_rows(tmp_path / "untrained") if r.get("val/mae")]
    assert untrained and mae[-1] < 0.95 * untrained[-1], (mae[-1], untrained[-1])
    gce = [r for r in rows if r.get("gce/geometry_A1_spearman")]
    assert gce and -1 <= float(gce[-1]["gce/geometry_A1_spearman"]) <= 1
    assert 0 <= float(gce[-1]["gce/energy_ROC_AUC"]) <= 1
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert list((tmp_path / "figures").glob("gce_torsion_scan*.png"))
    # the run's baselines: the fixed histogram's value is what scoring it directly gives; the untrained encoder's
    # differs from the trained one's (it is scored with the weights from before the first step)
    direct = summarise(score(Benchmark.load(tiny_3dcs), DistanceHistogram().embed))["geometry"]["A1_spearman"][0]
    last = gce[-1]
    assert float(last["gce/geometry_A1_spearman/distance_histogram"]) == pytest.approx(direct, rel=1e-6)
    assert float(last["gce/geometry_A1_spearman/untrained"]) != float(last["gce/geometry_A1_spearman"])


def test_real_config_parses(capsys):
    out = print_config("configs/three_dcs.yaml", capsys)
    assert "ConformerEncoder" in out and "QM9Conformers" in out and "metric_version: paper" in out
    assert "extensive" not in out  # linked from the data's target, never written in YAML


def test_scoring_embedding_files_equals_scoring_the_representation(tiny_3dcs, tmp_path):
    rep = DistanceHistogram()
    bench = Benchmark.load(tiny_3dcs)
    for axis, groups in (("rotation", bench.rotation), ("chirality", bench.chirality), ("traj", bench.traj)):
        formats.write_embeddings(tmp_path / f"{axis}.npz", np.concatenate([rep.embed(g.mols) for g in groups]))
    from_files = score_embedding_files(tiny_3dcs, tmp_path)
    direct = summarise(score(bench, rep.embed))
    for axis in ("geometry", "chirality", "energy"):
        for metric, (mean, _, n) in direct[axis].items():
            assert from_files[axis][metric][2] == n
            assert from_files[axis][metric][0] == pytest.approx(mean, nan_ok=True), (axis, metric)
    formats.write_embeddings(tmp_path / "rotation.npz", np.zeros((3, 4)))
    with pytest.raises(DatasetFormatError, match="row order"):
        score_embedding_files(tiny_3dcs, tmp_path)


def test_qm9pack_sample_and_targets(tmp_path):
    qm9.write_subset(tmp_path / "q.csv", 40, seed=0)
    data = qm9.read_qm9_csv(tmp_path / "q.csv")
    assert len(data["z"]) == 40 and all(set(z) <= {1, 6, 7, 8, 9} for z in data["z"])
    assert all(p.shape == (len(z), 3) for z, p in zip(data["z"], data["pos"], strict=True))
    raw = data["InternalEnergy_0K_au"] * qm9.HARTREE_EV
    y = qm9.target_values(data, "U0", np.arange(40))
    assert y.std() < 0.05 * raw.std()  # per-element references carry almost all of U0
    # C-H bond lengths of the DFT geometries
    z, p = data["z"][0], data["pos"][0]
    d = np.linalg.norm(p[:, None] - p[None], axis=-1)
    ch = d[np.ix_(z == 6, z == 1)]
    assert ch.size == 0 or 1.05 < ch.min() < 1.15


def test_qm9_reader_rejects_malformed_rows(tmp_path):
    qm9.write_subset(tmp_path / "q.csv", 5, seed=1)
    text = (tmp_path / "q.csv").read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([text[0].replace("XYZ_Ang", "XYZ"), *text[1:]]))
    with pytest.raises(DatasetFormatError, match="missing columns"):
        qm9.read_qm9_csv(bad)
    import pandas as pd

    df = pd.read_csv(tmp_path / "q.csv")
    df.loc[0, "XYZ_Ang"] = "[[0.0, 0.0, 0.0]]"
    df.to_csv(bad, index=False)
    with pytest.raises(DatasetFormatError, match="N_atoms"):
        qm9.read_qm9_csv(bad)
