"""The configs through the platform CLI: fit the tiny twins, test with pruning, prune a checkpoint to disk."""
import itertools
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from lit_iclr.aire_prune import aire
from lit_iclr.aire_prune.module import AIREPruneClassifier
from lit_iclr.aire_prune.prune import load_pruned, prune_checkpoint, save_pruned
from lit_iclr.aire_prune.prune import main as prune_main
from lit_iclr.cli import main
from lit_iclr.core import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("aire_prune*.yaml")), ids=lambda p: p.name)
def test_real_configs_parse(config, capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(config), "--print_config"])
    assert e.value.code == 0
    printed = capsys.readouterr().out
    assert "AIREPruneClassifier" in printed and "prune_ratio: 0.0" in printed


def _fit(config: str, tmp_path: Path, name: str):
    run = tmp_path / name
    cli = main(["fit", "--config", str(ROOT / "tests/configs" / config), "--trainer.default_root_dir", str(run),
                "--data.init_args.data_dir", str(tmp_path / "data")])
    ckpt = run / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    return cli, ckpt


@torch.no_grad()
def _nll(net, batches) -> float:
    """Mean cross-entropy of `net` on `batches` (computed here, independently of the module's metrics)."""
    net.eval()
    return float(torch.cat([F.cross_entropy(net(b["x"]), b["y"], reduction="none") for b in batches]).mean())


def test_fit_then_test_with_pruning_slices_the_model(tmp_path):
    cli, ckpt = _fit("aire_prune.yaml", tmp_path, "fit")
    sizes = cli.model.model.state_counts()
    test = main(["test", "--config", str(ROOT / "tests/configs/aire_prune.yaml"), "--ckpt_path", str(ckpt),
                 "--trainer.default_root_dir", str(tmp_path / "test"), "--model.init_args.prune_ratio", "0.5"])
    kept = test.model.model.state_counts()
    assert sum(kept) == sum(sizes) // 2 and test.model.prune_plan.method == "aire"
    metrics = test.trainer.callback_metrics
    assert metrics["test/pruned_fraction"] == pytest.approx(0.5)
    # same accuracy as pruning the trained weights by hand and evaluating them
    module = AIREPruneClassifier.load_from_checkpoint(ckpt, weights_only=False)
    # the fit learned: the trained model's test loss is below that of the same architecture at initialisation
    L.seed_everything(0)
    untrained = AIREPruneClassifier(**module.hparams).model
    batches = list(itertools.islice(test.datamodule.test_dataloader(), 3))
    trained_nll, untrained_nll = _nll(module.model, batches), _nll(untrained, batches)
    assert trained_nll < untrained_nll - 0.1, (trained_nll, untrained_nll)
    smaller, _ = aire.prune(module.model, 0.5)
    dm = test.datamodule
    correct = total = 0
    with torch.no_grad():
        for i, b in enumerate(dm.test_dataloader()):
            if i == 3:  # limit_test_batches
                break
            correct += int((smaller.eval()(b["x"]).argmax(-1) == b["y"]).sum())
            total += len(b["y"])
    assert float(metrics["test/acc"]) == pytest.approx(correct / total, abs=1e-6)


def test_every_test_of_an_unpruned_model_scores_aire_and_its_baselines_at_the_headline_ratio(tmp_path, capsys):
    cli, ckpt = _fit("aire_prune.yaml", tmp_path, "fit")
    assert "val/pruned_acc/aire" in cli.trainer.logged_metrics  # the fit's own validation scores the pruned copies
    test = main(["test", "--config", str(ROOT / "tests/configs/aire_prune.yaml"), "--ckpt_path", str(ckpt),
                 "--trainer.default_root_dir", str(tmp_path / "test")])
    metrics = test.trainer.callback_metrics
    assert test.model.model.state_counts() == cli.model.model.state_counts()  # the model itself stays whole
    module = AIREPruneClassifier.load_from_checkpoint(ckpt, weights_only=False)
    batches = [b for _, b in zip(range(3), test.datamodule.test_dataloader(), strict=False)]  # limit_test_batches
    total = sum(len(b["y"]) for b in batches)
    for method in ("aire", "last", "modal", "random"):
        smaller, plan = aire.prune(module.model, 0.7, method)
        assert plan.pruned_fraction > 0.5
        with torch.no_grad():
            correct = sum(int((smaller.eval()(b["x"]).argmax(-1) == b["y"]).sum()) for b in batches)
        assert float(metrics[f"test/pruned_acc/{method}"]) == pytest.approx(correct / total, abs=1e-6), method
    out = capsys.readouterr().out
    assert "headline: test/pruned_acc/aire" in out and "LAST at 70%" in out and "unpruned" in out


def test_prune_checkpoint_writes_a_smaller_model_that_reloads(tmp_path):
    cli, ckpt = _fit("aire_prune_listops.yaml", tmp_path, "fit")
    out = tmp_path / "pruned"
    prune_main([str(ckpt), "--ratio", "0.6", "--method", "aire", "--out", str(out)])
    assert (out / "config.json").is_file() and len(list(out.glob("layer_*.safetensors"))) == 2
    reloaded = load_pruned(out)
    module = AIREPruneClassifier.load_from_checkpoint(ckpt, weights_only=False).eval()
    in_memory, p = aire.prune(module.model, 0.6)
    assert reloaded.state_counts() == in_memory.state_counts() == p.kept_counts
    assert sum(reloaded.state_counts()) == int(0.4 * sum(p.sizes) + 1e-9)
    b = next(iter(cli.datamodule.test_dataloader()))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(b["x"], b["x_mask"]), in_memory.eval()(b["x"], b["x_mask"]))
    # the sliced layers hold fewer parameters on disk too
    assert sum(t.numel() for t in reloaded.parameters()) < sum(t.numel() for t in module.model.parameters())
    # an in-memory save round-trips as well
    save_pruned(in_memory, tmp_path / "again")
    torch.testing.assert_close(load_pruned(tmp_path / "again")(b["x"], b["x_mask"]), reloaded(b["x"], b["x_mask"]))


def test_prune_checkpoint_errors_are_clear(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        prune_checkpoint(tmp_path / "missing.ckpt", tmp_path / "out", 0.5)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be read"):
        prune_checkpoint(bad, tmp_path / "out", 0.5)
    with pytest.raises(CheckpointError, match="config.json"):
        load_pruned(tmp_path)
