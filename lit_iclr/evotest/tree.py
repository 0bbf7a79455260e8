"""The evolution tree of configurations: UCB parent selection with depth decay, drop-replay, victory freeze/unfreeze.

Ported rule by rule from the reference agent (`OurAgent.calculate_ucb`, `start_episode`, `end_episode`):

- UCB(node) = score(node) + c * alpha^depth * sqrt(ln N / (1 + #children))            (c = 1.0, alpha = 0.8)
- if the last score fell >= drop_threshold below the best, replay the best node without evolving;
- after a win, freeze: replay the winning node; if a frozen node fails to win, unfreeze and force an evolution.
  With `distill_win` (our choice, default on), a win that the node's guide did not yet spell out (found by
  exploration beyond the guide) is first distilled by one evolution from the winning node; that child is frozen when
  it wins in turn. Off: the reference rule (freeze the winning node as is).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .config import AgentConfig


@dataclass
class Node:
    config: AgentConfig
    parent: int | None
    depth: int
    children: int = 0
    score: float | None = None
    won: bool = False
    transcript: list = field(default_factory=list)


class EvolutionTree:
    """Nodes in creation order; `choose()` says which node plays next and whether it must first be evolved."""

    def __init__(self, root: AgentConfig, c: float = 1.0, alpha: float = 0.8, drop_threshold: float = 50.0,
                 distill_win: bool = False):
        self.nodes = [Node(root, None, 0)]
        self.c, self.alpha, self.drop_threshold, self.distill_win = c, alpha, drop_threshold, distill_win
        self.distill_from: int | None = None
        self.frozen: int | None = None
        self.force_evolve = False
        self.last: int | None = None  # node played in the previous episode

    def ucb(self, i: int) -> float:
        node = self.nodes[i]
        n = len(self.nodes)
        if self.frozen == i:  # a frozen (winning) node's UCB is reduced to its score
            return float(node.score)
        return float(node.score) + self.c * self.alpha ** node.depth * math.sqrt(math.log(n) / (1 + node.children))

    def best(self) -> int:
        played = [i for i, n in enumerate(self.nodes) if n.score is not None]
        return max(played, key=lambda i: (self.nodes[i].score, -i))

    def choose(self) -> tuple[str, int]:
        """('play', i): play node i as is (root, frozen winner or drop-replay); ('evolve', parent): make a child."""
        if self.last is None:
            return "play", 0
        if self.distill_from is not None:
            return "evolve", self.distill_from
        if self.frozen is not None and not self.force_evolve:
            return "play", self.frozen
        last, best = self.nodes[self.last], self.best()
        if not self.force_evolve and self.nodes[best].score - last.score >= self.drop_threshold and best != self.last:
            return "play", best
        played = [i for i, n in enumerate(self.nodes) if n.score is not None]
        return "evolve", max(played, key=lambda i: (self.ucb(i), -i))

    def add_child(self, parent: int, config: AgentConfig) -> int:
        self.nodes[parent].children += 1
        self.nodes.append(Node(config, parent, self.nodes[parent].depth + 1))
        return len(self.nodes) - 1

    def record(self, i: int, score: float, won: bool, transcript: list) -> None:
        """The episode of node i ended: set its score, keep its transcript, apply the freeze rules."""
        node = self.nodes[i]
        node.score, node.won, node.transcript = float(score), bool(won), transcript
        self.force_evolve = False
        self.distill_from = None
        if won and self.distill_win and node.config.guide_score < score:
            self.distill_from = i  # the guide does not hold this win yet: evolve from it first
        elif won:
            self.frozen = i
        elif self.frozen == i:  # a frozen configuration failed to win: unfreeze and evolve next time
            self.frozen, self.force_evolve = None, True
        self.last = i

    def state_dict(self) -> dict:
        nodes = [{**asdict(n), "config": n.config.state_dict()} for n in self.nodes]
        return {"nodes": nodes, "frozen": self.frozen, "force_evolve": self.force_evolve, "last": self.last,
                "distill_from": self.distill_from}

    def load_state_dict(self, d: dict) -> None:
        self.nodes = [Node(**{**n, "config": AgentConfig.from_dict(n["config"])}) for n in d["nodes"]]
        self.frozen, self.force_evolve, self.last = d["frozen"], d["force_evolve"], d["last"]
        self.distill_from = d.get("distill_from")
