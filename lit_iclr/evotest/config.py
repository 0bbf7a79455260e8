"""The agent configuration chi = (guiding prompt, state-extractor code, hyperparameters); memory lives beside it.

The guiding prompt is kept in two forms: as text (what an LLM actor reads, `prompt_text`) and as the rules the text
states (`guide`: ordered (state, action) steps; `avoid`: (state, action) pairs; `explore`: untried commands), which the
rule-based actor follows. The state extractor is Python source, `extract_state(history) -> str`, run in the sandbox.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

# The root configuration's extractor: the current room from TextWorld/Inform's "-= Room =-" header, or the first line.
DEFAULT_EXTRACTOR = '''
import re

def extract_state(history):
    """history: list of [action, observation] pairs of this episode -> a short state summary."""
    room = "unknown"
    for action, obs in history:
        found = re.findall(r"-= (.+?) =-", obs)
        if found:
            room = found[-1]
    return "room: " + room
'''


def milestone_extractor(milestones: list[tuple[str, str]]) -> str:
    """Extractor source: the room plus the milestones whose pattern appeared in the history (string matching only).

    `milestones` are (pattern, label) pairs; they are embedded as literals, so no text from the game is ever code.
    """
    lines = [DEFAULT_EXTRACTOR.rstrip().rsplit("\n", 1)[0],  # the room loop, without the final return
             "    text = \" \".join(obs for action, obs in history)",
             f"    milestones = {[(p, label) for p, label in milestones]!r}",
             "    done = [label for pattern, label in milestones if pattern in text]",
             "    return \"room: \" + room + \" | done: \" + \", \".join(done)"]
    return "\n".join(lines) + "\n"


@dataclass
class AgentConfig:
    """One node's chi. `guide_score` is the score the episode the guide was distilled from reached."""

    guide: list[tuple[str, str]] = field(default_factory=list)
    avoid: list[tuple[str, str]] = field(default_factory=list)
    explore: list[str] = field(default_factory=list)
    milestones: list[tuple[str, str]] = field(default_factory=list)
    extractor: str = DEFAULT_EXTRACTOR
    temperature: float = 1.0
    guide_score: int = 0
    prompt: str = ""

    def prompt_text(self) -> str:
        """The guiding prompt as an LLM actor reads it (the evolver writes it together with the rules)."""
        if self.prompt:
            return self.prompt
        lines = ["Follow this guide, step by step:"]
        lines += [f"{i + 1}. when {s}: {a}" for i, (s, a) in enumerate(self.guide)] or ["(no guide yet: explore)"]
        if self.avoid:
            lines.append("Avoid: " + "; ".join(f"{a} (when {s})" for s, a in self.avoid))
        if self.explore:
            lines.append("Not tried yet: " + "; ".join(self.explore))
        return "\n".join(lines)

    def copy(self) -> AgentConfig:
        return copy.deepcopy(self)

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AgentConfig:
        d = dict(d)
        for k in ("guide", "avoid", "milestones"):
            d[k] = [tuple(x) for x in d[k]]
        return cls(**d)
