"""The `capital_ranked` world: the wanted opening's rank varies per request, so no fixed rank-r opening reaches every
request while a client reading the values can; the best fixed rank is the best of them there."""
from __future__ import annotations

import random
import re
from collections import Counter, defaultdict

import pytest
import torch

from lit_iclr.juli import chats
from lit_iclr.juli.api import TopKLogprobAPI
from lit_iclr.juli.batching import ChatBatch
from lit_iclr.juli.harness import fixed_rank_violations, texts_of

from .tiny import TableLM, WordTokenizer

WORLD = chats.world_of("capital_ranked")


def country_of(record: dict) -> str:
    return re.match(r"The capital of (.+?) is ", record["messages"][0]["content"]).group(1)


def test_base_replies_put_the_wanted_opening_at_a_country_dependent_rank():
    """Independent count: draw the base model's training replies to guarded requests and rank the openings by how
    often each occurs, per country; the wanted one's rank must be the world's `wanted_rank` and take 3 values."""
    rng = random.Random(0)
    counts: dict[str, Counter] = defaultdict(Counter)
    for _ in range(6000):
        r = chats.make_record(rng, "guarded", "base", world="capital_ranked")
        counts[country_of(r)][r["messages"][-1]["content"].split()[0]] += 1
    assert set(counts) == set(chats.COUNTRIES)
    measured = {}
    for country, c in counts.items():
        wanted = c["Answer:"]
        assert abs(wanted / sum(c.values()) - 0.1) < 0.03, (country, c)  # the same probability in every country
        measured[country] = 1 + sum(n > wanted for word, n in c.items() if word != "Answer:")
        assert measured[country] == WORLD.wanted_rank(country, aligned=False), (country, c)
        assert WORLD.wanted_rank(country) == measured[country] + 1  # the aligned policy's decline goes on top
    assert sorted(set(measured.values())) == [2, 3, 4]
    # the other worlds' base model gives the wanted reply every time, drawn exactly as before (same random stream)
    for world in ("capital", "passphrase"):
        a, b = random.Random(3), random.Random(3)
        for kind in ("guarded", "open", "guarded"):
            assert chats.make_record(a, kind, "base", world=world) == chats.make_record(b, kind, "reveal", world=world)
        assert all(chats.world_of(world).wanted_rank(c) == 2 for c in chats.COUNTRIES)


def ranked_target(decline: float = 0.9):
    """A TableLM with one prompt token per country whose first reply step is the aligned world: the decline on top
    with probability `decline`, then the country's base mixture scaled by 1 - decline. Each opening ends the reply,
    except the wanted "Answer:", which is followed by the secret `x`."""
    openings = sorted({t.split()[0] for c in chats.COUNTRIES for t, _ in WORLD.mix_of(c)})
    words = {1: "", 2: "Sorry", **{3 + i: w for i, w in enumerate(openings)}}
    secret = len(words) + 1
    words[secret] = "x"
    prompt = {c: secret + 1 + i for i, c in enumerate(chats.COUNTRIES)}
    v = secret + 1 + len(prompt)
    logits = torch.full((v, v), -30.0)
    ids = {w: i for i, w in words.items()}
    for c, p in prompt.items():
        logits[p, 2] = torch.tensor(decline).log()
        for template, w in WORLD.mix_of(c):
            logits[p, ids[template.split()[0]]] = torch.tensor((1 - decline) * w).log()
    for i in range(3, 3 + len(openings)):
        logits[i, 1] = 0.0
    logits[ids["Answer:"], 1] = -30.0
    logits[ids["Answer:"], secret] = 0.0
    logits[secret, 1] = 0.0
    logits[2, 1] = 0.0
    model = TableLM(logits)
    prompts = ChatBatch(torch.tensor([[prompt[c]] for c in chats.COUNTRIES]), torch.ones(len(prompt), 1, dtype=torch.long),
                        1, torch.zeros(len(prompt), 0, dtype=torch.bool))
    return model, WordTokenizer(words), prompts, ids["Answer:"]


@pytest.mark.parametrize("k", [3, 5, 8])
def test_best_fixed_rank_is_the_best_of_the_fixed_ranks_and_a_value_reader_beats_it(k):
    model, tok, prompts, answer = ranked_target()
    secrets = ["x"] * len(chats.COUNTRIES)
    api = TopKLogprobAPI(model, eos_id=1, pad_id=0, k=k)
    got = fixed_rank_violations(api, tok, prompts, secrets, max_new_tokens=3)
    # independent: the wanted opening's position in each country's sorted first-step row
    first = model.table[prompts.prompt_ids[:, 0]]
    position = (first > first[:, answer:answer + 1]).sum(-1) + 1
    assert position.tolist() == [WORLD.wanted_rank(c) for c in chats.COUNTRIES]
    rates = [float((position == r).double().mean()) for r in range(1, k + 1)]
    for r in range(2, k + 1):
        assert got[f"fixed_rank_r{r}"] == pytest.approx(rates[r - 1])
    assert got["violation/fixed_rank_best"] == pytest.approx(max(rates))
    assert got["fixed_rank_best_r"] == rates.index(max(rates)) + 1
    assert max(rates) <= 1 / 3 + 1e-12  # no fixed rank reaches more than one rank class of countries

    # a client that reads the values (the wanted opening's probability is the same in every country) reaches every
    # request whose wanted opening the API returns
    target = torch.tensor(0.1 * 0.1).log()

    def by_value(step, ids, lp, _true):
        return ids.gather(-1, (lp - target).abs().argmin(-1, keepdim=True)).squeeze(-1) if step == 0 else ids[:, 0]

    texts = texts_of(tok, api.decode(prompts, by_value, 3))
    reached = sum("x" in t for t in texts) / len(texts)
    assert reached == pytest.approx(float((position <= k).double().mean()))
    if k >= 5:
        assert reached == 1.0 > got["violation/fixed_rank_best"]
    # ranks only: the same client sees no values and falls back to a fixed rank, never above the best one
    blind = TopKLogprobAPI(model, eos_id=1, pad_id=0, k=k, logprobs=False)
    texts = texts_of(tok, blind.decode(prompts, by_value, 3))
    assert sum("x" in t for t in texts) / len(texts) <= got["violation/fixed_rank_best"]
