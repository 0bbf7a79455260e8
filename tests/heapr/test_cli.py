"""The tiny twin config through the real CLI, the real config parsed, checkpoints of the pruned model restored."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_iclr.cli import LitIclrCLI, main
from lit_iclr.core.moe import check_moe, load_compact
from lit_iclr.heapr import HEAPrLM

from .helpers import write_corpus

ROOT = Path(__file__).resolve().parents[2]


def test_twin_fit_prunes_exports_and_reloads(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    main(["fit", "--config", str(ROOT / "tests/configs/heapr.yaml"), "--trainer.default_root_dir", str(run),
          "--data.init_args.root", str(corpus), "--data.init_args.data_dir", str(tmp_path / "data")])
    report = json.loads((run / "heapr_report.json").read_text())
    assert report["report"]["method"] == "heapr"
    assert report["report"]["atoms_pruned"] == round(0.25 * 2 * 4 * 16)
    # the fit learned: the trained model's test perplexity is below the same config's untrained model's, evaluated here
    untrained = _untrained_test_ppl(tmp_path, corpus)
    assert report["dense"]["test_ppl"] < 0.9 * untrained, (report["dense"]["test_ppl"], untrained)
    assert report["pruned"]["test_ppl"] < untrained
    assert report["report"]["params_after"] < report["report"]["params_before"]
    # the Lightning checkpoint restores the per-expert widths
    model = HEAPrLM.load_from_checkpoint(run / "checkpoints" / "pruned.ckpt", weights_only=False)
    widths = {b.name: b.widths() for b in check_moe(model.model)}
    assert widths == report["report"]["widths"]
    # compact and HF exports give the same logits as the restored module
    ids = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        ref = model.model.eval()(input_ids=ids).logits
        compact = load_compact(run / "pruned_compact")
        torch.testing.assert_close(compact(input_ids=ids).logits, ref)
        hf = AutoModelForCausalLM.from_pretrained(run / "pruned_hf", trust_remote_code=False).eval()
        torch.testing.assert_close(hf(input_ids=ids).logits, ref, atol=1e-5, rtol=1e-5)
    # `test` on the pruned checkpoint evaluates it without pruning again
    main(["test", "--config", str(ROOT / "tests/configs/heapr.yaml"), "--trainer.default_root_dir", str(tmp_path / "t"),
          "--data.init_args.root", str(corpus), "--data.init_args.data_dir", str(tmp_path / "data"),
          "--ckpt_path", str(run / "checkpoints" / "pruned.ckpt")])


def _untrained_test_ppl(tmp_path, corpus) -> float:
    """Test perplexity of the twin's model at initialisation (same seed, same data), by the shared evaluator."""
    from lit_iclr.heapr.evaluate import perplexity

    cli = LitIclrCLI(args=["--config", str(ROOT / "tests/configs/heapr.yaml"), "--data.init_args.root", str(corpus),
                           "--data.init_args.data_dir", str(tmp_path / "data")], run=False)
    cli.model.configure_model()
    cli.datamodule.prepare_data()
    cli.datamodule.setup("test")
    return perplexity(cli.model.model.eval(), cli.datamodule.test_dataloader())


@pytest.mark.parametrize(("config", "arch", "shared"), [("heapr", "mixtral", 0), ("heapr_qwen2_shared", "qwen2_moe", 96)])
def test_real_configs_parse(config, arch, shared):
    cli = LitIclrCLI(args=["--config", str(ROOT / f"configs/{config}.yaml")], run=False)
    assert isinstance(cli.model, HEAPrLM) and cli.model.hparams.prune_ratio == 0.25
    assert cli.model.hparams.vocab_size == cli.datamodule.vocab_size == 2048
    # the default is the testbed whose routed experts are every MLP (no shared expert to carry the model)
    assert (cli.model.hparams.arch, cli.model.hparams.shared_width) == (arch, shared)


@pytest.mark.parametrize("ratio", ["1.0", "0", "-0.1"])
def test_bad_prune_ratio_is_a_clear_error(tmp_path, ratio, capsys):
    if ratio == "0":  # 0 means "do not prune": accepted
        HEAPrLM(prune_ratio=0.0)
        return
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(ROOT / "tests/configs/heapr.yaml"), "--model.init_args.prune_ratio", ratio,
              "--trainer.default_root_dir", str(tmp_path)])
    assert "prune ratio must be strictly between 0 and 1" in capsys.readouterr().err


def test_test_subcommand_prunes_a_dense_checkpoint(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    args = ["--config", str(ROOT / "tests/configs/heapr.yaml"), "--data.init_args.root", str(corpus),
            "--data.init_args.data_dir", str(tmp_path / "data")]
    main(["fit", *args, "--trainer.default_root_dir", str(tmp_path / "run"), "--model.init_args.prune_at_fit_end",
          "false"])
    assert not (tmp_path / "run" / "heapr_report.json").exists()
    main(["test", *args, "--trainer.default_root_dir", str(tmp_path / "t"), "--ckpt_path",
          str(tmp_path / "run" / "checkpoints" / "last.ckpt")])
    metrics = (tmp_path / "t" / "metrics.csv").read_text()
    assert "test/achieved_ratio" in metrics and "0.25" in metrics


def test_a_seq_len_without_room_for_the_topic_evaluation_is_refused_before_training(tmp_path, capsys):
    """The zero-shot topic evaluation after pruning needs EOS + "Topic: <name>" + 8 document tokens in seq_len: with
    less, the run trained and then failed in on_fit_end ("seq_len=... leaves no room"); now it is refused at the start."""
    from lit_iclr.core.corpus import topic_line
    from lit_iclr.core.tokenizer import encode_batch, load_tokenizer

    corpus = write_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(ROOT / "tests/configs/heapr.yaml"), "--trainer.default_root_dir", str(run),
              "--data.init_args.root", str(corpus), "--data.init_args.data_dir", str(tmp_path / "data"),
              "--data.init_args.seq_len", "12"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "data.init_args.seq_len=12 leaves no room" in err and "topic_eval: false" in err
    # the numbers, from the corpus' own tokenizer: EOS + the longest topic line + 8 tokens
    (cache,) = (tmp_path / "data").glob("*/tokenizer.json")
    longest = max(len(x) for x in encode_batch(load_tokenizer(cache), [topic_line(t) for t in ("Animals", "Music", "Space")]))
    assert f"needs seq_len >= {1 + longest + 8}" in err
    assert not (run / "checkpoints").exists()  # nothing was trained
