"""Readers given damaged or foreign files: one `DatasetFormatError` naming the file, the problem and the fix."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from lit_iclr.core.errors import DatasetFormatError
from lit_iclr.core.idx import load_fashion_mnist


def _idx(path, array: np.ndarray, code: int = 0x08) -> None:
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", s) for s in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_idx_labels_out_of_range(tmp_path):
    _idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((3, 28, 28)))
    _idx(tmp_path / "train-labels-idx1-ubyte.gz", np.array([1, 12, 3]))
    with pytest.raises(DatasetFormatError, match=r"train-labels-idx1-ubyte.gz: label 12 at index 1 is outside 0..9"):
        load_fashion_mnist(tmp_path, "train")


def test_binary_listops_file(tmp_path):
    from lit_iclr.aire_prune.listops import read_listops_tsv

    f = tmp_path / "basic_train.tsv"
    with gzip.open(f, "wb") as g:  # a gzipped tsv passed as is
        g.write(b"Source\tTarget\n( [MAX 1 2 ] )\t2\n" * 50)
    with pytest.raises(DatasetFormatError, match="is a binary file, not a ListOps tsv"):
        read_listops_tsv(f)
    f.write_bytes(b"Source\tTarget\n\xff\xfe( [MAX 1 ] )\t1\n")
    with pytest.raises(DatasetFormatError, match="is not UTF-8 text"):
        read_listops_tsv(f)


def test_truncated_npz(tmp_path):
    from lit_iclr.core.offline_rl import read_ogbench_npz

    f = tmp_path / "cube-single-play-v0.npz"
    rng = np.random.default_rng(0)
    np.savez_compressed(f, observations=rng.normal(size=(200, 4)), actions=rng.uniform(-1, 1, (200, 2)),
                        terminals=np.repeat([0, 1], [199, 1]), rewards=np.zeros(200))
    assert len(read_ogbench_npz(f)["observations"]) == 199  # the intact file reads
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(DatasetFormatError, match=r"cube-single-play-v0.npz: not a readable .npz file"):
        read_ogbench_npz(f)


def test_reference_scores_min_equal_max_are_refused():
    from lit_iclr.core.offline_rl import check_reference_scores, d4rl_normalized_score

    assert d4rl_normalized_score(np.array([5.0]), 0.0, 10.0).tolist() == [50.0]
    with pytest.raises(DatasetFormatError, match="min=3.0, max=3.0 leave the normalised score"):
        d4rl_normalized_score(np.array([5.0]), 3.0, 3.0)  # was -inf/inf/nan
    with pytest.raises(DatasetFormatError, match="hopper.hdf5"):
        check_reference_scores("hopper.hdf5", 1.0, 1.0)
    check_reference_scores("x", None, 2.0)  # unknown references: raw returns are used


def test_physionet_cache_goes_to_data_dir_cache_not_the_users_folder(tmp_path):
    from lit_iclr.reimts.data import PhysioNet2012

    real = tmp_path / "physionet"  # the user's (writable) data folder
    real.mkdir()
    dm = PhysioNet2012(root=str(real), data_dir=str(tmp_path / "data"))
    assert dm.cache_dir() == tmp_path / "data" / "cache"
