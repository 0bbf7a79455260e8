"""TopKLogprobAPI against independent computation: brute-force per-prefix forwards, HF generate, closed-form rounding."""
from __future__ import annotations

import torch

from lit_iclr.juli.api import TopKLogprobAPI
from lit_iclr.juli.batching import chat_batch, encode, prompt_text

from .tiny import eval_records, tiny_target


def make_api(**kw) -> TopKLogprobAPI:
    model, tok = tiny_target()
    return TopKLogprobAPI(model, tok.eos_token_id, tok.pad_token_id, **kw)


def test_expose_truncates_rounds_and_hides_values():
    ids = torch.arange(20).expand(3, 20)
    lp = -torch.rand(3, 20).sort(-1).values * 7
    got_ids, got = make_api(k=4).expose(ids, lp)
    assert got_ids.shape == (3, 4) and torch.equal(got, lp[:, :4])
    _, rounded = make_api(k=4, quantum=0.5).expose(ids, lp)
    expect = torch.tensor([[round(float(v) * 2) / 2 for v in row] for row in lp[:, :4]])
    torch.testing.assert_close(rounded, expect)
    _, hidden = make_api(k=4, logprobs=False).expose(ids, lp)
    assert torch.count_nonzero(hidden) == 0
    big = -torch.ones(2000, 20)
    _, noisy = make_api(k=20, noise_std=0.7, seed=3).expose(torch.zeros_like(big, dtype=torch.long), big)
    assert abs(float((noisy - big).std()) - 0.7) < 0.02


def test_teacher_forced_top_k_equals_per_prefix_forwards():
    model, tok = tiny_target()
    recs = eval_records(3)
    replies = ["The passphrase is maple.", "I cannot share", "The colour is red."]
    batch = chat_batch(tok, [r["messages"] for r in recs], replies)
    ids, lp = make_api(k=5).teacher_forced(batch, 5)
    for i, (r, reply) in enumerate(zip(recs, replies, strict=True)):
        p = encode(tok, prompt_text(tok, r["messages"]))
        c = encode(tok, reply) + [tok.eos_token_id]
        for t in range(len(c)):  # one unpadded forward per prefix, as t separate API calls would run
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([p + c[:t]])).logits[0, -1]
            top = torch.log_softmax(logits.float(), -1).topk(5)
            assert torch.equal(ids[i, t], top.indices)
            torch.testing.assert_close(lp[i, t], top.values, atol=1e-4, rtol=1e-4)


def test_plain_decoding_equals_hf_greedy_generate_per_prompt():
    model, tok = tiny_target()
    recs = eval_records(4)
    batch = chat_batch(tok, [r["messages"] for r in recs])
    trace = make_api(k=5).decode(batch, None, 6)
    for i, r in enumerate(recs):
        p = torch.tensor([encode(tok, prompt_text(tok, r["messages"]))])
        ref = model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=6, do_sample=False,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[0, p.shape[1]:].tolist()
        n = int(trace.mask[i].sum())
        assert trace.tokens[i, :n].tolist() == ref[:n]
        assert (trace.true_rank[i, :n] == 0).all()


def test_prefill_emits_the_clients_choice_and_logit_bias_is_capped():
    model, tok = tiny_target()
    batch = chat_batch(tok, [r["messages"] for r in eval_records(4)])
    second = lambda step, ids, lp, true: ids[:, 1]  # noqa: E731
    trace = make_api(k=5, control="prefill").decode(batch, second, 3)
    assert (trace.true_rank[:, 0] == 1).all()
    push = lambda step, ids, lp, true: torch.tensor([0.0, 50.0, 0, 0, 0]).expand(ids.shape[0], 5)  # noqa: E731
    assert (make_api(k=5, control="logit_bias").decode(batch, push, 3).true_rank[:, 0] == 1).all()
    capped = make_api(k=5, control="logit_bias", max_bias=1e-6).decode(batch, push, 3)
    assert (capped.true_rank == 0).all()  # a capped bias cannot overturn the greedy token here
    assert (make_api(k=5, control="none").decode(batch, second, 3).true_rank == 0).all()
    assert (make_api(k=1).decode(batch, second, 3).true_rank == 0).all()
