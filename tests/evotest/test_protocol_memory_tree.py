"""J-TTL measures, memory retrieval, loop detection and the evolution tree's rules against hand computation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from lit_iclr.evotest.config import AgentConfig
from lit_iclr.evotest.memory import CrossEpisodeMemory, detect_loop, jaccard, tokens
from lit_iclr.evotest.protocol import first_win, keeps_winning, normalised_auc, summarise
from lit_iclr.evotest.tree import EvolutionTree


def test_auc_first_win_and_keeps_winning():
    curve = [0, 1, 3, 8, 8]
    assert normalised_auc(curve, 8) == pytest.approx((0 + 1 + 3 + 8 + 8) / (5 * 8))
    assert first_win([False, False, True, True]) == 3 and keeps_winning([False, True, True]) is True
    assert keeps_winning([True, False, True]) is False and first_win([False]) is None and keeps_winning([0, 0]) is None
    s = summarise(curve, [0, 0, 0, 1, 1], 8)
    assert (s["best"], s["final"], s["wins"], s["first_win"], s["keeps_winning"]) == (8, 8, 2, 4, True)


def test_jaccard_matches_set_arithmetic_and_retrieval_orders_by_it():
    a, b = tokens("Kitchen: take the red potato"), tokens("the potato is red, take it")
    assert jaccard(a, b) == pytest.approx(len(a & b) / len(a | b)) and jaccard(frozenset(), frozenset()) == 0
    m = CrossEpisodeMemory()
    m.add_positive("room kitchen fridge closed", "open fridge", 1)
    m.add_positive("room garden rose", "smell rose", 1)
    m.add_positive("room kitchen fridge open carrot", "take carrot", 1)
    got = m.retrieve("room kitchen fridge open", k=2)
    sims = [jaccard(tokens("room kitchen fridge open"), tokens(p.state)) for p in m.positives]
    assert [p.action for _, p in got] == ["take carrot", "open fridge"]
    assert [s for s, _ in got] == pytest.approx(sorted(sims, reverse=True)[:2])
    m2 = CrossEpisodeMemory()
    m2.load_state_dict(m.state_dict())
    assert m2.positives == m.positives


def test_loop_detection():
    assert detect_loop(["a", "b", "c", "d", "e", "d", "e", "d", "e"], [0] * 9) == 3  # A <-> B alternation
    acts = [f"x{i}" for i in range(15)]
    assert detect_loop(acts, [0, 1] + [0] * 13) == 2  # 13-step zero-gain plateau
    assert detect_loop(acts, [0] * 10 + [1] + [0] * 4) is None  # gained recently, no alternation


def tree_with_scores(scores):
    t = EvolutionTree(AgentConfig(), c=1.0, alpha=0.8, drop_threshold=4)
    t.record(0, scores[0], False, [])
    for i, s in enumerate(scores[1:]):
        child = t.add_child(0 if i == 0 else i, AgentConfig())
        t.record(child, s, False, [])
    return t


def test_ucb_equals_the_formula_and_picks_the_parent():
    t = tree_with_scores([1, 3, 2])  # chain 0 -> 1 -> 2
    n = 3
    for i, (score, depth, children) in enumerate([(1, 0, 1), (3, 1, 1), (2, 2, 0)]):
        assert t.ucb(i) == pytest.approx(score + 0.8 ** depth * math.sqrt(math.log(n) / (1 + children)))
    kind, parent = t.choose()
    assert kind == "evolve" and parent == int(np.argmax([t.ucb(i) for i in range(3)]))


def test_drop_replay_freeze_and_unfreeze():
    t = tree_with_scores([2, 8, 3])  # last episode fell 5 >= 4 below the best: replay the best node
    assert t.choose() == ("play", 1)
    t.record(1, 8, True, [])  # a win freezes the configuration
    assert t.frozen == 1 and t.choose() == ("play", 1) and t.ucb(1) == 8.0
    t.record(1, 5, False, [])  # the frozen configuration failed: unfreeze and force an evolution
    assert t.frozen is None and t.force_evolve and t.choose()[0] == "evolve"
    t2 = EvolutionTree(AgentConfig())
    t2.load_state_dict(t.state_dict())
    assert [n.score for n in t2.nodes] == [n.score for n in t.nodes] and t2.choose() == t.choose()


def test_a_win_beyond_the_guide_is_distilled_before_freezing():
    t = EvolutionTree(AgentConfig(guide_score=0), distill_win=True)
    t.record(0, 3, True, [])  # won with a guide worth 0: evolve from the winner first
    assert t.frozen is None and t.choose() == ("evolve", 0)
    child = t.add_child(0, AgentConfig(guide_score=3))
    t.record(child, 3, True, [])  # the distilled guide wins: now freeze it
    assert t.frozen == child and t.choose() == ("play", child)
