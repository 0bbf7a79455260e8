"""VGF as a LightningModule: TD learning through value-gradient-flow particles, a flow-matching reference policy, and
evaluation rollouts in the real environment for every transport budget L in one pass.

One training step (manual optimisation, `agents/vgf.py` of the official code):

    a'_j ~ mu_theta(.|s'), j = 1..N                         reference particles (Euler-sampled flow policy)
    a'_j <- L_train SVGD steps toward exp(Q(s', .) / alpha)  value gradient flow (transport.py), Q = mean of the critics
    y = r + gamma m mean_j min_k Qbar_k(s', a'_j)            TD target through the moved particles (target critic)
    L_Q = sum_k (Q_k(s, a) - y)^2                            critic step, then Polyak target update
    L_mu = || v_theta(s, x_t, t) - (a - x_0) ||^2            reference-policy (behaviour cloning) flow-matching step

Acting: N particles from mu_theta(.|s), L_eval flow steps, the particle of highest Q. L_eval = 0 is best-of-N under Q.
"""
from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable, Sequence

import numpy as np
import torch
from lightning.pytorch.cli import OptimizerCallable

from lit_iclr.core import BaseModule
from lit_iclr.core.figures import log_figure, plt
from lit_iclr.core.functional_adam import adam_groups, adam_step
from lit_iclr.core.grad_sync import backward_and_average
from lit_iclr.core.onednn_linear import resolve_backend
from lit_iclr.core.summary import Headline
from lit_iclr.core.threads import CpuThreads

from .envs import Rollouts, evaluate
from .model import ActionGradient, Critic, FlowPolicy
from .transport import critic_score, select_best, transport


def _seed(*parts: int) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


def parse_policy(name: str) -> tuple[str, int]:
    """`L3` -> ("flow", 3) (the model's own transport), `ascent10` -> ("ascent", 10), `bc` -> ("bc", 0)."""
    m = re.fullmatch(r"(L|ascent)(\d+)|bc", name)
    if m is None:
        raise ValueError(f"unknown evaluation policy {name!r}: use L<steps>, ascent<steps> or bc")
    return ("bc", 0) if name == "bc" else ("flow" if m.group(1) == "L" else "ascent", int(m.group(2)))


def polyak(target: torch.nn.Module, source: torch.nn.Module, tau: float) -> None:
    """theta_bar <- tau theta + (1 - tau) theta_bar, all tensors in one fused call."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


class OfflineRLModule(BaseModule):
    """Shared evaluation of the offline RL methods: each validation batch of episode indices is rolled out in the
    DataModule's environment for every *group* (a policy variant such as a budget L), all groups in lock-step, and
    `val/<metric>_<group>` is logged for the score (success % or normalised return), return, success and Q estimate.
    """

    eval_envs_max = 8  # environments kept alive between evaluations (OGBench's take seconds to build)

    def __init__(self):
        super().__init__()
        self._envs: list = []
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))  # gradient steps taken (resume-exact RNG)
        self._host_updates: int | None = None  # host copy of `updates`: read from the device once per fit, not per step
        self._generator: torch.Generator | None = None

    # subclasses define the groups and how each acts
    def eval_groups(self) -> list[str]:
        raise NotImplementedError

    def act_groups(self, obs: torch.Tensor, groups: np.ndarray, generator: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions `[M, A]` and their Q estimate `[M]` for observations `[M, D]`, `groups[m]` indexing eval_groups()."""
        raise NotImplementedError

    def training_step(self, batch: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]], batch_idx: int) -> None:
        """One gradient step per minibatch: the batch is one, or a list of them (the data's `updates_per_batch`)."""
        minibatches = batch if isinstance(batch, list) else [batch]
        for i, minibatch in enumerate(minibatches):
            self._last_update_of_batch = i == len(minibatches) - 1
            self.update(minibatch)

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        """One gradient step of the method on one minibatch (manual optimisation)."""
        raise NotImplementedError

    def log_train(self, metrics, prog_bar=()) -> None:
        """As `BaseModule.log_train`; written to the loggers only after the last update of a Trainer batch."""
        super().log_train(metrics, prog_bar, flush=getattr(self, "_last_update_of_batch", True))

    def step_count(self) -> int:
        """Gradient steps taken, without a device sync: the buffer is read once, then a host copy is counted on."""
        if self._host_updates is None:
            self._host_updates = int(self.updates)
        return self._host_updates

    def count_step(self) -> None:
        """One more gradient step: the checkpointed buffer on the device and its host copy, no sync."""
        self.updates.add_(1)  # in place: `+=` on a module attribute would also go through Module.__setattr__
        self._host_updates = self.step_count() + 1

    def on_train_start(self) -> None:
        self._host_updates = None  # a checkpoint may have been restored into `updates`

    def on_load_checkpoint(self, checkpoint) -> None:
        super().on_load_checkpoint(checkpoint)
        self._host_updates = None

    def step_generator(self) -> torch.Generator:
        """RNG of this gradient step, a function of (seed, step): a resumed run draws the same numbers.

        The same on every rank: a step's random numbers are drawn for the global batch and each rank takes its rows
        (`rank_rows`). One generator is kept and reseeded (no new generator, no device sync, per step)."""
        if self._generator is None or self._generator.device != self.device:
            self._generator = torch.Generator(device=self.device)
        return self._generator.manual_seed(_seed(self.hparams.seed, 0, self.step_count()))

    def world(self) -> tuple[int, int]:
        """(processes, this one's rank) of the fit; (1, 0) without a Trainer."""
        trainer = self._trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def rank_rows(self, draw: Callable[[int], torch.Tensor], n: int) -> torch.Tensor:
        """This rank's `n` rows of `draw(n * world)`, the draw for the global batch: rows rank, rank + world, ... as the
        training loader deals the global batch's rows (`data.TransitionLoader`). So under DDP the ranks' noise together
        is one process's noise for the global batch. On one process: `draw(n)`."""
        world, rank = self.world()
        return draw(n) if world == 1 else draw(n * world)[rank::world]

    def batch_mean(self, value: torch.Tensor) -> torch.Tensor:
        """A per-minibatch mean (detached) over the global batch: under DDP the mean of the ranks' means (their shares
        are equally large), as one process with the global batch computes it; `value` itself on one process."""
        value = value.detach()
        return value if self.world()[0] == 1 else self.trainer.strategy.reduce(value.clone(), reduce_op="mean")

    def manual_backward(self, loss: torch.Tensor, *args, **kwargs) -> None:
        """`BaseModule.manual_backward`; under DDP, `loss.backward()` and then the gradients it wrote are averaged over
        the ranks in one all-reduce.

        An update here is several backward passes, each reaching one network (critic + policy, then A-VGF's g_psi;
        TD3+BC's actor every other step), and DDP's reducer, armed by Lightning's `manual_backward`, expects every
        parameter of the module in each backward ("parameters that were not used in producing the loss"). So DDP's
        reducer is left out (`core/grad_sync.py`)."""
        world, _ = self.world()
        if world == 1:
            return super().manual_backward(loss, *args, **kwargs)
        backward_and_average(self, loss, world, *args, **kwargs)

    def rollout(self, episodes: Sequence[int], groups: Sequence[int] | None = None, datamodule=None) -> Rollouts:
        """Roll out episodes (eval seed + index) for the given groups (default: all); returns per-job results."""
        dm = datamodule if datamodule is not None else self.trainer.datamodule
        names = self.eval_groups()
        groups = list(range(len(names))) if groups is None else list(groups)
        jobs = [(dm.eval_seed + int(e), g) for e in episodes for g in groups]
        want = min(len(jobs), self.eval_envs_max)
        while len(self._envs) < want:
            self._envs.append(dm.make_env())
        generator = torch.Generator(device=self.device).manual_seed(_seed(self.hparams.seed, dm.eval_seed))
        q_log: dict[int, list[float]] = {}

        def policy(obs: np.ndarray, job_groups: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                o = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
                actions, q = self.act_groups(o, job_groups, generator)
            for g, v in zip(job_groups.tolist(), q.tolist(), strict=True):
                q_log.setdefault(g, []).append(v)
            return actions.cpu().numpy()

        was_training = self.training
        self.eval()
        res = evaluate(self._envs[:want], policy, jobs)
        self.train(was_training)
        res.q_means = {g: float(np.mean(v)) for g, v in q_log.items()}
        return res

    def on_validation_epoch_start(self) -> None:
        self._eval_sums = torch.zeros(len(self.eval_groups()), 5, dtype=torch.float64)  # per group: score, return,
        # success %, Q estimate (each summed over episodes), episodes

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        """This rank's share of the episodes (every rank gets every index, `core.loader.EveryIndexOnEveryRank`), summed per
        group; `on_validation_epoch_end` reduces the sums over the ranks, so each episode counts once."""
        world, rank = self.world()
        episodes = batch.tolist()[rank::world]
        if not episodes:
            return
        dm = self.trainer.datamodule
        res = self.rollout(episodes)
        score = dm.score(res.returns, res.successes)
        for g in range(len(self.eval_groups())):
            sel = res.groups == g
            n = int(sel.sum())
            self._eval_sums[g] += torch.tensor([score[sel].sum(), res.returns[sel].sum(), 100.0 * res.successes[sel].sum(),
                                                res.q_means.get(g, 0.0) * n, n], dtype=torch.float64)

    def on_validation_epoch_end(self) -> None:
        # every rank joins (also one whose share was empty): sums and counts over all ranks, then the means
        sums = self.trainer.strategy.reduce(self._eval_sums.to(self.device), reduce_op="sum").cpu()
        names = self.eval_groups()
        if float(sums[:, 4].min()) == 0:
            return  # no episode was evaluated
        means = sums[:, :4] / sums[:, 4:]
        for g, name in enumerate(names):
            for j, metric in enumerate(("score", "return", "success", "q")):
                self.log(f"val/{metric}_{name}", float(means[g, j]))
        curve = means[:, 0].tolist()
        self.log("val/score", curve[-1], prog_bar=True)
        if self.trainer.sanity_checking:
            return
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot(range(len(curve)), curve, marker="o")
        ax.set_xticks(range(len(curve)), names)
        ax.set_xlabel("evaluation policy")
        ax.set_ylabel("score")
        ax.set_title(f"step {int(self.updates)}")
        fig.tight_layout()
        log_figure(self, "val/test_time_scaling", fig)

    def headline(self) -> Headline:
        """The evaluation score (success % or D4RL-normalised return) of the method's own acting rule, against the
        acting rules evaluated beside it in the same rollouts: behaviour cloning (`bc`, one reference sample) and, for
        VGF, best-of-N under Q without transport (`L0`)."""
        names = self.eval_groups()
        baselines = {}
        if "bc" in names:
            baselines["BC (one reference sample)"] = "{stage}/score_bc"
        if "L0" in names and names[-1] != "L0":
            baselines["best-of-N under Q, no transport (L0)"] = "{stage}/score_L0"
        return Headline(
            metric="{stage}/score", higher_is_better=True, baselines=baselines, method=type(self).__name__,
            claim=self.headline_claim,
            extra=(*(f"{{stage}}/score_{n}" for n in names[:-1] if n not in ("bc", "L0")),
                   f"{{stage}}/success_{names[-1]}"))

    headline_claim = "the learned policy scores above the behaviour policy it was trained from (BC)"

    def on_fit_end(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []


class VGF(OfflineRLModule):
    """Value Gradient Flow (Xu et al., ICLR 2026): behaviour-regularised RL by a bounded particle transport.

    With `amortized: true` it is A-VGF: the score grad_a Q comes from a network g_psi(s, a) regressed on the critic's
    action gradient, and the flow has no kernel term (phi = g_psi), with per-state norm clipping before Adam.
    With `transport: ascent` the kernel and repulsion are dropped: unconstrained Adam ascent on Q (a baseline).
    """

    def __init__(self, obs_dim: int = 1, action_dim: int = 1, actor_hidden: Sequence[int] = (256, 256, 256),
                 critic_hidden: Sequence[int] = (256, 256, 256), critic_layer_norm: bool = True,
                 discount: float = 0.99, tau: float = 0.005, num_particles: int = 10, flow_lr: float = 0.05,
                 alpha: float = 0.5, train_flow_steps: int = 1, eval_flow_steps: Sequence[int] = (0, 1, 2, 3),
                 bc_flow_steps: int = 10, transport: str = "svgd", target_select: str = "mean",
                 flow_q_agg: str = "mean", value_q_agg: str = "min", amortized: bool = False,
                 grad_clip_norm: float = 1.0, normalize_grad: bool = False, eval_extra: Sequence[str] = (),
                 actor_optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=3e-4),
                 critic_optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=3e-4),
                 seed: int = 0, compile_update: bool = False, compile_options: dict | None = None,
                 matmul: str = "aten", num_threads: int | None = None):
        """
        Args:
            obs_dim: Observation size (linked from the data).
            action_dim: Action size (linked from the data); actions live in [-1, 1].
            actor_hidden: Hidden widths of the reference policy's velocity MLP.
            critic_hidden: Hidden widths of each Q network.
            critic_layer_norm: LayerNorm after every hidden layer of the critics.
            discount: gamma.
            tau: Polyak rate of the target critic.
            num_particles: N, particles per state (training targets and acting).
            flow_lr: eta, Adam step size of the particle flow; the budget is L x eta.
            alpha: Temperature of the target pi* ~ exp(Q / alpha): weight of the value drive against kernel repulsion.
            train_flow_steps: L used for the next-state particles of the TD target.
            eval_flow_steps: Budgets L evaluated side by side at every validation (the test-time-scaling curve).
            bc_flow_steps: Euler steps of the reference flow policy.
            transport: `svgd` (VGF) or `ascent` (no kernel, no repulsion: unconstrained ascent baseline).
            target_select: How the TD target reduces the N particles' values: `mean` (paper) or `max`.
            flow_q_agg: Ensemble reduction of Q whose gradient drives the particles: `mean` (paper) or `min`.
            value_q_agg: Ensemble reduction for the TD target and the acting argmax: `min` or `mean`.
            amortized: A-VGF: learn g_psi(s, a) ~ grad_a Q and drive the particles with it (no kernel).
            grad_clip_norm: A-VGF: per-state L2 clip of the particle direction before Adam.
            normalize_grad: A-VGF: regress g_psi on the unit-normalised action gradient.
            eval_extra: Acting rules evaluated next to the budgets on the same networks, e.g. `[bc]` (one reference
                sample: behaviour cloning) or `[ascent10]`; logged as val/score_bc etc.
            actor_optimizer: Optimizer of the reference policy.
            critic_optimizer: Optimizer of the critics (and of g_psi for A-VGF).
            seed: Seed of the per-step noise (flow noise, particles), combined with the step and rank.
            compile_update: `torch.compile` the update's losses (reference sampling, transport, TD target, both
                losses; forward and backward) and, when the Trainer's optimizer steps are plain PyTorch calls and no
                scheduler is set, the two Adam steps with the Polyak update as one more compiled function. The first
                step compiles (tens of seconds on CPU); the numbers equal the eager ones.
            compile_options: Keyword arguments of `torch.compile` (e.g. `{mode: reduce-overhead}` for CUDA graphs).
            matmul: Library of the networks' fp32 CPU products: `aten` (PyTorch's: MKL on x86), `onednn` (PyTorch's
                bundled oneDNN, `core/onednn_linear.py`; about 2x MKL's speed on AMD EPYC CPUs) or `auto` (`aten` on
                Intel CPUs, where MKL measured faster, `onednn` elsewhere). Best with
                `compile_update` (eager, each product is a Python autograd function). Other devices: `aten` always.
            num_threads: torch intra-op threads while fitting, validating or testing (`torch.set_num_threads`, set in
                `setup`, restored in `teardown`): the networks are 128 units wide and an update is about a hundred
                small products, so on a shared 2-core CPU a second thread mostly spins (an update cost ~10x the CPU
                time with 2 threads than with 1 at load ~6, seeds/vgf.md). null: leave torch's setting.
        """
        super().__init__()
        if transport not in ("svgd", "ascent"):
            raise ValueError(f"transport must be 'svgd' or 'ascent', got {transport!r}")
        if target_select not in ("mean", "max"):
            raise ValueError(f"target_select must be 'mean' or 'max', got {target_select!r}")
        self.save_hyperparameters(ignore=["actor_optimizer", "critic_optimizer"])
        self.automatic_optimization = False
        self.actor_optimizer, self.critic_optimizer = actor_optimizer, critic_optimizer
        matmul = resolve_backend(matmul)  # `auto`: by processor (core/onednn_linear.py)
        self.policy = FlowPolicy(obs_dim, action_dim, actor_hidden, matmul=matmul)
        self.critic = Critic(obs_dim, action_dim, critic_hidden, critic_layer_norm, matmul=matmul)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.action_grad = ActionGradient(obs_dim, action_dim, critic_hidden, matmul=matmul) if amortized else None
        for name in eval_extra:
            parse_policy(name)  # a bad name fails here, not at the first evaluation
        self.eval_policies = list(eval_extra) + [f"L{b}" for b in eval_flow_steps]
        self._threads = CpuThreads(num_threads)  # core/threads.py: checked here, set in setup, restored in teardown
        self._losses_fn = None  # update_losses, compiled on the first step when compile_update is set
        self._apply_fn = None  # apply_updates, compiled likewise

    def setup(self, stage: str) -> None:
        self._threads.enter(self)

    def teardown(self, stage: str) -> None:
        self._threads.exit()

    # ------------------------------------------------------------------------------------------------- the flow
    def move(self, obs: torch.Tensor, particles: torch.Tensor, steps: int, keep: Sequence[int] = (),
             mode: str | None = None, lr: float | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Transport particles `[B, N, A]` at states `obs` `[B, 1, D]` (or `[B, N, D]`) for `steps` steps (see
        `transport.transport`)."""
        hp = self.hparams
        mode = mode or hp.transport
        if hp.amortized and mode == "svgd":
            grad_net = self.action_grad

            def score(a: torch.Tensor) -> torch.Tensor:
                with torch.no_grad():
                    return grad_net(obs, a)

            return transport(particles, score, steps, lr or hp.flow_lr, hp.alpha, kernel=False,
                             max_norm=hp.grad_clip_norm, keep=keep)
        with torch.no_grad():  # constant in the particles: once per transport, not per step
            features = self.critic.state_features(obs)
        score = critic_score(lambda a: self.critic.value_from_features(features, a, hp.flow_q_agg))
        return transport(particles, score, steps, lr or hp.flow_lr, hp.alpha, kernel=mode == "svgd", keep=keep)

    def reference_particles(self, obs: torch.Tensor, generator: torch.Generator | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """The states `[B, 1, D]` (broadcasting against the particles) and N reference-policy samples for each
        `[B, N, A]`."""
        obs_rep = obs.unsqueeze(1)
        x0 = torch.randn(obs.shape[0], self.hparams.num_particles, self.hparams.action_dim, generator=generator,
                         device=obs.device, dtype=obs.dtype)
        return obs_rep, self.policy.sample(obs_rep, self.hparams.bc_flow_steps, noise=x0)

    def act(self, obs: torch.Tensor, budgets: Sequence[int] = (1,), mode: str | None = None, lr: float | None = None,
            generator: torch.Generator | None = None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Acting for several budgets at once: {L: (actions `[B, A]`, Q of the chosen particle `[B]`)}.

        One transport of max(L) steps; the particles after each L are read off it, and the best by Q is taken.
        `mode="bc"` returns the first reference sample (plain behaviour cloning) for every budget.
        """
        with torch.no_grad():
            obs_rep, x0 = self.reference_particles(obs, generator)
            if mode == "bc":
                a = x0[:, 0]
                q = self.critic.value(obs, a, self.hparams.value_q_agg)
                return {b: (a, q) for b in budgets}
        _, snaps = self.move(obs_rep, x0, max(budgets), keep=budgets, mode=mode, lr=lr)
        out = {}
        with torch.no_grad():
            features = self.critic.state_features(obs_rep)
            for b in budgets:
                q = self.critic.value_from_features(features, snaps[b], self.hparams.value_q_agg)
                out[b] = (select_best(snaps[b], q), q.max(-1).values)
        return out

    # --------------------------------------------------------------------------------------------- evaluation
    headline_claim = ("value-gradient transport of the reference policy's particles scores above BC and above "
                      "best-of-N without transport (L0), rising with the budget L")

    def eval_groups(self) -> list[str]:
        """Acting rules evaluated side by side: `L<n>` (VGF with budget n; `L0` is best-of-N under Q), `bc` (one
        reference sample) and `ascent<n>` (n steps of kernel-free ascent on Q); set `eval_policies` to change them."""
        return self.eval_policies

    def act_groups(self, obs, groups, generator):
        actions = obs.new_empty(obs.shape[0], self.hparams.action_dim)
        q = obs.new_empty(obs.shape[0])
        kinds: dict[str, list[tuple[int, int]]] = {}
        for g, name in enumerate(self.eval_policies):
            kind, budget = parse_policy(name)
            kinds.setdefault(kind, []).append((g, budget))
        for kind, members in kinds.items():
            rows = np.isin(groups, [g for g, _ in members])
            if not rows.any():
                continue
            idx = torch.as_tensor(np.flatnonzero(rows), device=obs.device)
            mode = None if kind == "flow" else kind
            res = self.act(obs[idx], [b for _, b in members], mode=mode, generator=generator)
            for g, b in members:
                sel = torch.as_tensor(groups[rows] == g, device=obs.device)
                actions[idx[sel]], q[idx[sel]] = res[b][0][sel], res[b][1][sel]
        return actions, q

    # ----------------------------------------------------------------------------------------------- training
    def step_noise(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """All random numbers of one update, drawn up front (the order the eager code drew them in), so the update
        itself is a pure function of (parameters, batch, noise) that `torch.compile` can trace without a generator."""
        hp, kw = self.hparams, {"generator": generator, "device": self.device}
        world, rank = self.world()
        n = batch_size * world  # drawn for the global batch, this rank's rows kept (`rank_rows`)
        noise = {"particles": torch.randn(n, hp.num_particles, hp.action_dim, **kw),  # x_0 of mu_theta(.|s')
                 "fm_x0": torch.randn(n, hp.action_dim, **kw),                       # flow matching x_0
                 "fm_t": torch.rand(n, 1, **kw)}                                    # flow matching t
        return noise if world == 1 else {k: v[rank::world].contiguous() for k, v in noise.items()}

    def _td_target(self, next_obs: torch.Tensor, rewards: torch.Tensor, masks: torch.Tensor,
                   noise: torch.Tensor) -> torch.Tensor:
        hp = self.hparams
        obs_rep = next_obs.unsqueeze(1)  # [B, 1, D]: broadcast against the N particles, never repeated
        with torch.no_grad():  # the particles carry no graph: only grad_a Q is taken, inside the flow
            x0 = self.policy.sample(obs_rep, hp.bc_flow_steps, noise=noise)
            x, _ = self.move(obs_rep, x0, hp.train_flow_steps)
            next_q = self.target_critic.value(obs_rep, x, hp.value_q_agg)  # [B, N]
            next_v = next_q.mean(-1) if hp.target_select == "mean" else next_q.max(-1).values
            return rewards + hp.discount * masks * next_v

    def td_target(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None) -> torch.Tensor:
        """y = r + gamma m reduce_j Qbar(s', a'_j), a'_j the reference particles moved L_train flow steps."""
        noise = self.step_noise(batch["rewards"].shape[0], generator)["particles"]
        return self._td_target(batch["next_observations"], batch["rewards"], batch["masks"], noise)

    def update_losses(self, batch: dict[str, torch.Tensor], noise: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The critic's TD loss and the reference policy's flow-matching loss of one update (and what is logged).

        Both come from the parameters before the update: the critic step does not touch the policy, so computing the
        two first and back-propagating their sum once gives the gradients of the two separate steps. Compiled whole
        when `compile_update` is set (no host syncs, no Python RNG inside).
        """
        target = self._td_target(batch["next_observations"], batch["rewards"], batch["masks"], noise["particles"])
        qs = self.critic(batch["observations"], batch["actions"])  # [2, B]
        critic_loss = (qs - target).pow(2).sum(0).mean()
        bc_loss = self.policy.flow_matching_loss(batch["observations"], batch["actions"],
                                                 noise=(noise["fm_x0"], noise["fm_t"]))
        return {"critic_loss": critic_loss, "bc_loss": bc_loss, "q_mean": qs.detach().mean(),
                "target_mean": target.mean()}

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        hp = self.hparams
        opts = self.optimizers()
        opt_actor, opt_critic = opts[0], opts[1]
        noise = self.step_noise(batch["rewards"].shape[0], self.step_generator())
        if self._losses_fn is None:
            self._losses_fn = (torch.compile(self.update_losses, **(hp.compile_options or {})) if hp.compile_update
                               else self.update_losses)
        out = self._losses_fn(batch, noise)
        opt_critic.zero_grad()
        opt_actor.zero_grad()
        self.manual_backward(out["critic_loss"] + out["bc_loss"])  # disjoint parameters: one backward for both
        if hp.compile_update and self.optimizer_steps_are_plain() and not self.lr_schedulers():
            # the raw optimizers stepped in one compiled graph; with a scheduler the learning rate changes every step
            # and would recompile it, so that case stays eager. Under DDP the steps are not plain (Lightning's
            # strategy steps them): the eager steps below, on the gradients `manual_backward` averaged over the ranks
            self.apply_updates_compiled(opt_critic.optimizer, opt_actor.optimizer)
            self.count_optimizer_steps(opt_critic, opt_actor)
        else:
            self.apply_updates(opt_critic, opt_actor)

        logs = {f"train/{k}": v for k, v in out.items()}
        if hp.amortized:
            logs["train/grad_loss"] = self.action_grad_step(batch, opts[2])
        self.count_step()
        self.log_train(logs, prog_bar=("train/critic_loss",))

    def apply_updates(self, opt_critic, opt_actor) -> None:
        """Critic step, Polyak update of the target critic, reference-policy step (the gradients are in place)."""
        opt_critic.step()
        polyak(self.target_critic, self.critic, self.hparams.tau)
        opt_actor.step()

    def apply_updates_compiled(self, opt_critic: torch.optim.Optimizer, opt_actor: torch.optim.Optimizer) -> None:
        """`apply_updates` with both Adam steps and the Polyak update as one compiled graph (made on first use), once
        Adam's state exists; the first step, which makes it, and optimizers other than Adam take `apply_updates`."""
        if self._apply_fn is None:
            for group in (*opt_critic.param_groups, *opt_actor.param_groups):
                if group.get("fused"):  # the fused kernel is opaque to dynamo (a graph break per optimizer);
                    group.update(fused=False, foreach=True)  # inductor fuses the foreach form's math itself
            self._apply_fn = torch.compile(self.apply_adam_updates, **(self.hparams.compile_options or {}))
        groups = adam_groups(opt_critic), adam_groups(opt_actor)
        if None in groups:
            self.apply_updates(opt_critic, opt_actor)
        else:
            self._apply_fn(*groups)

    def apply_adam_updates(self, critic_groups: list, actor_groups: list) -> None:
        """`apply_updates` for Adam optimizers in the functional form of `core/functional_adam.py`, which
        `torch.compile` traces as one graph (`opt.step()` breaks the graph before and after itself)."""
        adam_step(critic_groups)
        polyak(self.target_critic, self.critic, self.hparams.tau)
        adam_step(actor_groups)

    def action_grad_step(self, batch: dict[str, torch.Tensor], opt) -> torch.Tensor:
        """A-VGF: regress g_psi(s, a) on grad_a mean_k Q_k(s, a) at the data actions."""
        obs = batch["observations"]
        score = critic_score(lambda a: self.critic.value(obs, a, "mean"))(batch["actions"])
        if self.hparams.normalize_grad:
            score = score / (score.norm(dim=-1, keepdim=True) + 1e-8)
        loss = (self.action_grad(obs, batch["actions"]) - score).pow(2).mean()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss

    def configure_optimizers(self):
        opts = [self.actor_optimizer(self.policy.parameters()), self.critic_optimizer(self.critic.parameters())]
        if self.action_grad is not None:
            opts.append(self.critic_optimizer(self.action_grad.parameters()))
        return opts
