"""Entity LMs, the pool format, the (alpha, beta) mix and the twin config through the CLI (fit, resume)."""
import json
import random
from pathlib import Path

import pytest
import torch

from lit_iclr.cli import main
from lit_iclr.core.errors import ConfigError, DatasetFormatError
from lit_iclr.model_interactions.data import InteractionData, read_pool, write_pool
from lit_iclr.model_interactions.model import TinyLM
from tests.twin import print_config, twin_config

WORDS = {"Mathematics": "number proof theorem algebra integral prime equation",
         "History": "empire war king treaty revolution dynasty century",
         "Geography": "river mountain country ocean city coast valley"}


def tiny_corpus(root: Path) -> Path:
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 10), ("validation", 3)):
        with (root / f"{split}.jsonl").open("w") as f:
            for topic, words in WORDS.items():
                for i in range(n):
                    text = " ".join(rng.choice(words.split()) for _ in range(60))
                    f.write(json.dumps({"title": f"{topic} {i}", "text": text, "topic": topic}) + "\n")
    return root


def test_causal_and_sampling():
    torch.manual_seed(0)
    m = TinyLM(50, 16, 16, 1, 2).eval()
    ids = torch.randint(50, (2, 10))
    ids2 = ids.clone()
    ids2[:, 6:] = (ids2[:, 6:] + 1) % 50
    torch.testing.assert_close(m(ids)[:, :6], m(ids2)[:, :6])  # future tokens do not change past logits
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    s = m.sample(4, 8, 0, generator=g1)
    assert s.shape == (4, 8) and torch.equal(s, m.sample(4, 8, 0, generator=g2))


def test_pool_roundtrip_and_malformed(tmp_path):
    rows = [{"text": "a b", "task": "Mathematics", "source_model": 0, "generation": 2}]
    write_pool(tmp_path / "gen_2.jsonl", rows)
    assert read_pool(tmp_path / "gen_2.jsonl") == rows
    (tmp_path / "bad.jsonl").write_text('{"text": "x", "task": "t"}\n')
    with pytest.raises(DatasetFormatError, match="source_model"):
        read_pool(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text("not json\n")
    with pytest.raises(DatasetFormatError, match="line 1"):
        read_pool(tmp_path / "bad2.jsonl")


def test_mix_composition(tmp_path):
    dm = InteractionData(root=str(tiny_corpus(tmp_path / "c")), data_dir=str(tmp_path / "d"), alpha=0.5, beta=0.5,
                         sequences_per_generation=8, seq_len=8, vocab_size=300, eval_sequences=2,
                         pool_dir=str(tmp_path / "pool"))
    dm.setup()
    tok = dm.tokenizer
    write_pool(tmp_path / "pool" / "gen_0.jsonl",
               [{"text": "zzz qqq " * 10, "task": "Mathematics", "source_model": j, "generation": 0} for j in range(2)])
    syn = set(tok.encode("zzz qqq zzz", add_special_tokens=False).ids)
    mix = dm.mix(1)
    assert mix.shape == (2, 8, 8)
    # 2 synthetic blocks from each model (alpha n / K = 2) at the end of each entity's mix; 2 private, 2 public first
    for k in range(2):
        assert all(set(b.tolist()) <= syn | {0} for b in mix[k, 4:])
        assert not any(set(b.tolist()) <= syn | {0} for b in mix[k, :4])
    torch.testing.assert_close(mix, dm.mix(1))           # the same draw when rebuilt (resume)
    assert dm.mix(0).shape == (2, 8, 8)                  # generation 0: real only, no pool needed
    with pytest.raises(DatasetFormatError, match="Astronomy"):
        InteractionData(root=str(tmp_path / "c"), data_dir=str(tmp_path / "d"), topics=["Astronomy"]).setup()


def test_mix_pool_sources(tmp_path):
    """'all': entity k scrapes n_syn blocks from every model; 'own' (control): all K n_syn from its own model."""
    corpus = tiny_corpus(tmp_path / "c")
    words = ["zzz qqq ", "vvv xxx "]
    for sources in ("all", "own"):
        dm = InteractionData(root=str(corpus), data_dir=str(tmp_path / "d"), alpha=0.5, beta=0.5, sequences_per_generation=8,
                             seq_len=8, vocab_size=300, eval_sequences=2, pool_dir=str(tmp_path / "pool"),
                             pool_sources=sources)
        dm.setup()
        write_pool(tmp_path / "pool" / "gen_0.jsonl",
                   [{"text": words[j] * 10, "task": "t", "source_model": j, "generation": 0} for j in range(2)])
        ids = [set(dm.tokenizer.encode(w * 3, add_special_tokens=False).ids) for w in words]
        mix = dm.mix(1)
        for k in range(2):
            src = [next(j for j in range(2) if set(b.tolist()) <= ids[j] | {0}) for b in mix[k, 4:]]
            assert src == ([k] * 4 if sources == "own" else [0, 0, 1, 1])
        assert dm.mix(0).shape == (2, 8, 8)  # generation 0: real only, no pool read
    with pytest.raises(ConfigError, match="pool_sources"):
        InteractionData(pool_sources="mine")


def _fit(tmp_path, run, *extra):
    corpus = tiny_corpus(tmp_path / "corpus")
    main(["fit", "--config", twin_config("model_interactions"), "--trainer.default_root_dir", str(tmp_path / run),
          "--data.init_args.root", str(corpus), "--data.init_args.data_dir", str(tmp_path / "data"), *extra])
    return tmp_path / run


def test_twin_fits_publishes_and_resumes(tmp_path):
    full = _fit(tmp_path, "full")
    pools = sorted((full / "pool").glob("gen_*.jsonl"))
    assert [p.name for p in pools] == ["gen_0.jsonl", "gen_1.jsonl", "gen_2.jsonl"]
    rows = read_pool(pools[1])
    assert len(rows) == 16 and {r["source_model"] for r in rows} == {0, 1} and {r["generation"] for r in rows} == {1}
    hist = [json.loads(x) for f in full.rglob("interactions.jsonl") for x in f.read_text().splitlines()]
    assert [h["generation"] for h in hist] == [0, 1, 2]
    assert all(1 < h["own_ppl"] < 300 * 3 and h["js"] >= 0 and 0 <= h["cka"] <= 1 + 1e-6 for h in hist)
    # stop after generation 1, resume from last.ckpt: same weights as the uninterrupted run
    part = _fit(tmp_path, "part", "--trainer.max_epochs", "2")
    ckpt = part / "checkpoints" / "last.ckpt"
    _fit(tmp_path, "part", "--ckpt_path", str(ckpt))
    a = torch.load(full / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(ckpt, weights_only=True)["state_dict"]
    for key in a:
        torch.testing.assert_close(a[key], b[key])


def test_isolation_arm_equals_a_separate_real_only_run(tmp_path, capsys):
    """The headline's baseline, computed in the run, against an independent run: alpha = 0, no isolation arm."""
    both = _fit(tmp_path, "both")
    assert "headline: val/cross_ppl" in capsys.readouterr().out
    alone = _fit(tmp_path, "alone", "--data.init_args.alpha", "0.0", "--data.init_args.isolation_arm", "false")
    hist = [json.loads(x) for x in next(both.rglob("interactions.jsonl")).read_text().splitlines()]
    ref = [json.loads(x) for x in next(alone.rglob("interactions.jsonl")).read_text().splitlines()]
    assert len(hist) == len(ref) == 3 and all("isolation" not in r for r in ref)
    for h, r in zip(hist, ref, strict=True):
        for key in ("own_ppl", "cross_ppl", "public_ppl", "js"):
            assert abs(h["isolation"][key] - r[key]) <= 1e-4 * abs(r[key]), (h["generation"], key)
    # and the interacting arm is not the isolation arm (alpha 0.5 reads the pool from generation 1 on)
    assert hist[0]["cross_ppl"] == pytest.approx(hist[0]["isolation"]["cross_ppl"], rel=1e-5)
    assert abs(hist[2]["cross_ppl"] - hist[2]["isolation"]["cross_ppl"]) > 1e-3
    a = torch.load(both / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(alone / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for key in b:
        torch.testing.assert_close(a[key.replace("models.", "isolated.", 1)], b[key], rtol=1e-4, atol=1e-5)


def test_real_config_parses(capsys):
    out = print_config("configs/model_interactions.yaml", capsys)
    assert "InteractionLM" in out and "alpha: 0.5" in out


def test_base_config_parses(capsys):
    out = print_config("configs/model_interactions_base.yaml", capsys)
    assert "base_steps: 2000" in out and "lr: 0.001" in out
