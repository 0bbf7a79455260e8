"""rMD17 in its published layout (npz_data/ + splits/) read for the energy axis, partial 3DCS downloads scored on the
configs they hold, and the evaluation command's one-line errors. Every file here is written by the test itself."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError
from lit_iclr.three_dcs import DistanceHistogram, formats
from lit_iclr.three_dcs.evaluate import Benchmark, main, score, summarise
from tests.twin import fit_twin, metric_rows

ETHANOL_Z = np.array([6, 6, 8, 1, 1, 1, 1, 1, 1])


def write_rmd17(root, n_frames=60, seed=0):
    """`root/npz_data/rmd17_ethanol.npz` with the release's seven arrays and `root/splits/index_{train,test}_01.csv`
    (one index per line), the geometry an RDKit ethanol conformer plus thermal noise."""
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles("CCO"))
    AllChem.EmbedMolecule(mol, randomSeed=seed)
    x0 = mol.GetConformer().GetPositions()
    z = np.array([a.GetAtomicNum() for a in mol.GetAtoms()])
    rng = np.random.default_rng(seed)
    coords = x0[None] + 0.05 * rng.standard_normal((n_frames, len(z), 3))
    energies = -97000.0 + 10.0 * rng.standard_normal(n_frames)
    forces = rng.standard_normal((n_frames, len(z), 3))
    (root / "npz_data").mkdir(parents=True)
    np.savez(root / "npz_data" / "rmd17_ethanol.npz", nuclear_charges=z, coords=coords, energies=energies, forces=forces,
             old_indices=rng.permutation(10 * n_frames)[:n_frames], old_energies=energies + 1.0, old_forces=forces)
    (root / "splits").mkdir()
    perm = rng.permutation(n_frames)
    np.savetxt(root / "splits" / "index_train_01.csv", perm[: n_frames // 2], fmt="%d")
    np.savetxt(root / "splits" / "index_test_01.csv", perm[n_frames // 2:], fmt="%d")
    return z, coords, energies, perm[n_frames // 2:]


def test_rmd17_trajectory_in_split_order_becomes_one_energy_group(tmp_path):
    z, coords, energies, test_idx = write_rmd17(tmp_path / "rmd17")
    (g,) = formats.read_rmd17(tmp_path / "rmd17", split="test_01", max_frames=25)
    assert g.key == "ethanol" and g.rows == slice(0, 25) and g.extra["time_ordered"] is False
    np.testing.assert_array_equal(g.energies, energies[test_idx[:25]])
    for mol, i in zip(g.mols, test_idx[:25], strict=True):
        assert [a.GetAtomicNum() for a in mol.GetAtoms()] == z.tolist()
        np.testing.assert_allclose(mol.GetConformer().GetPositions(), coords[i])
    assert g.mols[0].GetNumBonds() == 8  # ethanol's bonds, inferred from the distances
    # file order without a split; the npz itself and its npz_data/ folder name the same data
    (whole,) = formats.read_rmd17(tmp_path / "rmd17" / "npz_data" / "rmd17_ethanol.npz")
    np.testing.assert_array_equal(whole.energies, energies)
    np.testing.assert_array_equal(formats.read_rmd17(tmp_path / "rmd17" / "npz_data")[0].energies, energies)


def test_rmd17_bad_split_and_molecule_are_named(tmp_path):
    write_rmd17(tmp_path / "rmd17", n_frames=30)
    (tmp_path / "rmd17" / "splits" / "index_test_02.csv").write_text("3\n40\n")
    with pytest.raises(DatasetFormatError, match=r"index_test_02.csv: indices span 3..40 but the npz has 30 frames"):
        formats.read_rmd17(tmp_path / "rmd17", split="test_02")
    with pytest.raises(DatasetNotFoundError, match="index_test_09.csv: rMD17 split file not found"):
        formats.read_rmd17(tmp_path / "rmd17", split="test_09")
    with pytest.raises(DatasetNotFoundError, match=r"no rmd17_<molecule>.npz for \['aspirin'\] \(found \['ethanol'\]\)"):
        formats.read_rmd17(tmp_path / "rmd17", molecules=["aspirin"])


def copy_configs(src, dst, configs):
    for c in configs:
        shutil.copytree(src / c, dst / c)
    return dst


def test_a_partial_download_is_scored_on_the_configs_it_holds(tiny_3dcs, tmp_path):
    only_chirality = copy_configs(tiny_3dcs, tmp_path / "c", ["chirality"])
    bench = Benchmark.load(only_chirality)
    assert bench.axes() == ("chirality",) and not bench.rotation and not bench.traj
    rep = DistanceHistogram()
    partial = summarise(score(bench, rep.embed))
    full = summarise(score(Benchmark.load(tiny_3dcs), rep.embed))
    assert set(partial) == {"chirality", "enantiomers"}
    assert partial["chirality"]["ES_AUC"][0] == pytest.approx(full["chirality"]["ES_AUC"][0], nan_ok=True)
    # half of the energy pair, or nothing at all: one error naming what is missing and the setting to change
    half = copy_configs(tiny_3dcs, tmp_path / "h", ["rotation", "traj_frames"])
    with pytest.raises(DatasetNotFoundError, match=r"traj_energies: traj_frames/ is here but not traj_energies/"):
        Benchmark.load(half)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match=r"no 3DCS config here[\s\S]*fix: point `benchmark_root` at"):
        Benchmark.load(tmp_path / "empty")
    # rMD17 stands in for the missing energy configs
    write_rmd17(tmp_path / "rmd17", n_frames=30)
    bench = Benchmark.load(half, rmd17=tmp_path / "rmd17")
    assert bench.axes() == ("geometry", "energy") and bench.traj[0].key == "ethanol"


def test_evaluate_scores_rmd17_energy_and_errors_in_one_line(tmp_path, capsys):
    write_rmd17(tmp_path / "rmd17", n_frames=60)
    (g,) = formats.read_rmd17(tmp_path / "rmd17", split="test_01")
    formats.write_embeddings(tmp_path / "emb" / "traj.npz", DistanceHistogram().embed(g.mols))
    assert main(["--rmd17", str(tmp_path / "rmd17"), "--rmd17-split", "test_01", "--embeddings",
                 str(tmp_path / "emb")]) == 0
    out = capsys.readouterr().out
    assert "energy" in out and "| emb |" in out and "geometry" not in out
    assert main(["--root", str(tmp_path / "nothing"), "--embeddings", str(tmp_path / "emb")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and "point `--root` at" in err
    assert len(err.strip().splitlines()) == 2  # the problem and its fix


def test_rmd17_energy_axis_through_the_cli_on_a_chirality_only_download(tiny_3dcs, tmp_path):
    """fit with `benchmark_root` at a download holding only chirality/ and `benchmark_rmd17` at an rMD17 folder: the
    chirality and energy axes are logged, geometry is not (there is none)."""
    write_rmd17(tmp_path / "rmd17", n_frames=40)
    partial = copy_configs(tiny_3dcs, tmp_path / "partial", ["chirality"])
    fit_twin("three_dcs", tmp_path / "run", "--data.init_args.benchmark_root", str(partial),
             "--data.init_args.benchmark_rmd17", str(tmp_path / "rmd17"), "--data.init_args.benchmark_rmd17_split",
             "test_01")
    rows = metric_rows(tmp_path / "run")
    gce = [r for r in rows if r.get("gce/energy_spearman")]
    assert gce and -1 <= float(gce[-1]["gce/energy_spearman"]) <= 1
    assert 0 <= float(gce[-1]["gce/chirality_ES_AUC"]) <= 1
    assert not any(r.get("gce/geometry_A1_spearman") for r in rows)


def test_rmd17_config_parses(capsys):
    from tests.twin import print_config

    out = print_config("configs/three_dcs_rmd17.yaml", capsys)
    assert "benchmark_rmd17: data/rmd17" in out and "benchmark_rmd17_split: test_01" in out
