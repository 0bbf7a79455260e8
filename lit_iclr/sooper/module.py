"""SOOPER: safe online exploration from an offline policy prior (Wendl, As, Prajapat, Pollak, Coros, Krause; ICLR 2026).

One LightningModule, one code path for SOOPER and its baselines (`filter`, `lagrangian`, `learn`):

1. **Prior** (once, at fit start): from the offline dataset, pi_hat by BC-Safe and its critics Q_r^{pi_hat},
   Q_c^{pi_hat} by fitted Q evaluation (targets use pi_hat(s')); K heads each, Q_c fitted and read as an upper bound.
2. Per training step = one **real episode**, acted by pi (SAC) through the **shield**: execute a ~ pi(s) only if
   C_t + gamma_c^t Q_c(s, a) < d, else pi_hat(s) (`filter: sooper`; `advantage` is SAILR's rule, `none` no shield).
3. Then: fit the **dynamics ensemble** on the real replay; **imagine** rollouts from replay states in the optimistic,
   terminating planning MDP (`planning.imagine`); **SAC** on the imagined transitions; the prior's cost critic updated
   on real data by the authors' pessimistic cost update: target = min(c + gamma_c Q_c(s', pi_hat(s')), Q_c(s, a))
   (positive costs): Q_c starts as a conservative offline estimate and real data can only lower it, which expands the
   set of actions the shield lets through (`cost_update: max` keeps the opposite rule, measured in the card).
4. **Validation** (once, after the real episodes): the deterministic pi through the same shield and the prior alone on
   the same held-out reset seeds; logged as `val/return` vs `val/return_prior`, the discounted cost vs `val/budget`, and
   the intervention rate of the first and last real episodes (the paper's claim: it decays as Q_c is corrected).
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch
import torch.nn.functional as F

from lit_iclr.core import BaseModule
from lit_iclr.core.errors import ConfigError
from lit_iclr.core.functional_adam import adam_state
from lit_iclr.core.summary import Headline
from lit_iclr.core.threads import CpuThreads

from .functional import Methods, make_update, total
from .nets import Critics, DeterministicPolicy, DynamicsEnsemble, TanhGaussianActor
from .planning import FILTERS, PlanningConfig, aggregate_cost, imagine, imagine_step, unsafe_mask


def polyak(target: torch.nn.Module, source: torch.nn.Module, tau: float) -> None:
    """target <- target + tau (source - target), every tensor in one foreach call (the same lerp per tensor)."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


COST_UPDATES = ("min", "max")


def pessimistic_cost_target(cost: torch.Tensor, q_next: torch.Tensor, q_old: torch.Tensor, gamma_c: float,
                            rule: str = "min") -> torch.Tensor:
    """The online target of the prior's cost critic on a real transition (s, a, c, s').

    `min` (default) is the authors' PessimisticCostUpdate (yardenas/safe-sim2real,
    `ss2r/algorithms/sac/q_transforms.py`): min(c + gamma_c Q_c(s', pi_hat(s')), Q_c(s, a)) with positive costs
    (their shield `ss2r/algorithms/mbpo/safety_filters.py` compares accumulated_cost + Q_c with the budget). Q_c starts
    conservative (the offline fit is an upper estimate) and a real transition can only lower it towards the one-step
    backup of what actually happened, so actions the data show to be cheap become admissible: the safe set expands.
    `max` is the opposite rule (real data can only raise the estimate, so the shield can only tighten)."""
    if rule == "min":
        return torch.minimum(cost + gamma_c * q_next, q_old)
    if rule == "max":
        return torch.maximum(cost + gamma_c * q_next, q_old)
    raise ConfigError(f"cost_update must be one of {COST_UPDATES}, got {rule!r}")


class SOOPER(BaseModule):
    # refused before any process starts when the Trainer asks for more (core/ddp.py); the card says why
    single_process_reason = ("online RL on one stream of real episodes: each step acts an episode with the policy the "
                             "previous steps made, then runs hundreds of small-network updates on all episodes so far")

    def __init__(self, obs_dim: int, action_dim: int, budget: float = 5.0, filter: str = "sooper",
                 lagrangian: bool = False, learn: bool = True, optimism: float = 0.1, pessimism: float = 1.0,
                 discount: float = 0.99, cost_discount: float = 0.99, cost_kappa: float = 1.0, cost_margin: float = 0.0,
                 cost_fqe_target: str = "pessimistic", cost_update: str = "min", prior_tau: float = 0.01,
                 prior_path: str | None = None,
                 undiscounted_phi: bool = False,
                 advantage_threshold: float = 0.1, ensemble_size: int = 5, model_hidden: list[int] | None = None,
                 actor_hidden: list[int] | None = None, critic_hidden: list[int] | None = None, critic_heads: int = 2,
                 horizon: int = 10, num_rollouts: int = 400, model_updates: int = 100, sac_updates: int = 100,
                 prior_steps: int = 2000, prior_cost_updates: int = 20, model_buffer: int = 50_000,
                 offline_in_model: bool = True, model_pretrain_steps: int = 1000,
                 warm_start: bool = True, init_alpha: float = 0.02, lagrange_lr: float = 0.05, tau: float = 0.005,
                 lr_actor: float = 3e-4, lr_critic: float = 3e-4, lr_model: float = 1e-3, lr_prior: float = 1e-3,
                 eval_episodes: int = 5, seed: int = 0, num_threads: int | None = 1, compile_update: bool = False,
                 compile_options: dict | None = None):
        """
        Args:
            obs_dim: Observation size (linked from the data).
            action_dim: Action size (linked from the data).
            budget: d, the bound on the discounted episode cost sum_t gamma_c^t c_t.
            filter: `sooper` (C_t + gamma_c^t Q_c(s, a) < d), `advantage` (SAILR: Q_c(s,a) - Q_c(s,pi_hat(s)) <=
                threshold) or `none` (unshielded).
            lagrangian: SAC-Lagrangian: reward r - lambda c with lambda raised by dual ascent on (J_c - d).
            learn: False acts with the prior only (the "prior" baseline).
            optimism: lambda_opt, reward bonus per unit of ensemble disagreement.
            pessimism: lambda_pess, cost bonus per unit of ensemble disagreement.
            discount: gamma of the reward.
            cost_discount: gamma_c of the cost (constraint and prior cost critic).
            cost_kappa: Q_c^{pi_hat} used as mean + kappa * std over its heads (pessimism about the prior's own cost).
            cost_margin: Explicit margin added to Q_c^{pi_hat} where the filter reads it (real shield and imagined
                termination), so that it upper-bounds the prior's real cost-to-go.
            cost_fqe_target: Offline fitted-Q target of Q_c^{pi_hat}: `pessimistic` (every head regresses on
                c + gamma_c (mean + kappa std of the target heads at (s', pi_hat(s'))), heads on Bayesian-bootstrap
                weights of the data) or `per_head` (each head bootstraps on itself: an unbiased but not an upper estimate).
            cost_update: Online update of Q_c^{pi_hat} on real transitions: `min` (the authors' PessimisticCostUpdate:
                min(c + gamma_c Q_c(s', pi_hat(s')), Q_c(s, a)), real data can only lower the conservative estimate)
                or `max` (the opposite: real data can only raise it).
            prior_tau: Polyak rate of the prior critics' targets during the offline fit (larger: faster FQE propagation
                of the cost over the effective horizon 1 / (1 - gamma_c)).
            prior_path: File caching the fitted prior (pi_hat, Q_r, Q_c, and the warm-started actor): loaded with
                `torch.load(weights_only=True)` when it exists (no refit), written after the fit otherwise. null: no cache.
            undiscounted_phi: Shield on Phi = C_t + Q_c (the authors' code; more conservative) instead of the exact
                C_t + gamma_c^t Q_c.
            advantage_threshold: Threshold of the advantage filter.
            ensemble_size: Dynamics ensemble members E.
            model_hidden: Hidden widths of each dynamics member.
            actor_hidden: Hidden widths of the SAC actor and the prior policy.
            critic_hidden: Hidden widths of every critic (SAC's and the prior's).
            critic_heads: Heads K per critic.
            horizon: Imagined rollout length.
            num_rollouts: Imagined rollouts per training step (started from real replay states).
            model_updates: Dynamics-model gradient steps per training step.
            sac_updates: SAC gradient steps (critic + actor + temperature) per training step.
            prior_steps: Offline gradient steps for the prior (BC policy and FQE critics).
            prior_cost_updates: Pessimistic Q_c^{pi_hat} updates on real data per training step.
            model_buffer: Capacity of the imagined-transition buffer (FIFO).
            offline_in_model: Fit the dynamics model on the offline data as well as the real replay, and start imagined
                rollouts from both (offline rows start with C = 0). The offline data come from the same system here.
            model_pretrain_steps: Dynamics-model gradient steps at fit start on the offline data (with offline_in_model).
            warm_start: Initialise SAC's actor by behaviour cloning and its critic from Q_r^{pi_hat}.
            init_alpha: Initial SAC temperature (tuned to the target entropy -action_dim).
            lagrange_lr: Dual step size of the Lagrangian baseline.
            tau: Polyak rate of the target critics.
            lr_actor: Adam learning rate of the actor.
            lr_critic: Adam learning rate of SAC's critic and the temperature.
            lr_model: Adam learning rate of the dynamics ensemble.
            lr_prior: Adam learning rate of the prior (offline) and its online cost update.
            eval_episodes: Episodes of the validation (deterministic pi through the same filter, and the prior alone on
                the same reset seeds).
            seed: Seed of action sampling, imagined rollouts and minibatches.
            num_threads: torch intra-op threads of the run (`torch.set_num_threads`): the networks are 16-128 units wide
                and each update is tiny, so one thread is fastest, and extra threads only spin on a shared CPU
                (the default run used 25x more CPU time with torch's default threads at load ~20 on 2 cores).
                null: leave torch's setting.
            compile_update: `torch.compile` the learning cycle: each update (dynamics model, prior cost critic, SAC
                critic, actor with temperature) one graph of loss, gradient, Adam step and Polyak update
                (`functional.py`), each imagined step one graph (`planning.imagine_step`). The networks are tiny, so
                the eager cycle is bound by per-operation cost; compiled it takes 0.40x the CPU time at the default
                widths (card, "Speed against the authors' code"). The first cycle compiles (~50 s on one CPU core,
                needs a C++ compiler); the numbers equal the eager ones to float rounding (tests/sooper/test_compile.py).
            compile_options: Keyword arguments of `torch.compile` (default: static shapes for the updates and
                inductor's C++ wrapper; a `mode`, `options` or `backend` given here replaces the wrapper option).
        """
        super().__init__()
        if filter not in FILTERS:
            raise ConfigError(f"filter must be one of {FILTERS}, got {filter!r}")
        if cost_fqe_target not in ("pessimistic", "per_head"):
            raise ConfigError(f"cost_fqe_target must be 'pessimistic' or 'per_head', got {cost_fqe_target!r}")
        if cost_update not in COST_UPDATES:
            raise ConfigError(f"cost_update must be one of {COST_UPDATES}, got {cost_update!r}")
        self.save_hyperparameters()
        self._threads = CpuThreads(num_threads)  # core/threads.py: set at fit start, restored in teardown
        self.automatic_optimization = False
        actor_hidden, critic_hidden = actor_hidden or [64, 64], critic_hidden or [128, 128]
        self.prior = DeterministicPolicy(obs_dim, action_dim, actor_hidden)
        self.prior_reward = Critics(obs_dim, action_dim, critic_hidden, critic_heads)
        self.prior_cost = Critics(obs_dim, action_dim, critic_hidden, critic_heads)
        self.prior_cost_target = copy.deepcopy(self.prior_cost).requires_grad_(False)
        self.actor = TanhGaussianActor(obs_dim, action_dim, actor_hidden)
        self.critic = Critics(obs_dim, action_dim, critic_hidden, critic_heads)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.nn.Parameter(torch.tensor(float(np.log(init_alpha))))
        self.model = DynamicsEnsemble(obs_dim, action_dim, model_hidden or [128, 128], ensemble_size)
        self.register_buffer("prior_ready", torch.tensor(False))
        self.register_buffer("model_pretrained", torch.tensor(False))  # the offline dynamics warm-up is done
        self.register_buffer("lagrange", torch.tensor(0.0))
        self.register_buffer("violations", torch.tensor(0))
        self.register_buffer("real_steps", torch.tensor(0))
        self.replay: dict[str, torch.Tensor] = {}
        self.offline: dict[str, torch.Tensor] = {}
        self.imagined: dict[str, torch.Tensor] = {}
        self.interventions: list[float] = []  # intervention rate of every real episode, in order (checkpointed)
        self.final: dict[str, float] = {}
        self._compiled: dict[str, object] = {}  # compile_update: the compiled functions, made on first use
        self._warm: set[str] = set()  # ... and those that have run once with their guards checked
        self.gen = torch.Generator().manual_seed(seed)
        self.np_rng = np.random.default_rng(seed)

    # ------------------------------------------------------------------------------------------------- plumbing
    def configure_optimizers(self):
        h = self.hparams
        # foreach: one call per Adam operation over all of a network's tensors (bit-equal to the per-tensor loop, which
        # torch picks on CPU; the per-tensor loop cost more than the arithmetic at these widths)
        adam = lambda params, lr, **kw: torch.optim.Adam(params, lr, foreach=True, **kw)
        return [adam(self.actor.parameters(), h.lr_actor),
                adam(self.critic.parameters(), h.lr_critic),
                adam([self.log_alpha], h.lr_critic),
                adam(self.model.parameters(), h.lr_model, weight_decay=1e-5),
                adam(self.prior_cost.parameters(), h.lr_prior)]

    def planning_config(self) -> PlanningConfig:
        h = self.hparams
        return PlanningConfig(horizon=h.horizon, optimism=h.optimism, pessimism=h.pessimism, cost_discount=h.cost_discount,
                              filter=h.filter, budget=h.budget, advantage_threshold=h.advantage_threshold,
                              cost_kappa=h.cost_kappa, cost_margin=h.cost_margin,
                              penalty=float(self.lagrange) if h.lagrangian else 0.0, undiscounted_phi=h.undiscounted_phi)

    def _update(self, name: str, opts: list, method: str, inputs: tuple, targets: tuple = (), repeat: bool = False):
        """One step of the optimizers `opts` on the loss `getattr(self, method)(*inputs)` (a tensor, or a tuple whose
        sum is minimised), then `polyak(target, source, tau)` for each of `targets`; returns the loss output, detached.

        Eager: zero_grad, backward, `opt.step()`. With `compile_update`, once the optimizers have state (after the first,
        eager step): one compiled graph of loss, gradient, Adam and Polyak (`functional.make_update`), made on first use
        and kept under `name`. `repeat`: the same update as the call before it in this loop of updates (same optimizers,
        hyperparameters, networks and input shapes; only tensor values differ), so dynamo's guards, which the first
        update of the loop checked, are not evaluated again (`skip_guard_eval_unsafe`: about a fifth of the compiled
        cycle at the default widths, ~1000 guards per update); a loop's first update is always checked in full."""
        raw = [getattr(o, "optimizer", o) for o in opts]  # a LightningOptimizer's torch optimizer
        states = [adam_state(o) for o in raw] if self.hparams.compile_update else [None]
        if any(st is None for st in states):
            out = getattr(self, method)(*inputs)
            for opt in opts:
                opt.zero_grad()
            self.manual_backward(total(out))
            for opt in opts:
                opt.step()
            for target, source, tau in targets:
                polyak(target, source, tau)
            return out.detach() if isinstance(out, torch.Tensor) else tuple(o.detach() for o in out)
        if name not in self._compiled:
            methods = self.__dict__.setdefault("_methods", Methods(self))  # not a submodule (no cycle)
            names = {id(p): f"owner.{n}" for n, p in self.named_parameters()}
            fn = make_update(methods, [names[id(p)] for st in states for (lists, _) in st for p in lists[0]], method,
                             targets)
            # static shapes: the batch and network sizes are fixed, a shape change recompiles rather than generalises
            self._compiled[name] = torch.compile(fn, **self._compile_options(dynamic=False))
        if repeat and name in self._warm:  # the graph exists and the previous call of this loop checked its guards
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                out = self._compiled[name](states, *inputs)
        else:
            out = self._compiled[name](states, *inputs)
            self._warm.add(name)
        for opt in opts:  # Lightning's step counter (global_step), as `opt.step()` of a LightningOptimizer counts it
            if hasattr(opt, "_on_before_step"):
                self.count_optimizer_steps(opt)
        return out

    def _compile_options(self, **defaults) -> dict:
        """`torch.compile` keyword arguments: `defaults`, inductor's C++ wrapper (each graph's kernels called from C++,
        not Python: 0.96x of the cycle at the default widths, one process, 8 alternating blocks), then the user's
        `compile_options` (a `mode` or `options` of theirs, or another backend, replaces the C++ wrapper)."""
        user = self.hparams.compile_options or {}
        own = "mode" in user or "options" in user or user.get("backend", "inductor") != "inductor"
        base = {} if own else {"options": {"cpp_wrapper": True}}
        return {**defaults, **base, **user}

    def _imagine_step(self):
        """`planning.imagine_step` for one cycle's rollouts; with `compile_update` compiled (shapes automatic: the live
        rollouts shrink as they terminate, so after the first size change one graph serves every size), the guards
        checked on the cycle's first step and again whenever the number of live rollouts changes, not on a step of the
        same size as the one before it (only tensor values differ). The Lagrangian's penalty, which changes every
        episode, is applied outside it."""
        if not self.hparams.compile_update:
            return imagine_step
        if "imagine" not in self._compiled:
            self._compiled["imagine"] = torch.compile(imagine_step, **self._compile_options())
        fn, last = self._compiled["imagine"], {}

        def step(cfg, model, actor, prior, prior_cost, s, *rest):
            if last.get("size") == s.shape[0]:
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    return fn(cfg, model, actor, prior, prior_cost, s, *rest)
            last["size"] = s.shape[0]
            return fn(cfg, model, actor, prior, prior_cost, s, *rest)

        return step

    def _batch(self, data: dict[str, torch.Tensor], size: int, members: int | None = None,
               gen: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        n = len(next(iter(data.values())))
        shape = (size,) if members is None else (members, size)
        idx = torch.randint(n, shape, generator=self.gen if gen is None else gen)
        return {k: v[idx] for k, v in data.items()}

    def on_save_checkpoint(self, checkpoint) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["sooper_replay"] = self.replay
        checkpoint["sooper_interventions"] = list(self.interventions)
        # the minibatch / bootstrap / episode generators: a resumed run draws what the uninterrupted one drew next
        checkpoint["sooper_rng"] = {"torch": self.gen.get_state(), "numpy": self.np_rng.bit_generator.state}
        checkpoint["sooper_imagined"] = self.imagined  # the model-rollout buffer the SAC updates sample from

    def on_load_checkpoint(self, checkpoint) -> None:
        super().on_load_checkpoint(checkpoint)
        # checkpoints written before the flag existed: a run that had taken a step had done its warm-up
        checkpoint["state_dict"].setdefault("model_pretrained", torch.tensor(checkpoint.get("global_step", 0) > 0))
        self.replay = checkpoint.get("sooper_replay", {})
        self.interventions = list(checkpoint.get("sooper_interventions", []))
        self.imagined = checkpoint.get("sooper_imagined", {})
        rng = checkpoint.get("sooper_rng")
        if rng is not None:
            self.gen.set_state(rng["torch"])
            self.np_rng.bit_generator.state = rng["numpy"]

    # ----------------------------------------------------------------------------------------------- the prior
    def teardown(self, stage: str) -> None:
        self._threads.exit()

    def on_fit_start(self) -> None:
        self._threads.enter(self)
        dm = self.trainer.datamodule
        self.env = dm.make_env()
        self.batch_size = dm.batch_size
        if not bool(self.prior_ready):
            self.load_or_fit_prior(dm.transitions, dm.batch_size)
        if self.hparams.offline_in_model and self.hparams.learn:
            t = dm.transitions
            n = len(t["rewards"])
            self.offline = {"observations": t["observations"], "actions": t["actions"], "rewards": t["rewards"],
                            "costs": t["costs"], "next_observations": t["next_observations"],
                            "cum_cost": torch.zeros(n), "disc": torch.ones(n)}
            # a flag restored with the weights, not `global_step`: Lightning calls on_fit_start before it restores the
            # loops, so a resumed fit read global_step 0 and warmed the restored model up a second time
            if not bool(self.model_pretrained):
                self.update_model(self.optimizers(), self.hparams.model_pretrain_steps)
                self.model_pretrained.fill_(True)

    PRIOR_NETS = ("prior", "prior_reward", "prior_cost", "prior_cost_target", "actor", "critic", "critic_target")
    PRIOR_STREAM = 104_729  # offset of the offline fit's generator seed from `seed`

    def load_or_fit_prior(self, data: dict[str, torch.Tensor], batch_size: int) -> None:
        """The offline prior, from `prior_path` when that file exists (the same prior for every run that names it)."""
        from pathlib import Path

        path = None if self.hparams.prior_path is None else Path(self.hparams.prior_path)
        if path is not None and path.exists():
            state = torch.load(path, map_location="cpu", weights_only=True)
            for name in self.PRIOR_NETS:
                getattr(self, name).load_state_dict(state[name])
            self.prior_ready.fill_(True)
            return
        self.fit_prior(data, self.hparams.prior_steps, batch_size)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save({name: getattr(self, name).state_dict() for name in self.PRIOR_NETS}, tmp)
            tmp.replace(path)  # complete files only

    def fit_prior(self, data: dict[str, torch.Tensor], steps: int, batch_size: int) -> None:
        """pi_hat by behaviour cloning of the safe episodes (BC-Safe, `data["safe"]`); Q_r^{pi_hat}, Q_c^{pi_hat} by fitted
        Q evaluation of pi_hat on all the offline data (costly episodes included, so Q_c sees the constraint).

        Q_c^{pi_hat} must upper-bound the prior's real cost-to-go for the shield to be safe (the paper's premise). With
        `cost_fqe_target: pessimistic` its heads regress on one shared pessimistic target c + gamma_c Qbar_c(s', pi_hat(s')),
        Qbar_c = mean + kappa std over the target heads, each head on its own Bayesian-bootstrap weights of the data (so
        the heads disagree where the data are thin, and kappa turns that into extra cost); `cost_margin` is added where
        Q_c is read (shield, termination), not inside this target."""
        h = self.hparams
        # the offline fit draws from its own stream, so the online phase draws the same numbers whether this run fitted
        # the prior or loaded it from `prior_path` (else a benchmark's numbers depended on which run fitted it)
        gen = torch.Generator().manual_seed(h.seed + self.PRIOR_STREAM)
        reward_target = copy.deepcopy(self.prior_reward).requires_grad_(False)
        nets = [self.prior, self.prior_reward, self.prior_cost] + ([self.actor] if h.warm_start else [])
        opt = torch.optim.Adam([p for n in nets for p in n.parameters()], h.lr_prior, foreach=True)
        for _ in range(steps):
            b = self._batch(data, batch_size, gen=gen)
            s, a, s2, m = b["observations"], b["actions"], b["next_observations"], b["masks"]
            w = b["safe"][:, None] / b["safe"].sum().clamp_min(1.0)  # BC-Safe: clone the safe episodes only
            loss = (w * (self.prior(s) - a) ** 2).sum()
            if h.warm_start:
                loss = loss + (w * (self.actor(s, deterministic=True)[0] - a) ** 2).sum()
            with torch.no_grad():
                a2 = self.prior(s2)
                y_r = b["rewards"] + h.discount * m * reward_target(s2, a2).mean(0)
                q2 = self.prior_cost_target(s2, a2)  # [K, B]
                if h.cost_fqe_target == "pessimistic":  # shared upper target c + gamma_c (mean + kappa std); no margin
                    # here: a margin inside the target would compound to margin / (1 - gamma_c)
                    y_c = (b["costs"] + h.cost_discount * m * aggregate_cost(q2, h.cost_kappa)).expand_as(q2)
                else:  # each head on itself: keeps the heads apart, estimates the mean cost-to-go
                    y_c = b["costs"] + h.cost_discount * m * q2
                boot = -torch.rand(q2.shape, generator=gen).log()  # Exp(1) weights: a Bayesian bootstrap per head
            loss = loss + F.mse_loss(self.prior_reward(s, a), y_r.expand(h.critic_heads, -1))
            loss = loss + (boot * (self.prior_cost(s, a) - y_c) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            polyak(reward_target, self.prior_reward, h.prior_tau)
            polyak(self.prior_cost_target, self.prior_cost, h.prior_tau)
        if h.warm_start:
            self.critic.load_state_dict(self.prior_reward.state_dict())
            self.critic_target.load_state_dict(self.prior_reward.state_dict())
        self.prior_ready.fill_(True)

    # --------------------------------------------------------------------------------------------- real episodes
    @torch.no_grad()
    def act(self, obs: torch.Tensor, cum_cost: float, discount_t: float, deterministic: bool,
            prior_only: bool = False) -> tuple[np.ndarray, bool]:
        """The shielded action on the real system and whether the shield intervened (`prior_only`: pi_hat acts)."""
        if prior_only or not self.hparams.learn:
            return self.prior(obs[None])[0].numpy(), False
        a, _ = self.actor(obs[None], deterministic=deterministic)
        unsafe = unsafe_mask(self.planning_config(), obs[None], a, torch.tensor([cum_cost]), torch.tensor([discount_t]),
                             self.prior, self.prior_cost)
        if bool(unsafe[0]):
            return self.prior(obs[None])[0].numpy(), True
        return a[0].numpy(), False

    def run_episode(self, seed: int, deterministic: bool = False, record: bool = True,
                    prior_only: bool = False) -> dict[str, float]:
        h = self.hparams
        obs, _ = self.env.reset(seed=seed)
        rows = {k: [] for k in ("observations", "actions", "rewards", "costs", "next_observations", "cum_cost", "disc")}
        ret = cost = cum = 0.0
        disc, interventions, steps, done = 1.0, 0, 0, False
        while not done:
            o = torch.as_tensor(obs, dtype=torch.float32)
            a, intervened = self.act(o, cum, disc, deterministic, prior_only)
            nxt, r, term, trunc, info = self.env.step(a)
            c = info["cost"]
            if record:
                for k, v in zip(rows, (obs, a, r, c, nxt, cum, disc), strict=True):
                    rows[k].append(v)
            ret, cost, cum = ret + r, cost + c, cum + disc * c  # C_{t+1} = C_t + gamma_c^t c_t
            disc *= h.cost_discount
            interventions += intervened
            steps += 1
            obs, done = nxt, term or trunc
        if record:
            new = {k: torch.as_tensor(np.asarray(v), dtype=torch.float32) for k, v in rows.items()}
            self.replay = new if not self.replay else {k: torch.cat([self.replay[k], new[k]]) for k in new}
        return {"return": ret, "cost": cost, "discounted_cost": cum, "intervention_rate": interventions / steps,
                "steps": steps}

    # -------------------------------------------------------------------------------------------------- updates
    def model_data(self) -> dict[str, torch.Tensor]:
        """Real transitions the dynamics model learns from and imagined rollouts start at: replay (+ offline data)."""
        if not self.offline:
            return self.replay
        if not self.replay:
            return self.offline
        return {k: torch.cat([self.offline[k], self.replay[k]]) for k in self.replay}

    def update_model(self, opts, steps: int | None = None) -> float:
        h, rp = self.hparams, self.model_data()
        target = torch.cat([rp["next_observations"] - rp["observations"], rp["rewards"][:, None], rp["costs"][:, None]], -1)
        self.model.set_normalizer(torch.cat([rp["observations"], rp["actions"]], -1), target)
        data = {"s": rp["observations"], "a": rp["actions"], "y": target}
        loss = torch.tensor(0.0)
        for i in range(h.model_updates if steps is None else steps):
            b = self._batch(data, self.batch_size, members=h.ensemble_size)  # a bootstrap batch per member
            loss = self._update("model", [opts[3]], "model_loss", (b["s"], b["a"], b["y"]), repeat=i > 0)
        return float(loss)

    def model_loss(self, s: torch.Tensor, a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.model.loss(s, a, y)

    def update_prior_cost(self, opt) -> None:
        """Online update of Q_c^{pi_hat} on the real replay (`pessimistic_cost_target`, rule `cost_update`).

        As in the authors' PessimisticCostUpdate (`ss2r/algorithms/sac/q_transforms.py`, with the target network as
        `q_fn` in `ss2r/algorithms/mbpo/losses.py`): both the backup c + gamma_c Q_c(s', pi_hat(s')) and the old value
        Q_c(s, a) are read from the target heads, averaged over heads, and every head regresses on the one target."""
        h = self.hparams
        for i in range(h.prior_cost_updates):
            b = self._batch({k: self.replay[k] for k in ("observations", "actions", "next_observations", "costs")},
                            self.batch_size)  # the same rows as the whole replay's batch, only the columns used
            self._update("prior_cost", [opt], "prior_cost_loss",
                         (b["observations"], b["actions"], b["next_observations"], b["costs"]),
                         ((self.prior_cost_target, self.prior_cost, h.tau),), repeat=i > 0)

    def prior_cost_loss(self, s: torch.Tensor, a: torch.Tensor, s2: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
        h = self.hparams
        with torch.no_grad():
            q_next = self.prior_cost_target(s2, self.prior(s2)).mean(0)  # Q_c(s', pi_hat(s')), mean over heads
            q_old = self.prior_cost_target(s, a).mean(0)
            y = pessimistic_cost_target(cost, q_next, q_old, h.cost_discount, h.cost_update)
        return F.mse_loss(self.prior_cost(s, a), y.expand(h.critic_heads, -1))

    def sac_update(self, opts, b: dict[str, torch.Tensor], repeat: bool = False) -> dict[str, torch.Tensor]:
        """One SAC step (critic, actor, temperature) on imagined transitions.

        The policy's two Gaussian draws (at s' for the target, at s for the actor) are taken here, in the order the
        forwards took them before, so the losses are functions of their inputs that `compile_update` can compile."""
        h = self.hparams
        actor_opt, critic_opt, alpha_opt = opts[:3]
        shape = (b["obs"].shape[0], h.action_dim)
        noise_next, noise = torch.randn(shape), torch.randn(shape)
        critic_loss = self._update("critic", [critic_opt], "critic_loss",
                                   (b["obs"], b["action"], b["reward"], b["next_obs"], b["done"], noise_next), (),
                                   repeat)
        self.critic.requires_grad_(False)  # the actor's backward needs dQ/da, not the critic's weight gradients
        # the actor's and the temperature's losses in one backward: disjoint parameters (alpha is detached in the
        # actor's loss, log pi in the temperature's), so each gets the gradient of its own loss
        actor_loss, _ = self._update("actor", [actor_opt, alpha_opt], "actor_loss", (b["obs"], noise),
                                     ((self.critic_target, self.critic, h.tau),), repeat)
        self.critic.requires_grad_(True)
        return {"critic_loss": critic_loss, "actor_loss": actor_loss}

    def critic_loss(self, obs, action, reward, next_obs, done, noise_next) -> torch.Tensor:
        """SAC's critic loss: every head on r + gamma (1 - done) (min_k Qbar_k(s', a') - alpha log pi(a'|s'))."""
        h = self.hparams
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            a2, logp2 = self.actor(next_obs, noise=noise_next)
            q2 = self.critic_target(next_obs, a2).min(0).values - alpha * logp2
            y = reward + h.discount * (1 - done) * q2
        return F.mse_loss(self.critic(obs, action), y.expand(h.critic_heads, -1))

    def actor_loss(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SAC's actor loss E[alpha log pi(a|s) - mean_k Q_k(s, a)] and the temperature's, target entropy -|A|."""
        alpha = self.log_alpha.exp().detach()
        a, logp = self.actor(obs, noise=noise)
        actor_loss = (alpha * logp - self.critic(obs, a).mean(0)).mean()
        alpha_loss = -(self.log_alpha * (logp.detach() - self.hparams.action_dim)).mean()
        return actor_loss, alpha_loss

    def training_step(self, batch, batch_idx):
        h = self.hparams
        opts = self.optimizers()
        t0 = time.perf_counter()
        ep = self.run_episode(seed=h.seed * 1_000_003 + int(self.global_step) + 7 * int(self.real_steps))
        env_time = time.perf_counter() - t0
        self.real_steps += ep["steps"]
        self.interventions.append(ep["intervention_rate"])
        violated = ep["discounted_cost"] > h.budget
        self.violations += int(violated)
        if h.lagrangian:  # dual ascent on J_c - d
            self.lagrange.copy_((self.lagrange + h.lagrange_lr * (ep["discounted_cost"] - h.budget)).clamp_min(0.0))
        logs = {"train/return": ep["return"], "train/cost": ep["cost"], "train/discounted_cost": ep["discounted_cost"],
                "train/violation": float(violated), "train/violations": float(self.violations),
                "train/intervention_rate": ep["intervention_rate"], "train/real_steps": float(self.real_steps),
                "speed/env_steps_per_s": ep["steps"] / env_time}
        if h.learn:
            logs.update(self.learn(opts))
        self.log_dict(logs, on_step=True, on_epoch=False, batch_size=1)

    def learn(self, opts) -> dict[str, float]:
        """One model-learning + policy-update cycle on the data so far (after each real episode): fit the dynamics
        ensemble, update the prior's cost critic on real data, imagine rollouts in the planning MDP, SAC on them.
        `benchmarks/sooper_speed.py` times this against the authors' training step."""
        h = self.hparams
        logs = {"train/model_loss": self.update_model(opts)}
        if h.filter != "none":
            self.update_prior_cost(opts[4])
        t1 = time.perf_counter()
        start = self._batch(self.model_data(), h.num_rollouts)
        sim = imagine(self.planning_config(), self.model, self.actor, self.prior, self.prior_reward, self.prior_cost,
                      start["observations"], start["cum_cost"], start["disc"], self.gen, self._imagine_step())
        n_imagined = len(sim["reward"])
        logs["speed/imagined_per_s"] = n_imagined / (time.perf_counter() - t1)
        logs["train/imagined_termination_rate"] = sim["terminated"] / max(n_imagined, 1)
        new = {k: sim[k] for k in ("obs", "action", "reward", "next_obs", "done")}
        self.imagined = new if not self.imagined else {
            k: torch.cat([self.imagined[k], new[k]])[-h.model_buffer:] for k in new}
        for i in range(h.sac_updates):
            stats = self.sac_update(opts, self._batch(self.imagined, self.batch_size), repeat=i > 0)
        logs.update({f"train/{k}": float(v) for k, v in stats.items()})
        logs["train/alpha"] = float(self.log_alpha.detach().exp())
        logs["train/lagrange"] = float(self.lagrange)
        return logs

    # ----------------------------------------------------------------------------------------------- validation
    def on_validation_start(self) -> None:
        if not hasattr(self, "env"):  # `validate` without `fit`
            self.env = self.trainer.datamodule.make_env()

    def validation_step(self, batch, batch_idx) -> None:
        """The learner (deterministic pi through the same filter) and the prior alone, on the same held-out reset seeds
        (the prior baseline of the headline, computed in this run on this environment), and the intervention-rate trend
        of the real episodes so far (first vs last `TREND` episodes)."""
        h = self.hparams
        n = max(h.eval_episodes, 1)
        mine = [self.run_episode(seed=10_000 + i, deterministic=True, record=False) for i in range(n)]
        prior = [self.run_episode(seed=10_000 + i, deterministic=True, record=False, prior_only=True) for i in range(n)]
        mean = lambda eps, k: float(np.mean([e[k] for e in eps]))
        over = lambda eps: float(sum(e["discounted_cost"] > h.budget for e in eps))
        self.final = {k: mean(mine, k) for k in ("return", "cost", "discounted_cost", "intervention_rate")}
        self.final["violations"] = over(mine)
        logs = {f"val/{k}": v for k, v in self.final.items()}
        logs.update({"val/return_prior": mean(prior, "return"), "val/discounted_cost_prior": mean(prior, "discounted_cost"),
                     "val/violations_prior": over(prior), "val/budget": float(h.budget),
                     "val/train_violations": float(self.violations)})
        if self.interventions:
            k = min(self.TREND, len(self.interventions))
            logs["val/intervention_rate_first"] = float(np.mean(self.interventions[:k]))
            logs["val/intervention_rate_last"] = float(np.mean(self.interventions[-k:]))
        self.log_dict(logs, on_step=False, on_epoch=True, batch_size=1)

    TREND = 5  # real episodes averaged at each end of the intervention-rate trend

    def headline(self) -> Headline:
        return Headline(
            metric="{stage}/return", higher_is_better=True, baselines={"prior": "{stage}/return_prior"},
            claim="SOOPER ends above its prior while its discounted cost stays below the budget, with interventions "
                  "decaying over the real episodes",
            method="SOOPER",
            extra=("{stage}/discounted_cost", "{stage}/budget", "{stage}/violations", "{stage}/discounted_cost_prior",
                   "{stage}/train_violations", "{stage}/intervention_rate_first", "{stage}/intervention_rate_last"))
