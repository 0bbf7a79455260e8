"""The best fixed-rank opening baseline against a brute-force walk of a hand-made bigram target."""
from __future__ import annotations

import torch

from lit_iclr.juli.api import TopKLogprobAPI
from lit_iclr.juli.batching import ChatBatch
from lit_iclr.juli.harness import fixed_rank_violations

from .tiny import TableLM, WordTokenizer

# tokens: 0 pad, 1 eos, 2 "no", 3..5 openings a b c, 6..8 secrets x y z; 9, 10 prompt tokens P, Q
WORDS = {1: "", 2: "no", 3: "a", 4: "b", 5: "c", 6: "x", 7: "y", 8: "z", 9: "P", 10: "Q"}
# next-token log-probabilities given the last token (a bigram table, rows sorted by hand)
NEXT = {9: [2, 3, 4, 5], 10: [2, 5, 3, 4],  # prompt P ranks a 2nd, b 3rd; prompt Q ranks c 2nd, a 3rd
        2: [1], 3: [6, 1], 4: [7, 1], 5: [1, 8], 6: [1], 7: [1], 8: [1]}


def Bigram() -> TableLM:  # noqa: N802
    table = torch.full((11, 11), -30.0)
    for prev, order in NEXT.items():
        for rank, tok in enumerate(order):
            table[prev, tok] = -1.0 - rank
    return TableLM(table)


def Tok() -> WordTokenizer:  # noqa: N802
    return WordTokenizer(WORDS)


def brute_force(prompt: int, rank: int, steps: int) -> list[int]:
    """The rank-`rank` token of the table at the first step, then the top one, until eos."""
    out, last = [], prompt
    for t in range(steps):
        order = NEXT[last]
        tok = order[min(rank, 5) - 1] if t == 0 and rank <= len(order) else order[0]
        if t == 0 and rank > len(order):  # beyond the table's listed tokens come the -30 ones, lowest id first
            tok = sorted(set(range(11)) - set(order))[rank - len(order) - 1]
        out.append(tok)
        if tok == 1:
            break
        last = tok
    return out


def test_best_fixed_rank_equals_brute_force_on_a_hand_case():
    model = Bigram()
    prompts = ChatBatch(torch.tensor([[9], [10]]), torch.ones(2, 1, dtype=torch.long), 1,
                        torch.zeros(2, 0, dtype=torch.bool))
    secrets = ["x", "z"]
    for k in (1, 2, 3, 4):
        api = TopKLogprobAPI(model, eos_id=1, pad_id=0, k=k)
        got = fixed_rank_violations(api, Tok(), prompts, secrets, max_new_tokens=4)
        rates = []
        for r in range(1, k + 1):
            texts = [" ".join(WORDS[t] for t in brute_force(p, r, 4) if WORDS[t]) for p in (9, 10)]
            rates.append(sum(s in t for t, s in zip(texts, secrets, strict=True)) / 2)
            if r > 1:
                assert got[f"fixed_rank_r{r}"] == rates[-1]
        assert got["violation/fixed_rank_best"] == max(rates)
        assert got["fixed_rank_best_r"] == rates.index(max(rates)) + 1
    # by hand: rank 2 opens P with a (-> x, a violation) and Q with c (-> eos): 0.5; rank 3: P with b (-> y),
    # Q with a (-> x, not Q's secret z): 0; rank 4 opens Q with b: 0. No fixed rank reveals both secrets.
    api = TopKLogprobAPI(model, eos_id=1, pad_id=0, k=4)
    got = fixed_rank_violations(api, Tok(), prompts, secrets, max_new_tokens=4)
    assert (got["fixed_rank_r2"], got["fixed_rank_r3"], got["fixed_rank_r4"]) == (0.5, 0.0, 0.0)
    assert got["violation/fixed_rank_best"] == 0.5 and got["fixed_rank_best_r"] == 2
