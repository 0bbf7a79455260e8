"""The STORM benchmark's own loaders and FLOP count run on the windows' batched reads (`__getitems__`), which the
default collate cannot take (the benchmark crashed on it once the reads were batched)."""

import torch

from tests.benchmark_script import load_benchmark
from tests.storm.test_reader import eight_day_store, make_store


def _benchmark():
    return load_benchmark("storm")


def test_benchmark_loader_gives_the_samples_and_counts_flops(tmp_path):
    bench = _benchmark()
    make_store(n_times=48).to_zarr(tmp_path / "s.zarr", zarr_format=2)
    dm = eight_day_store(tmp_path, batch_size=2, variables=["geopotential@500", "2m_temperature"])
    dm.setup("fit")
    b = next(iter(bench._loader(dm.train_set, batch_size=2)))
    for key in ("x", "y", "lead_steps"):  # the batch equals the two samples read one by one, stacked here
        torch.testing.assert_close(b[key], torch.stack([dm.train_set[0][key], dm.train_set[1][key]]), rtol=0, atol=0)
    m = bench.make_model(dm, hidden=[4, 4, 4])
    assert bench.step_flops(m, dm) > 0
