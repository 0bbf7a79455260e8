"""Extractor time-outs are counted apart from other failures, UCB c follows the game's score range, and the
benchmark's equal-budget tuning picks the best development value (ties: the default)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from lit_iclr.evotest.actor import UNAVAILABLE, Extractor
from lit_iclr.evotest.config import AgentConfig
from lit_iclr.evotest.tree import EvolutionTree
from tests.benchmark_script import load_benchmark

HISTORY = [["", "-= Hall =-"], ["go east", "-= Den =-"]]


def test_a_hanging_extractor_is_a_counted_time_out_and_a_crashing_one_is_not():
    hang = "def extract_state(history):\n    if len(history) > 1:\n        while True:\n            pass\n    return 'ok'\n"
    ex = Extractor(hang, timeout_s=20.0)
    try:
        assert ex([["", "start"]]) == "ok"  # the worker is up (start-up is not part of the next call's limit)
        ex.fn.timeout_s = 0.3
        assert ex(HISTORY) == UNAVAILABLE
        assert (ex.failures, ex.timeouts) == (1, 1)
    finally:
        ex.close()
    crash = "def extract_state(history):\n    return history[5][0]\n"  # IndexError inside the sandbox
    ex = Extractor(crash, timeout_s=5.0)
    try:
        assert ex(HISTORY) == UNAVAILABLE and (ex.failures, ex.timeouts) == (1, 0)
    finally:
        ex.close()


def test_play_episode_reports_the_time_outs_of_its_extractor():
    from lit_iclr.evotest.actor import play_episode
    from lit_iclr.evotest.games import Step as GameState

    class Corridor:  # 3 steps east, then won; a stand-in for ZMachineGame
        def reset(self):
            self.n = 0
            return GameState("-= Room 0 =-", 0, False, False, ["go east"])

        def step(self, action):
            self.n += 1
            return GameState(f"-= Room {self.n} =-", self.n, self.n == 3, self.n == 3, ["go east"])

    # the extractor hangs from the second call on: calls 2 and 3 time out (the worker restarts after each)
    hang = "def extract_state(history):\n    if len(history) > 1:\n        while True:\n            pass\n    return 's'\n"
    chi = AgentConfig(extractor=hang)
    r = play_episode(Corridor(), chi, lambda sit, rng: 0, 10, np.random.default_rng(0), extractor_timeout_s=3.0)
    assert r["won"] and r["steps"] == 3
    assert r["extractor_timeouts"] == r["extractor_failures"] == 2
    assert [s["state"] for s in r["transcript"]] == ["s", UNAVAILABLE, UNAVAILABLE]


def test_exploration_term_only_breaks_ties_when_c_is_below_one_point_over_sqrt_ln_n():
    """The rescaled c (0.03 x max score 3 = 0.09) never lets UCB pick a lower-scored node over a higher one on integer
    scores (bonus <= c sqrt(ln N) < 1); a c spanning the score range (3 = 1.0 x max score) does, on a hand-built tree."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        tree = EvolutionTree(AgentConfig(), c=0.09, drop_threshold=50)
        tree.nodes[0].score = float(rng.integers(0, 4))
        for _ in range(int(rng.integers(1, 12))):
            i = tree.add_child(int(rng.integers(0, len(tree.nodes))), AgentConfig())
            tree.nodes[i].score = float(rng.integers(0, 4))
        tree.last = len(tree.nodes) - 1
        kind, i = tree.choose()
        assert kind == "evolve" and tree.nodes[i].score == max(n.score for n in tree.nodes)
    # root scored 1 with 4 children scored 0 (N = 5 nodes):
    # UCB(root) = 1 + c sqrt(ln 5 / 5), UCB(child) = 0 + c 0.8 sqrt(ln 5 / 1)
    tree = EvolutionTree(AgentConfig(), c=3.0, alpha=0.8, drop_threshold=50)
    tree.nodes[0].score = 1.0
    for _ in range(4):
        tree.nodes[tree.add_child(0, AgentConfig())].score = 0.0
    tree.last = 4
    assert tree.ucb(0) == pytest.approx(1 + 3 * math.sqrt(math.log(5) / 5))
    assert tree.ucb(4) == pytest.approx(3 * 0.8 * math.sqrt(math.log(5)))
    assert tree.choose() == ("evolve", 1)  # c = 3: a 0-point child beats the 1-point root
    tree.c = 0.09
    assert tree.choose() == ("evolve", 0)


def test_module_c_is_the_fraction_of_the_max_score_unless_given(tmp_path):
    from lit_iclr.evotest import EvoTest

    class Game:
        max_score = 8

    m = EvoTest(game_file="unused.z8", step_limit=5)
    m.game = Game()
    assert m.exploration_c() == pytest.approx(0.03 * 8)
    m = EvoTest(game_file="unused.z8", step_limit=5, exploration_constant=1.0)
    m.game = Game()
    assert m.exploration_c() == 1.0
    with pytest.raises(ValueError, match="cannot run beside the agent"):
        EvoTest(game_file="unused.z8", step_limit=5, baselines=("static", "pg"))


def _benchmark():
    return load_benchmark("evotest")


def test_tuning_gives_every_method_three_values_and_keeps_the_default_on_a_tie():
    b = _benchmark()
    assert all(len(v) == 3 and d in v for _, d, v in b.KNOBS.values())  # the same budget for every method
    assert set(b.KNOBS) == set(b.METHODS)

    def run(method, value, seed, curve):
        return {"game": b.DEV_GAME, "method": method, "seed": seed, "value": value, "curve": curve, "max_score": 4,
                "extractor_timeouts": 0}

    results = []
    for m, (_, _, values) in b.KNOBS.items():
        for v in values:
            for s in b.DEV_SEEDS:
                if m == "memory":  # the largest value is best: AUC 0.5 vs 0.25
                    curve = [2, 2] if v == values[2] else [1, 1]
                else:  # all equal: the default is kept
                    curve = [1, 1]
                results.append(run(m, v, s, curve))
    best, text = b.tuned(results)
    assert best["memory"] == b.KNOBS["memory"][2][2]
    assert all(best[m] == b.KNOBS[m][1] for m in b.METHODS if m != "memory")
    assert "0.500" in text and "0.250" in text
    best, _ = b.tuned(results[1:])  # a missing development run: that method is not tuned (no silent default)
    assert b.METHODS[0] not in best
