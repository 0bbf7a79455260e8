"""Evolvers U(chi, tau) -> chi': rewrite a configuration from the whole transcript of its episode.

- `TranscriptEvolver`: a deterministic, offline transcript analyser (no language model). It does what the reference
  evolver's instructions ask of the LLM: (1) keep only the actions that raised the score or were needed, as ordered
  step-by-step guide rules; (2) discourage unproductive actions (loops -> avoid rules); (3) list untried commands;
  (4) write a string-matching `extract_state` milestone detector; and it adapts the exploration temperature.
- `LLMEvolver`: the reference evolver prompt sent to any `LLMClient`; the new prompt and `<code>` are parsed, and code
  that fails validation in the sandbox keeps the parent's.

A transcript is a list of step dicts: {state, action, obs, reward, score, admissible}.
"""
from __future__ import annotations

import re

from lit_iclr.core.sandbox import SandboxedFunction, SandboxError

from .config import AgentConfig, milestone_extractor


def validate_extractor(code: str, timeout_s: float = 1.0) -> bool:
    """The code loads in the sandbox and `extract_state` answers a test history with a string in time."""
    try:
        with SandboxedFunction(code, "extract_state", timeout_s=timeout_s) as fn:
            fn([["look", "-= Room =-\nA test room."]])
        return True
    except SandboxError:
        return False


def reextract(code: str, transcript: list[dict], timeout_s: float = 1.0) -> list[dict] | None:
    """The transcript with every step's `state` recomputed by extractor `code` (None if the code fails), so guide
    rules are keyed by the states the new configuration will see."""
    if not transcript:
        return transcript
    history = [["", transcript[0]["obs_before"]]]
    out = []
    try:
        with SandboxedFunction(code, "extract_state", timeout_s=timeout_s, max_output=400) as fn:
            for s in transcript:
                out.append({**s, "state": fn(history)})
                history.append([s["action"], s["obs"]])
    except SandboxError:
        return None
    return out


def needed_steps(transcript: list[dict]) -> list[dict]:
    """The steps up to the last score gain that raised the score or changed the situation, with cycles cut out.

    A step is kept when it raised the score, changed the extracted state, or changed the admissible commands (e.g.
    `open fridge`). When a situation (state + admissible commands) recurs with no gain in between, the detour is cut.
    """
    last_gain = max((i for i, s in enumerate(transcript) if s["reward"] > 0), default=-1)
    path: list[dict] = []
    seen: dict[tuple, int] = {}
    prev = None
    for i, s in enumerate(transcript[:last_gain + 1]):
        nxt = transcript[i + 1] if i + 1 < len(transcript) else None
        situation = (s["state"], tuple(sorted(s["admissible"])))
        after = (nxt["state"], tuple(sorted(nxt["admissible"]))) if nxt else None
        if s["reward"] <= 0 and after == situation:
            continue  # changed nothing (look, examine ...)
        if s["reward"] <= 0 and situation in seen and seen[situation] >= (prev or 0):
            cut = seen[situation]  # back in a situation already on the path: drop the detour
            for st in path[cut:]:
                seen.pop((st["state"], tuple(sorted(st["admissible"]))), None)
            path = path[:cut]
        seen[situation] = len(path)
        path.append(s)
        if s["reward"] > 0:
            prev = len(path)  # never cut across a score gain
    return path


def first_sentence(text: str, n: int = 48) -> str:
    """A short literal pattern from an observation: its first sentence of prose (room headers, score/move counters
    and prompts skipped; no underscores, so it never looks like a dunder)."""
    for line in text.replace("_", " ").splitlines():
        line = " ".join(line.split())
        if "=-" in line or line.startswith(">") or len(line.split()) < 3:
            continue
        return line.split(".")[0][:n].strip()
    return ""


class TranscriptEvolver:
    """Deterministic transcript-analysing evolver (offline stand-in for the LLM evolver, named as such).

    Args:
        cool: Temperature factor after an improvement (lower: exploit).
        heat: Temperature factor after a plateau (higher: explore).
        t_min, t_max: Temperature bounds.
        max_explore: Untried commands listed in the prompt.
    """

    def __init__(self, cool: float = 0.5, heat: float = 1.2, t_min: float = 0.2, t_max: float = 1.5,
                 max_explore: int = 8):
        self.cool, self.heat, self.t_min, self.t_max, self.max_explore = cool, heat, t_min, t_max, max_explore

    def __call__(self, parent: AgentConfig, transcript: list[dict], score: float, parent_best: float,
                 negatives: list[list[tuple[str, str]]]) -> AgentConfig:
        child = parent.copy()
        # (4) milestone extractor: the observation after each score gain becomes a detector pattern
        known = {p for p, _ in child.milestones}
        for s in transcript:
            if s["reward"] > 0:
                pattern = first_sentence(s["obs"])
                if pattern and pattern not in known:
                    known.add(pattern)
                    child.milestones.append((pattern, s["action"]))
        if child.milestones != parent.milestones:
            code = milestone_extractor(child.milestones)
            child.extractor = code if validate_extractor(code) else parent.extractor
        # the transcript as the child's extractor sees it (guide and avoid rules are keyed by its states)
        seen_by_child = reextract(child.extractor, transcript) if child.extractor != parent.extractor else transcript
        if seen_by_child is None:
            child.extractor, child.milestones, seen_by_child = parent.extractor, parent.milestones, transcript
        # (1) ordered guide of needed actions, from the episode if it did at least as well as the current guide
        if score >= parent.guide_score and transcript:
            child.guide = [(s["state"], s["action"]) for s in needed_steps(seen_by_child)]
            child.guide_score = int(score)
        elif child.extractor != parent.extractor:  # keep the old guide, re-keyed where its steps can be matched
            child.guide = []
        # (2) avoid rules from the last loop patterns: (state, action) repeated inside a loop of this transcript
        from .memory import detect_loop

        start = detect_loop([s["action"] for s in seen_by_child], [s["reward"] for s in seen_by_child])
        same_states = child.extractor == parent.extractor
        segments = list(negatives[-3:]) if same_states else []  # the last 3 loop patterns (their states still match)
        if start is not None:
            segments.append([(s["state"], s["action"]) for s in seen_by_child[start:]])
        avoid = set(child.avoid) if same_states else set()
        for seg in segments:
            avoid |= {tuple(k) for k in set(map(tuple, seg)) if seg.count(k) >= 2}
        # an action that ended the game without a win (a loss) is the most unproductive of all
        if seen_by_child and seen_by_child[-1].get("done") and not seen_by_child[-1].get("won"):
            avoid.add((seen_by_child[-1]["state"], seen_by_child[-1]["action"]))
        child.avoid = sorted(avoid - set(child.guide))
        # (3) commands seen but never tried (unexplored exits first)
        tried = {s["action"] for s in transcript}
        seen = [a for s in transcript for a in s["admissible"] if a not in tried]
        untried = sorted(set(seen), key=lambda a: (not a.startswith("go "), seen.index(a)))
        child.explore = untried[:self.max_explore]
        # hyperparameters: exploit after an improvement, explore after a plateau
        factor = self.cool if score > parent_best else self.heat
        child.temperature = float(min(self.t_max, max(self.t_min, parent.temperature * factor)))
        child.prompt = ""
        return child


EVOLVER_PROMPT = """You are improving an agent that plays a text adventure game. It will play the same game again from
the same start. Its current guide was:
{prompt}

Its state extractor code was:
<code>
{code}
</code>

Full transcript of its last episode (score {score}):
{transcript}

Recent loops (unproductive repeated actions):
{negatives}

Write an improved guide: 1) keep only actions that raised the score or were needed, as step-by-step instructions;
2) discourage unproductive actions; 3) list unexplored rooms and guesses; 4) write a simple string-matching Python
function extract_state(history) that returns the milestones reached (history is a list of [action, observation]).
Answer as:
PROMPT:
<the new guide>
<code>
<the new extract_state function>
</code>"""


class LLMEvolver:
    """The reference evolver prompt through an `LLMClient` (temperature 0.7, up to 3000 new tokens as in the code)."""

    def __init__(self, client, temperature: float = 0.7, max_new_tokens: int = 3000, max_transcript_chars: int = 12000):
        self.client, self.temperature, self.max_new_tokens = client, temperature, max_new_tokens
        self.max_transcript_chars = max_transcript_chars

    def __call__(self, parent: AgentConfig, transcript: list[dict], score: float, parent_best: float,
                 negatives: list[list[tuple[str, str]]], seed: int = 0) -> AgentConfig:
        lines = [f"> {s['action']}\n{s['obs'].strip()}\n[score {s['score']}]" for s in transcript]
        text = "\n".join(lines)[-self.max_transcript_chars:]
        neg = "\n".join(" -> ".join(a for _, a in seg[-10:]) for seg in negatives[-3:]) or "(none)"
        prompt = EVOLVER_PROMPT.format(prompt=parent.prompt_text(), code=parent.extractor, score=score,
                                       transcript=text, negatives=neg)
        reply = self.client.generate(prompt, self.max_new_tokens, self.temperature, seed=seed)
        child = parent.copy()
        m = re.search(r"PROMPT:\s*(.*?)(<code>|$)", reply, re.S)
        if m and m.group(1).strip():
            child.prompt = m.group(1).strip()
        code = re.search(r"<code>\s*(.*?)\s*</code>", reply, re.S)
        if code and validate_extractor(code.group(1)):
            child.extractor = code.group(1)
        return child
