"""EvoTest and the J-TTL baselines, all played by the same actor under the same protocol.

Every agent: `begin_episode() -> chi` (the configuration to play), `logits(chi, sit) -> np.ndarray` (actor logits over
the admissible commands, before the temperature), `end_episode(result)` (learn from the episode), and a JSON-able
`state_dict()` that goes into the checkpoint so a stopped run resumes.

| agent | learns across episodes by |
|---|---|
| `static` | nothing (the root configuration every episode) |
| `memory` | positives memory (score-raising steps), retrieved by Jaccard similarity |
| `reflection` | the last episode's failure (its loop) as avoid advice |
| `summary` | the actions that raised the score in the last episode, as advice in any state |
| `rag` | retrieval over all past transcripts' steps, weighted by the return that followed them |
| `qlearning` | tabular Q-learning over (extracted state, admissible set) x command, online, epsilon-greedy |
| `pg` | REINFORCE on per-(situation, command) logit offsets added to the actor's scores (the module's optimizer) |
| `evotest` | the evolution tree of whole configurations + positives/negatives memory |
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

from .actor import Situation, Weights, rule_logits, situation_key
from .config import AgentConfig
from .evolver import TranscriptEvolver
from .memory import CrossEpisodeMemory, detect_loop, jaccard, tokens
from .tree import EvolutionTree

AGENTS = ("static", "memory", "reflection", "summary", "rag", "qlearning", "pg", "evotest")


class Agent:
    """The static agent (root configuration, no learning); the others override what they learn."""

    def __init__(self, weights: Weights | None = None, lm_actor=None, temperature: float = 1.0, memory_k: int = 3):
        self.w = weights or Weights()
        self.lm_actor = lm_actor
        self.root = AgentConfig(temperature=temperature)
        self.memory = CrossEpisodeMemory()
        self.memory_k = memory_k
        self.last_extra: dict = {}

    def begin_episode(self) -> AgentConfig:
        return self.root

    def examples(self, sit: Situation) -> list:
        return []

    def bonus(self, chi: AgentConfig, sit: Situation) -> np.ndarray:
        return np.zeros(len(sit.admissible))

    def logits(self, chi: AgentConfig, sit: Situation) -> np.ndarray:
        if self.lm_actor is not None:
            base = self.lm_actor.logits(chi, sit, self.examples(sit))
        else:
            base = rule_logits(chi, sit, self.w)
        return base + self.bonus(chi, sit)

    def end_episode(self, result: dict) -> None:
        pass

    def state_dict(self) -> dict:
        return {"memory": self.memory.state_dict()}

    def load_state_dict(self, d: dict) -> None:
        self.memory.load_state_dict(d["memory"])


def memory_bonus(agent: Agent, sit: Situation) -> np.ndarray:
    """+w_memory * similarity for admissible commands of retrieved positives (the LM actor reads them in the prompt)."""
    z = np.zeros(len(sit.admissible))
    if agent.lm_actor is not None:
        return z
    index = {a: j for j, a in enumerate(sit.admissible)}
    for sim, p in agent.examples(sit):
        if p.action in index:
            j = index[p.action]
            z[j] = max(z[j], agent.w.memory * sim)
    return z


def log_positives(memory: CrossEpisodeMemory, transcript: list[dict]) -> None:
    for s in transcript:
        if s["reward"] > 0:
            memory.add_positive(s["state"] + " " + s.get("obs_before", ""), s["action"], s["reward"])


def log_negative(memory: CrossEpisodeMemory, transcript: list[dict]) -> list[tuple[str, str]] | None:
    start = detect_loop([s["action"] for s in transcript], [s["reward"] for s in transcript])
    if start is None:
        return None
    seg = [(s["state"], s["action"]) for s in transcript[start:]]
    memory.add_negative(seg)
    return seg


class MemoryAgent(Agent):
    def examples(self, sit):
        return self.memory.retrieve(sit.state + " " + sit.obs, self.memory_k)

    def bonus(self, chi, sit):
        return memory_bonus(self, sit)

    def end_episode(self, result):
        log_positives(self.memory, result["transcript"])


class ReflectionAgent(Agent):
    """Reflexion-style: the last episode's loop becomes 'avoid' advice for the next episode (replacing older advice)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.advice = AgentConfig(temperature=self.root.temperature)

    def begin_episode(self):
        return self.advice

    def end_episode(self, result):
        seg = log_negative(self.memory, result["transcript"])
        advice = AgentConfig(temperature=self.root.temperature)
        if seg:
            advice.avoid = sorted({(s, a) for s, a in seg if seg.count((s, a)) >= 2})
        self.advice = advice

    def state_dict(self):
        return {**super().state_dict(), "advice": self.advice.state_dict()}

    def load_state_dict(self, d):
        super().load_state_dict(d)
        self.advice = AgentConfig.from_dict(d["advice"])


class SummaryAgent(Agent):
    """A summary of the last episode (the actions that raised its score) as advice, not tied to a state."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.useful: list[str] = []

    def begin_episode(self):
        chi = self.root.copy()
        chi.prompt = ("Summary of the last episode: these actions raised the score: " + "; ".join(self.useful)
                      if self.useful else "")
        return chi

    def bonus(self, chi, sit):
        if self.lm_actor is not None:
            return np.zeros(len(sit.admissible))
        return np.array([self.w.memory * (a in self.useful) for a in sit.admissible], dtype=float)

    def end_episode(self, result):
        self.useful = [s["action"] for s in result["transcript"] if s["reward"] > 0]

    def state_dict(self):
        return {**super().state_dict(), "useful": self.useful}

    def load_state_dict(self, d):
        super().load_state_dict(d)
        self.useful = list(d["useful"])


class RAGAgent(Agent):
    """Retrieval over every step of every past transcript (not only score-raising ones), weighted by return-to-go."""

    def __init__(self, gamma: float = 0.9, **kw):
        super().__init__(**kw)
        self.gamma = gamma
        self.steps: list[tuple[str, str, float]] = []  # (state text, action, discounted return-to-go)
        self._tok: list[frozenset] = []

    def retrieve(self, sit):
        q = tokens(sit.state + " " + sit.obs)
        sims = [(jaccard(q, t), i) for i, t in enumerate(self._tok)]
        sims.sort(reverse=True)
        return [(s, self.steps[i]) for s, i in sims[:self.memory_k * 3] if s > 0]

    def examples(self, sit):
        from .memory import Positive

        return [(s, Positive(st, a, int(g > 0))) for s, (st, a, g) in self.retrieve(sit) if g > 0][:self.memory_k]

    def bonus(self, chi, sit):
        z = np.zeros(len(sit.admissible))
        if self.lm_actor is not None:
            return z
        index = {a: j for j, a in enumerate(sit.admissible)}
        for sim, (_, a, g) in self.retrieve(sit):
            if a in index and g > 0:
                z[index[a]] = max(z[index[a]], self.w.memory * sim * min(1.0, g))
        return z

    def end_episode(self, result):
        tr = result["transcript"]
        g = 0.0
        rtg = []
        for s in reversed(tr):
            g = s["reward"] + self.gamma * g
            rtg.append(g)
        for s, r in zip(tr, reversed(rtg), strict=True):
            text = s["state"] + " " + s.get("obs_before", "")
            self.steps.append((text, s["action"], float(r)))
            self._tok.append(tokens(text))

    def state_dict(self):
        return {**super().state_dict(), "steps": [list(x) for x in self.steps]}

    def load_state_dict(self, d):
        super().load_state_dict(d)
        self.steps = [tuple(x) for x in d["steps"]]
        self._tok = [tokens(s) for s, _, _ in self.steps]


class QLearningAgent(Agent):
    """Online tabular Q-learning across episodes: Q(s,a) += lr (r + gamma max_a' Q(s',a') - Q(s,a)), epsilon-greedy."""

    def __init__(self, lr: float = 0.5, gamma: float = 0.95, epsilon: float = 0.2, **kw):
        super().__init__(**kw)
        self.lr, self.gamma, self.epsilon = lr, gamma, epsilon
        self.q: dict[str, float] = {}

    def _k(self, key: str, a: str) -> str:
        return key + " ## " + a

    def logits(self, chi, sit):
        # epsilon-greedy as logits: the greedy command gets +inf-like weight with prob 1-epsilon (sampled by the actor)
        q = np.array([self.q.get(self._k(situation_key(sit), a), 0.0) for a in sit.admissible])
        z = np.zeros(len(q))
        best = np.flatnonzero(q == q.max())
        z[best] = np.log((1 - self.epsilon) * len(q) / len(best) + self.epsilon) - np.log(self.epsilon)
        return z * chi.temperature  # undo the actor's temperature: softmax(z / T) is exactly epsilon-greedy

    def end_episode(self, result):
        tr = result["transcript"]
        keys = [s["situation"] for s in tr]
        for t, s in enumerate(tr):
            k = self._k(keys[t], s["action"])
            nxt = 0.0
            if t + 1 < len(tr):
                nxt = max(self.q.get(self._k(keys[t + 1], a), 0.0) for a in tr[t + 1]["admissible"])
            target = s["reward"] + self.gamma * nxt * (not (t + 1 == len(tr) and result["done"]))
            self.q[k] = self.q.get(k, 0.0) + self.lr * (target - self.q.get(k, 0.0))

    def state_dict(self):
        return {**super().state_dict(), "q": self.q}

    def load_state_dict(self, d):
        super().load_state_dict(d)
        self.q = dict(d["q"])


class PolicyGradientAgent(Agent):
    """REINFORCE on theta[hash(situation, command)] added to the actor's scores (rule or LM); theta is trained by the
    LightningModule's optimizer: loss = -sum_t (G_t - mean G) log pi(a_t | s_t)."""

    def __init__(self, theta: torch.nn.Parameter, gamma: float = 0.95, **kw):
        super().__init__(**kw)
        self.theta, self.gamma = theta, gamma
        self.steps: list[tuple[np.ndarray, np.ndarray, int, float]] = []

    def buckets(self, sit) -> np.ndarray:
        key = situation_key(sit)
        return np.array([zlib.crc32(f"{key} ## {a}".encode()) % self.theta.numel() for a in sit.admissible])

    def logits(self, chi, sit):
        base = super().logits(chi, sit)
        b = self.buckets(sit)
        self.steps.append((base, b, -1, chi.temperature))
        return base + self.theta.detach().numpy()[b]

    def record_choice(self, j: int) -> None:
        base, b, _, temp = self.steps[-1]
        self.steps[-1] = (base, b, j, temp)

    def loss(self, result) -> torch.Tensor:
        rewards = [s["reward"] for s in result["transcript"]]
        g, ret = 0.0, []
        for r in reversed(rewards):
            g = r + self.gamma * g
            ret.append(g)
        ret = torch.tensor(ret[::-1], dtype=torch.float32)
        adv = ret - ret.mean() if len(ret) > 1 else ret
        total = torch.zeros(())
        for (base, b, j, temp), a in zip(self.steps, adv, strict=True):
            z = (torch.as_tensor(base, dtype=torch.float32) + self.theta[torch.as_tensor(b)]) / temp
            total = total - a * torch.log_softmax(z, 0)[j]
        self.steps = []
        return total


class EvoTestAgent(Agent):
    """EvoTest: evolve the whole configuration between episodes on a UCB tree; log positives and negatives."""

    def __init__(self, evolver=None, c: float = 1.0, alpha: float = 0.8, drop_threshold: float = 50.0,
                 distill_win: bool = True, **kw):
        super().__init__(**kw)
        self.evolver = evolver or TranscriptEvolver()
        self.tree = EvolutionTree(self.root, c, alpha, drop_threshold, distill_win)
        self.current = 0
        self.evolve_seconds = 0.0
        self.action = "play"

    def begin_episode(self):
        import time

        kind, i = self.tree.choose()
        self.action = kind
        t0 = time.perf_counter()
        if kind == "evolve":
            parent = self.tree.nodes[i]
            # improvement = the parent beat every configuration played before it (the evolver cools after one)
            best_before = max((n.score for n in self.tree.nodes[:i] if n.score is not None), default=-1.0)
            child = self.evolver(parent.config, parent.transcript, parent.score, best_before, self.memory.negatives)
            i = self.tree.add_child(i, child)
        self.evolve_seconds = time.perf_counter() - t0
        self.current = i
        return self.tree.nodes[i].config

    def examples(self, sit):
        return self.memory.retrieve(sit.state + " " + sit.obs, self.memory_k)

    def bonus(self, chi, sit):
        return memory_bonus(self, sit)

    def end_episode(self, result):
        tr = result["transcript"]
        log_positives(self.memory, tr)
        log_negative(self.memory, tr)
        slim = [{k: s[k] for k in ("state", "action", "obs", "reward", "score", "admissible", "obs_before", "done", "won")}
                for s in tr]
        self.tree.record(self.current, result["score"], result["won"], slim)

    def state_dict(self):
        return {**super().state_dict(), "tree": self.tree.state_dict(), "current": self.current}

    def load_state_dict(self, d):
        super().load_state_dict(d)
        self.tree.load_state_dict(d["tree"])
        self.current = d["current"]


def make_agent(name: str, theta: torch.nn.Parameter | None = None, **kw) -> Agent:
    if name not in AGENTS:
        raise ValueError(f"agent must be one of {AGENTS}, got {name!r}")
    evo_kw = {k: kw.pop(k) for k in ("evolver", "c", "alpha", "drop_threshold", "distill_win") if k in kw}
    classes = {"static": Agent, "memory": MemoryAgent, "reflection": ReflectionAgent, "summary": SummaryAgent,
               "rag": RAGAgent, "qlearning": QLearningAgent}
    if name == "pg":
        return PolicyGradientAgent(theta, **kw)
    if name == "evotest":
        return EvoTestAgent(**evo_kw, **kw)
    return classes[name](**kw)
