"""The transcript evolver's rules, the model-written extractor boundary, Q-learning and the policy gradient."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.core.sandbox import run_sandboxed
from lit_iclr.evotest.actor import Situation, softmax_sample
from lit_iclr.evotest.agents import PolicyGradientAgent, QLearningAgent
from lit_iclr.evotest.config import DEFAULT_EXTRACTOR, AgentConfig, milestone_extractor
from lit_iclr.evotest.evolver import LLMEvolver, TranscriptEvolver, needed_steps


def step(state, action, reward=0, adm=("a",), obs="nothing happens"):
    return {"state": state, "action": action, "obs": obs, "reward": reward, "score": 0, "admissible": list(adm),
            "obs_before": "-= Hall =-\nA hall."}


def test_needed_steps_drops_no_ops_and_detours_but_keeps_gains():
    tr = [step("room: Hall", "look", adm=("look", "go east")),
          step("room: Hall", "go east", adm=("look", "go east")),
          step("room: Den", "go west", adm=("go west", "open box")),  # detour back to the hall ...
          step("room: Hall", "go east", adm=("look", "go east")),     # ... and back: cut
          step("room: Den", "open box", adm=("go west", "open box")),
          step("room: Den", "take gem", 1, adm=("go west", "take gem")),
          step("room: Den", "go west", adm=("go west",))]             # after the last gain: not part of the plan
    assert [s["action"] for s in needed_steps(tr)] == ["go east", "open box", "take gem"]


def test_transcript_evolver_writes_guide_extractor_avoid_and_temperature():
    tr = [step("room: Hall", "go east", adm=("look", "go east", "go north"), obs="-= Den =-\nA den."),
          step("room: Den", "take gem", 1, adm=("go west", "take gem"), obs="You take the gem. Your score went up.")]
    tr += [step("room: Den", a, adm=("go west", "go east2")) for a in ["go west", "go east2"] * 3]
    parent = AgentConfig(temperature=1.0)
    child = TranscriptEvolver()(parent, tr, score=1, parent_best=0, negatives=[])
    assert child.milestones == [("You take the gem", "take gem")]
    # the new extractor is string matching, runs in the sandbox, and the guide is keyed by the states it returns
    hist = [["", "-= Den =-"], ["take gem", "You take the gem. Score."]]
    assert run_sandboxed(child.extractor, "extract_state", hist) == "room: Den | done: take gem"
    assert [a for _, a in child.guide] == ["go east", "take gem"]
    assert child.guide[0][0] == "room: Hall | done: " and child.guide[1][0] == "room: Den | done: "
    assert ("room: Den | done: take gem", "go west") in child.avoid  # the A <-> B loop at the end
    assert child.explore[0] == "go north" and child.temperature == pytest.approx(0.5)  # improved: cooler
    worse = TranscriptEvolver()(child, tr[:1], score=0, parent_best=1, negatives=[])
    assert worse.guide == child.guide and worse.temperature == pytest.approx(0.6)  # kept guide, hotter


class FakeLLM:
    def __init__(self, reply):
        self.reply = reply

    def generate(self, prompt, max_new_tokens=64, temperature=0.0, seed=0):
        self.prompt = prompt
        return self.reply


@pytest.mark.parametrize("code", [
    "def extract_state(history):\n    while True:\n        pass\n",
    "import os\ndef extract_state(history):\n    return os.getcwd()\n",
    "def extract_state(history):\n    open('x', 'w').write('y')\n    return 'ok'\n",
    "def extract_state(history):\n    return ().__class__\n",
])
def test_llm_evolver_keeps_the_parents_extractor_when_the_new_code_is_hostile(code):
    parent = AgentConfig()
    llm = FakeLLM(f"PROMPT:\nGo east, then take the gem.\n<code>\n{code}</code>")
    child = LLMEvolver(llm)(parent, [step("room: Hall", "go east")], 0, 0, [])
    assert child.prompt == "Go east, then take the gem."  # the prompt part is taken
    assert child.extractor == parent.extractor == DEFAULT_EXTRACTOR
    assert "go east" in llm.prompt and "<code>" in llm.prompt


def test_llm_evolver_takes_good_code():
    code = "def extract_state(history):\n    return 'steps ' + str(len(history))\n"
    child = LLMEvolver(FakeLLM(f"PROMPT: p\n<code>\n{code}</code>"))(AgentConfig(), [], 0, 0, [])
    assert child.extractor.strip() == code.strip()


def test_milestone_extractor_source_holds_game_text_only_as_literals():
    code = milestone_extractor([("You open the door\"); import os; (\"", "open door")])
    out = run_sandboxed(code, "extract_state", [["", "-= Hall =- You open the door\"); import os; (\""]])
    assert out == "room: Hall | done: open door"


def test_q_learning_logits_are_exactly_epsilon_greedy_and_update_matches_hand():
    agent = QLearningAgent(lr=0.5, gamma=0.9, epsilon=0.2)
    sit = Situation("s", "obs", ["a", "b", "c", "d"])
    key = lambda a: agent._k("s || a ; b ; c ; d", a)  # noqa: E731
    agent.q[key("b")] = 1.0
    agent.q[key("c")] = 1.0
    chi = AgentConfig(temperature=0.7)
    z = agent.logits(chi, sit) / chi.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    np.testing.assert_allclose(p, [0.05, 0.45, 0.45, 0.05])  # eps/n + (1-eps)/k on the k greedy commands
    tr = [{"situation": "s || a ; b ; c ; d", "action": "a", "reward": 0, "admissible": ["a", "b", "c", "d"]},
          {"situation": "s || a ; b ; c ; d", "action": "b", "reward": 2, "admissible": ["a", "b", "c", "d"]}]
    agent.end_episode({"transcript": tr, "done": True})
    assert agent.q[key("a")] == pytest.approx(0.5 * (0 + 0.9 * 1.0))
    assert agent.q[key("b")] == pytest.approx(1.0 + 0.5 * (2 - 1.0))  # terminal: no bootstrap


def test_policy_gradient_loss_gradient_equals_the_closed_form():
    theta = torch.nn.Parameter(torch.randn(64) * 0.1)
    agent = PolicyGradientAgent(theta, gamma=1.0)
    chi = AgentConfig(temperature=0.5)
    rng = np.random.default_rng(0)
    sits = [Situation(f"s{t}", "o", ["x", "y", "z"]) for t in range(3)]
    rewards = [0, 1, 0]
    grads = torch.zeros(64)
    for sit in sits:
        z = agent.logits(chi, sit)
        j, p = softmax_sample(z, chi.temperature, rng)
        agent.record_choice(j)
        agent._probs = getattr(agent, "_probs", []) + [(agent.buckets(sit), p, j)]
    ret = np.array([1.0, 1.0, 0.0])  # returns-to-go with gamma = 1
    adv = ret - ret.mean()
    for (b, p, j), a in zip(agent._probs, adv, strict=True):
        g = -a * (np.eye(3)[j] - p) / chi.temperature  # d/dtheta of -A log softmax(z / T)[j]
        for k in range(3):
            grads[b[k]] += float(g[k])
    loss = agent.loss({"transcript": [{"reward": r} for r in rewards]})
    loss.backward()
    torch.testing.assert_close(theta.grad, grads, atol=1e-5, rtol=1e-4)
