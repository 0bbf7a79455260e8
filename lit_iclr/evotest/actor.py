"""Actors: turn (chi, memory, current situation) into a distribution over the admissible commands, and play episodes.

- `rule_logits`: the offline actor. It follows chi's rules as an LLM would follow the guide text: +w_guide for the
  guide's action in the current extracted state, +w_explore for listed untried commands, -w_avoid for avoid rules,
  -w_repeat per earlier use of the same command in the same state this episode, + memory bonuses (added by the agent).
- `LMActor`: a causal LM (SmolLM2-135M by default) ranks the admissible commands by their mean log-likelihood after a
  prompt built like the reference actor's (system guide, GAME STATE SUMMARY, retrieved examples, recent history, the
  current observation). The guide reaches the LM only through the prompt.
- `ChatActor`: the same prompt sent to a chat model (any OpenAI-compatible endpoint, `core/llm.py:OpenAIClient`), which
  answers with a command, as the reference actor does (`yf-he/EvoTest`, `src/our_agent.py`: the LLM writes "ACTION: ...");
  the reply is matched to one admissible command (`match_command`), and a reply that names none leaves the step uniform.
Commands are sampled from softmax(logits / T), T = chi's temperature (a hyperparameter the evolver tunes).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np

from lit_iclr.core.sandbox import SandboxedFunction, SandboxError

from .config import AgentConfig
from .games import ZMachineGame


@dataclass
class Weights:
    """Logit weights of the rule actor (config options)."""

    guide: float = 8.0
    explore: float = 1.0
    avoid: float = 4.0
    repeat: float = 1.0
    memory: float = 3.0


@dataclass
class Situation:
    state: str
    obs: str
    admissible: list[str]
    counts: dict = field(default_factory=dict)  # (state, action) -> uses this episode
    history: list = field(default_factory=list)  # [action, observation] pairs so far


def situation_key(sit: Situation) -> str:
    """The extracted state plus the admissible commands: the state key of the tabular learners."""
    return sit.state + " || " + " ; ".join(sorted(sit.admissible))


def rule_logits(chi: AgentConfig, sit: Situation, w: Weights) -> np.ndarray:
    guide = {a for s, a in chi.guide if s == sit.state}
    avoid = {a for s, a in chi.avoid if s == sit.state}
    explore = set(chi.explore)
    used = {a for (_, a) in sit.counts}
    z = np.zeros(len(sit.admissible))
    for j, a in enumerate(sit.admissible):
        z[j] = (w.guide * (a in guide) + w.explore * (a in explore and a not in used) - w.avoid * (a in avoid)
                - w.repeat * sit.counts.get((sit.state, a), 0))
    return z


def softmax_sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> tuple[int, np.ndarray]:
    z = logits / max(temperature, 1e-6)
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(rng.choice(len(p), p=p)), p


class LMActor:
    """Ranks admissible commands with an `LLMClient.score` under the actor prompt (see module docstring)."""

    def __init__(self, client, history_steps: int = 6, max_obs_chars: int = 600):
        self.client, self.history_steps, self.max_obs_chars = client, history_steps, max_obs_chars

    def prompt(self, chi: AgentConfig, sit: Situation, examples: list) -> str:
        recent = "\n".join(f"> {a}\n{o.strip()[:200]}" for a, o in sit.history[-self.history_steps:] if a)
        shots = "\n".join(f"State: {p.state[:120]} -> ACTION: {p.action}" for _, p in examples)
        return (f"You are an expert player of text adventure games. {chi.prompt_text()}\n\n"
                f"GAME STATE SUMMARY: {sit.state}\n"
                + (f"Examples that raised the score before:\n{shots}\n" if shots else "")
                + f"Recent history:\n{recent}\n\nCurrent observation:\n{sit.obs.strip()[-self.max_obs_chars:]}\n\n"
                f"Valid commands: {', '.join(sit.admissible)}\nACTION: ")

    def logits(self, chi: AgentConfig, sit: Situation, examples: list) -> np.ndarray:
        s, n = self.client_scores(self.prompt(chi, sit, examples), sit.admissible)
        return s / n  # mean log-likelihood per token

    def client_scores(self, prompt: str, candidates: list[str]) -> tuple[np.ndarray, np.ndarray]:
        logp, mask = self.client.token_logprobs(prompt, candidates)
        return logp.sum(-1).numpy(), mask.sum(-1).numpy()


CHOSEN_LOGIT = 50.0  # the chat actor's pick: softmax(50 / T) puts all but ~e^-50 of the mass on it for T <= 1.5


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' -]", " ", text.lower()).split())


def match_command(reply: str, admissible: list[str]) -> int | None:
    """The admissible command a chat reply names, or None.

    The first non-empty line after an optional "ACTION:" is compared case- and punctuation-insensitively: an exact match
    first, else the longest admissible command that occurs in it as whole words (so "take red apple" wins over "take
    red"); anywhere else in the reply only when no line names one."""
    norm = [_norm(a) for a in admissible]
    m = re.search(r"action\s*:\s*(.*)", reply, re.I)
    lines = [m.group(1)] if m else []
    lines += [ln for ln in reply.splitlines() if ln.strip()]
    for text in lines[:1] + [" ".join(lines)]:
        t = _norm(text)
        if t in norm:
            return norm.index(t)
        found = [(len(a), j) for j, a in enumerate(norm) if a and re.search(rf"(^| ){re.escape(a)}( |$)", t)]
        if found:
            return max(found)[1]
    return None


class ChatActor(LMActor):
    """The actor prompt sent to a chat model (`client.generate`); logits put the replied command first.

    Args:
        client: An `LLMClient` that generates (e.g. `OpenAIClient`).
        max_new_tokens: Length of the reply (one command).

    The chat model samples at chi's temperature (the hyperparameter the evolver tunes; the reference actor samples).
    """

    INSTRUCTION = "\nAnswer with exactly one of the valid commands, nothing else.\nACTION: "

    def __init__(self, client, max_new_tokens: int = 16, **kw):
        super().__init__(client, **kw)
        self.max_new_tokens = max_new_tokens
        self.calls = 0
        self.unmatched = 0  # replies that named no admissible command (the step was sampled uniformly)

    def logits(self, chi: AgentConfig, sit: Situation, examples: list) -> np.ndarray:
        prompt = self.prompt(chi, sit, examples).removesuffix("ACTION: ") + self.INSTRUCTION
        reply = self.client.generate(prompt, self.max_new_tokens, chi.temperature, seed=self.calls)
        self.calls += 1
        z = np.zeros(len(sit.admissible))
        j = match_command(reply, sit.admissible)
        if j is None:
            self.unmatched += 1
        else:
            z[j] = CHOSEN_LOGIT
        return z


UNAVAILABLE = "state unavailable"


class Extractor:
    """chi's state extractor run in the sandbox; a call that fails returns a fixed marker and is counted, time-outs
    (the call ran past `timeout_s`, e.g. on a loaded machine) separately: they change what the actor sees."""

    def __init__(self, code: str, timeout_s: float = 1.0):
        self.fn = SandboxedFunction(code, "extract_state", timeout_s=timeout_s, max_output=400)
        self.failures = 0
        self.timeouts = 0

    def __call__(self, history: list) -> str:
        try:
            return self.fn(history)
        except SandboxError as e:
            self.failures += 1
            self.timeouts += is_timeout(e)
            return UNAVAILABLE

    def close(self) -> None:
        self.fn.close()


def is_timeout(error: SandboxError) -> bool:
    """The sandbox's time-out (`core/sandbox.py` raises SandboxError("timed out after ... s"))."""
    return str(error).startswith("timed out")


def play_episode(game: ZMachineGame, chi: AgentConfig, choose, step_limit: int, rng: np.random.Generator,
                 extractor_timeout_s: float = 1.0) -> dict:
    """One J-TTL episode from the identical start; `choose(sit, rng) -> index` picks each command.

    Returns {transcript, score, won, steps, env_time, extractor_failures, extractor_timeouts}; each transcript step is
    {state, action, obs (after), reward, score (after), admissible (before)}.
    """
    extractor = Extractor(chi.extractor, extractor_timeout_s)
    env_time = 0.0
    try:
        t0 = time.perf_counter()
        st = game.reset()
        env_time += time.perf_counter() - t0
        history = [["", st.obs]]
        counts: dict = {}
        transcript = []
        for _ in range(step_limit):
            if st.done or not st.admissible:
                break
            state = extractor(history)
            sit = Situation(state, st.obs, st.admissible, counts, history)
            j = choose(sit, rng)
            action = st.admissible[j]
            t0 = time.perf_counter()
            nxt = game.step(action)
            env_time += time.perf_counter() - t0
            transcript.append({"state": state, "action": action, "obs": nxt.obs, "reward": nxt.score - st.score,
                               "score": nxt.score, "admissible": st.admissible, "obs_before": st.obs,
                               "situation": situation_key(sit), "done": nxt.done, "won": nxt.won})
            counts[(state, action)] = counts.get((state, action), 0) + 1
            history.append([action, nxt.obs])
            st = nxt
        return {"transcript": transcript, "score": st.score, "won": st.won, "done": st.done, "steps": len(transcript),
                "env_time": env_time, "extractor_failures": extractor.failures,
                "extractor_timeouts": extractor.timeouts}
    finally:
        extractor.close()
