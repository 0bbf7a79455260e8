"""The configs through the platform CLI: the tiny twin trains and tests; the real configs parse."""
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lit_iclr.cli import main

from .test_data import fake_fashion

ROOT = Path(__file__).resolve().parents[2]


def _last(folder: Path, key: str) -> float:
    metrics = pd.concat(pd.read_csv(f) for f in folder.rglob("metrics.csv"))
    assert key in metrics, key
    return float(metrics[key].dropna().iloc[-1])


def test_image_twin_fits_then_tests_on_corruptions(tmp_path):
    """Small IDX files in the real format stand in for the 60k images (the label is the row of a bright band), so the
    twin runs in seconds; it must beat the same config's untrained model, evaluated here on the same images."""
    (tmp_path / "fm").mkdir()
    fake_fashion(tmp_path / "fm", n_train=96, n_test=32, learnable=True)
    twin = str(ROOT / "tests/configs/namex.yaml")
    data = ["--data.init_args.root", str(tmp_path / "fm")]
    main(["fit", "--config", twin, "--trainer.default_root_dir", str(tmp_path / "fit"), *data, "--trainer.max_epochs",
          "4"])
    ckpt = tmp_path / "fit" / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    main(["test", "--config", twin, "--trainer.default_root_dir", str(tmp_path / "test"), "--ckpt_path", str(ckpt), *data])
    for key in ("test/acc_clean", "test/acc_corrupted", "test/acc/contrast/5", "test/acc/gaussian_noise/5"):
        assert 0.0 <= _last(tmp_path / "test", key) <= 1.0
    # learned: the fit's last validation loss is below the untrained model's on the same validation images
    main(["validate", "--config", twin, "--trainer.default_root_dir", str(tmp_path / "untrained"), *data])
    trained, untrained = _last(tmp_path / "fit", "val/loss"), _last(tmp_path / "untrained", "val/loss")
    assert trained < untrained - 0.05, (trained, untrained)
    assert list((tmp_path / "test").rglob("*robustness*.png")) or list((tmp_path / "test").rglob("events.out*"))


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("namex*.yaml")))
def test_real_configs_parse(config, capsys):
    """Parsed and printed fully resolved (no data is built: --print_config stops before instantiation)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(ROOT / "configs" / config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["init_args"]["merge"]["mode"] == "namex"


TOPICS = ["Arts", "Mathematics", "Geography"]
WORDS = {"Arts": "painting music sculpture theatre poem colour canvas", "Mathematics": "number proof theorem algebra "
         "integral prime equation", "Geography": "river mountain country ocean city coast valley"}


def tiny_corpus(root: Path, docs_per_topic: int = 12) -> None:
    """A corpus folder in the real JSONL format the corpus reader accepts (title, text, topic per line)."""
    import json
    import random

    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", docs_per_topic), ("validation", 4), ("test", 4)):
        with (root / f"{split}.jsonl").open("w") as f:
            for topic in TOPICS:
                for i in range(n):
                    words = WORDS[topic].split()
                    text = " ".join(rng.choice(words) for _ in range(60))
                    f.write(json.dumps({"title": f"{topic} {split} {i}", "text": text, "topic": topic}) + "\n")


@pytest.mark.parametrize("task", ["lm", "topic", "hf"])
def test_text_twins_fit_and_test(tmp_path, task, capsys):
    tiny_corpus(tmp_path / "corpus")
    twin = str(ROOT / f"tests/configs/namex_{task}.yaml")
    data = ["--data.init_args.root", str(tmp_path / "corpus"), "--data.init_args.data_dir", str(tmp_path / "data")]
    longer = ["--trainer.max_epochs", "4"] if task == "topic" else ["--trainer.max_steps", "12"]  # enough to learn
    main(["fit", "--config", twin, "--trainer.default_root_dir", str(tmp_path / "fit"), *data, *longer])
    if task == "hf":  # the memory plan is printed before the first step, for the chain state the run uses
        out = capsys.readouterr().out
        assert "memory plan: qwen2_moe" in out and "chain state coefficients" in out and "| bank grads |" in out
    ckpt = tmp_path / "fit" / "checkpoints" / "last.ckpt"
    main(["test", "--config", twin, "--trainer.default_root_dir", str(tmp_path / "test"), "--ckpt_path", str(ckpt),
          *data])
    # the same config untrained (no checkpoint), tested on the same split: the fit must beat it
    main(["test", "--config", twin, "--trainer.default_root_dir", str(tmp_path / "untrained"), *data])
    if task in ("lm", "hf"):
        trained, untrained = _last(tmp_path / "test", "test/ppl"), _last(tmp_path / "untrained", "test/ppl")
        assert 1.0 < trained < 0.95 * untrained, (trained, untrained)
    else:
        assert 0.0 <= _last(tmp_path / "test", "test/acc") <= 1.0
        trained, untrained = _last(tmp_path / "test", "test/loss"), _last(tmp_path / "untrained", "test/loss")
        assert trained < untrained - 0.02, (trained, untrained)
