"""The configs through the platform CLI: the tiny twin trains and tests; the real configs parse."""
from pathlib import Path

import pandas as pd
import pytest

from lit_iclr.cli import LitIclrCLI, main

from .test_data import fake_fashion

ROOT = Path(__file__).resolve().parents[2]


def test_image_twin_fits_then_tests_on_corruptions(tmp_path):
    """Small IDX files in the real format stand in for the 60k images, so the twin runs in seconds."""
    (tmp_path / "fm").mkdir()
    fake_fashion(tmp_path / "fm", n_train=96, n_test=32)
    twin = str(ROOT / "tests/configs/namex.yaml")
    data = ["--data.init_args.root", str(tmp_path / "fm")]
    main(["fit", "--config", twin, "--trainer.default_root_dir", str(tmp_path), *data])
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    main(["test", "--config", twin, "--trainer.default_root_dir", str(tmp_path / "test"), "--ckpt_path", str(ckpt), *data])
    metrics = pd.concat(pd.read_csv(f) for f in (tmp_path / "test").rglob("metrics.csv"))
    for key in ("test/acc_clean", "test/acc_corrupted", "test/acc/contrast/5", "test/acc/gaussian_noise/5"):
        assert key in metrics and 0.0 <= metrics[key].dropna().iloc[-1] <= 1.0
    assert list((tmp_path / "test").rglob("*robustness*.png")) or list((tmp_path / "test").rglob("events.out*"))


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("namex*.yaml")))
def test_real_configs_parse(config):
    cli = LitIclrCLI(args=["--config", str(ROOT / "configs" / config)], run=False)
    assert cli.model.merge.mode in ("dense", "smoe", "smear", "camex", "ep_camex", "namex")
