"""The shared pretrained base: perplexity against an independent computation, pretraining learns, the cache is keyed
by its settings and reused, and every entity and isolation model of a run starts from it."""
import json
import math
from types import SimpleNamespace

import pytest
import torch

from lit_iclr.core.errors import CheckpointError, ConfigError
from lit_iclr.model_interactions import InteractionData, InteractionLM
from lit_iclr.model_interactions import base as base_mod
from lit_iclr.model_interactions.base import base_folder, ensure_base, load_base, perplexity, pretrain
from lit_iclr.model_interactions.model import TinyLM
from tests.model_interactions.test_lm import tiny_corpus

KW = {"vocab_size": 12, "max_positions": 8, "d_model": 16, "num_layers": 1, "num_heads": 2}


def counting_blocks(n: int) -> torch.Tensor:
    """Blocks of a deterministic sequence (t + start) mod 12: a learnable corpus."""
    start = torch.arange(n).unsqueeze(1) % 12
    return (start + torch.arange(8)) % 12


def test_perplexity_equals_a_token_by_token_computation():
    torch.manual_seed(0)
    model, ids = TinyLM(**KW).eval(), torch.randint(12, (5, 8))
    nll = []
    with torch.no_grad():
        for b in ids:
            for t in range(1, 8):  # the prefix alone: causal, so the same as the full forward's position t - 1
                logits = model(b[:t].unsqueeze(0))[0, -1]
                nll.append(float(-torch.log_softmax(logits, -1)[b[t]]))
    assert perplexity(model, ids, batch_size=2) == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)


def test_pretraining_learns_the_corpus():
    train = counting_blocks(64)
    fresh = perplexity(TinyLM(**KW).eval(), train)
    model = pretrain(train, KW, steps=150, lr=1e-2, batch_size=16, seed=0)
    assert fresh > 8 and perplexity(model, train) < 1.5  # ~ vocabulary size at init; the next token is determined
    again = pretrain(train, KW, steps=150, lr=1e-2, batch_size=16, seed=0)  # deterministic given the seed
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, again.state_dict()[k])


def test_the_cache_is_keyed_by_settings_and_reused(tmp_path, monkeypatch):
    train, valid = counting_blocks(32), {"a": counting_blocks(4)}
    settings = {"data": ["x"], "model_kw": KW, "steps": 5, "lr": 1e-2, "batch_size": 4, "seed": 0}
    folder = ensure_base(tmp_path, settings, train, valid)
    info = json.loads((folder / "base.json").read_text())
    model = TinyLM(**KW)
    model.load_state_dict(load_base(folder))
    assert info["valid_ppl"]["a"] == pytest.approx(perplexity(model.eval(), valid["a"]))
    monkeypatch.setattr(base_mod, "pretrain", lambda *a, **k: pytest.fail("a cached base was pretrained again"))
    assert ensure_base(tmp_path, settings, train, valid) == folder
    assert base_folder(tmp_path, {**settings, "steps": 6}) != folder  # another setting, another base
    (folder / "base.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"(?s)base\.pt: cannot read the cached base.*delete the folder"):
        load_base(folder)


def test_every_entity_and_the_isolation_arm_start_from_the_base(tmp_path):
    dm = InteractionData(root=str(tiny_corpus(tmp_path / "corpus")), data_dir=str(tmp_path / "data"), seq_len=16,
                         vocab_size=300, eval_sequences=4)
    dm.prepare_data()
    dm.setup()
    model = InteractionLM(300, 2, 16, d_model=16, num_layers=1, num_heads=2, isolation_arm=True, base_steps=20)
    model._trainer = SimpleNamespace(datamodule=dm)  # setup reads the corpus through the trainer's datamodule
    model.setup("fit")
    (folder,) = (tmp_path / "data").glob("model_interactions-base-*")
    info = json.loads((folder / "base.json").read_text())
    assert info["steps"] == 20 and set(info["valid_ppl"]) == {"Mathematics", "History", "Geography"}
    assert info["train_blocks"] == sum(map(len, dm.private)) + len(dm.public)  # every topic's train text
    state = load_base(folder)
    for m in [*model.models, *model.isolated]:
        for k, v in m.state_dict().items():
            torch.testing.assert_close(v, state[k])
    # the base's validation perplexity is that of the loaded weights on each topic's validation blocks
    _, valid, _ = dm.base_corpus()
    assert info["valid_ppl"]["History"] == pytest.approx(perplexity(model.models[0].eval(), valid["History"]))
    with pytest.raises(ConfigError, match="base_steps"):
        InteractionLM(300, 2, hf_models=["a", "b"], base_steps=10)
