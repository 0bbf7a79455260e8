"""Cross-episode memory (positives: score-raising steps; negatives: detected loops) and Jaccard retrieval."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

_WORD = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b| (0 for two empty sets), the retrieval similarity of the reference code."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def detect_loop(actions: list[str], rewards: list[int], plateau: int = 10) -> int | None:
    """Start index of the loop at the end of an episode, or None.

    A loop is a zero-gain plateau of at least `plateau` steps at the end, or an A <-> B alternation (>= 4 steps).
    """
    n = len(actions)
    if n >= 4 and actions[-1] == actions[-3] and actions[-2] == actions[-4] and actions[-1] != actions[-2]:
        start = n - 4
        while start >= 1 and actions[start - 1] == actions[start + 1] and rewards[start - 1] == 0:
            start -= 1
        return start
    zero = 0
    for r in reversed(rewards):
        if r > 0:
            break
        zero += 1
    return n - zero if zero >= plateau else None


@dataclass
class Positive:
    state: str
    action: str
    delta: int


@dataclass
class CrossEpisodeMemory:
    """Positives {state, action, delta_score} and negatives (loop segments: lists of (state, action))."""

    positives: list[Positive] = field(default_factory=list)
    negatives: list[list[tuple[str, str]]] = field(default_factory=list)
    max_negative_steps: int = 50

    def add_positive(self, state: str, action: str, delta: int) -> None:
        self.positives.append(Positive(state, action, int(delta)))

    def add_negative(self, segment: list[tuple[str, str]]) -> None:
        self.negatives.append([tuple(x) for x in segment[-self.max_negative_steps:]])

    def retrieve(self, state: str, k: int = 3) -> list[tuple[float, Positive]]:
        """The k positives most similar to `state` by token Jaccard similarity (ties: most recent first)."""
        q = tokens(state)
        scored = [(jaccard(q, tokens(p.state)), -i, p) for i, p in enumerate(self.positives)]
        scored.sort(key=lambda x: (x[0], x[1]), reverse=True)
        return [(s, p) for s, _, p in scored[:k] if s > 0]

    def state_dict(self) -> dict:
        return {"positives": [asdict(p) for p in self.positives], "negatives": [list(map(list, s)) for s in self.negatives]}

    def load_state_dict(self, d: dict) -> None:
        self.positives = [Positive(**p) for p in d["positives"]]
        self.negatives = [[tuple(x) for x in s] for s in d["negatives"]]
