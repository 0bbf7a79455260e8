"""JULI as a red-team evaluation: align a target with a LoRA, then train BiasNet against its top-k log-probability API.

Phase 1 (`policy` batches): LoRA adapters on the target learn the policy (decline guarded requests with a fixed string,
answer open ones): the defender's alignment. Phase 2 (`attack` batches): the target is frozen and reachable only through
`TopKLogprobAPI`; BiasNet learns from the returned top-k log-probabilities to steer decoding towards the wanted
(policy-violating) reply (loss in `steering.biasnet_loss`). Validation decodes the evaluation requests under the
configured API and logs the violation rate of BiasNet and of the baselines (plain decoding, a random returned candidate,
the rank-2 opening), the base-model perplexity of what each emitted, the detector's AUROC and steered/plain decoding
speed.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from lightning.pytorch.cli import OptimizerCallable

from lit_iclr.core.grad_sync import backward_and_average
from lit_iclr.core.module import BaseModule
from lit_iclr.core.summary import Headline

from .api import TopKLogprobAPI
from .batching import chat_batch
from .harness import anchored_reply_nll, evaluate
from .model import BiasNet, LoRAAdapters
from .steering import biasnet_loss


class JULI(BaseModule):
    def __init__(self, lm_path: str | None = None, k: int = 5, quantum: float = 0.0, noise_std: float = 0.0,
                 logprobs: bool = True, control: str = "prefill", max_bias: float = 100.0, lora_rank: int = 8,
                 lora_alpha: float = 16.0, lora_targets: tuple[str, ...] = ("q_proj", "v_proj"), hidden: int = 64,
                 token_buckets: int = 0, max_new_tokens: int = 16, detector_temperature: float = 1.0,
                 policy_optimizer: OptimizerCallable = torch.optim.AdamW, optimizer: OptimizerCallable = torch.optim.AdamW,
                 seed: int = 0, world: str = "capital", align_anchor: float = 0.0):
        """
        Args:
            lm_path: Target model: a local Hugging Face folder or .gguf (linked from the data), None for SmolLM2-135M.
            k: Top-k candidates the API returns per position (paper: 5).
            quantum: API rounding of log-probabilities, in nats (0: exact).
            noise_std: Gaussian noise the API adds to returned log-probabilities.
            logprobs: False: the API returns the k candidates without values.
            control: prefill | logit_bias | none: how a client can influence the next token.
            max_bias: Largest |logit bias| the API accepts (control: logit_bias).
            lora_rank: LoRA rank r of the alignment adapters.
            lora_alpha: LoRA alpha (update scaled by alpha / r).
            lora_targets: Linear layers that get adapters.
            hidden: BiasNet width.
            token_buckets: BiasNet's hashed token-id embedding size (0: log-probabilities and ranks only).
            max_new_tokens: Reply length at evaluation.
            detector_temperature: Sampling temperature of the ordinary replies the detector must tell apart.
            policy_optimizer: Optimizer of the LoRA adapters (phase 1).
            optimizer: Optimizer of BiasNet (phase 2).
            seed: Seed of the API noise and the evaluation's random choices.
            world: Policy world of the chats (linked from the data): what a "revealing opening" looks like.
            align_anchor: Weight of the base model's own distribution in the alignment's target (phase 1,
                `harness.anchored_reply_nll`): 0 is plain cross-entropy on the policy replies; a > 0 aims the aligned
                target at (1 - a) policy + a base, as a KL-regularised alignment stays near its reference.
        """
        if not 0.0 <= align_anchor < 1.0:
            raise ValueError(f"model.init_args.align_anchor must be in [0, 1), got {align_anchor}")
        super().__init__()
        self.save_hyperparameters(ignore=["policy_optimizer", "optimizer"])
        self.policy_optimizer, self.optimizer = policy_optimizer, optimizer
        self.automatic_optimization = False
        self.net = BiasNet(max_k=max(k, 1), hidden=hidden, token_buckets=token_buckets, max_steps=max(32, max_new_tokens))
        self.adapters: LoRAAdapters | None = None
        self.target = None

    def configure_model(self) -> None:
        if self.adapters is not None:
            self.adapters.attach()
            return
        from lit_iclr.core import hf_arch
        from lit_iclr.core.llm import load_causal_lm

        path = self.hparams.lm_path
        if (path is not None and (Path(path) / "config.json").is_file() and not hf_arch.has_weights(path)
                and hf_arch.default_device().type == "meta"):
            # `cli.py plan`: the target's published architecture (configs/paper/hf/...), no weights and no tokenizer
            model = hf_arch.causal_lm(path)
            eos = model.config.eos_token_id
            eos = eos[0] if isinstance(eos, (list, tuple)) else eos
            tokenizer = SimpleNamespace(eos_token_id=eos, pad_token_id=model.config.pad_token_id)
        else:
            model, tokenizer = load_causal_lm(path)
        model.requires_grad_(False)
        self.target = [model, tokenizer]  # a list: the frozen target is not this module's state (nor checkpointed)
        # the LoRA init (A ~ Kaiming uniform) from the config's seed, not from wherever the global generator stands
        # when the strategy builds the model: under DDP rank 0 arrived here with another random state than one
        # process (its A was another draw, 0.33 apart), and the random state of the run is left as it was
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.hparams.seed)
            self.adapters = LoRAAdapters(model, tuple(self.hparams.lora_targets), self.hparams.lora_rank,
                                         self.hparams.lora_alpha)
        self.adapters.attach()
        h = self.hparams
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.api = TopKLogprobAPI(model, tokenizer.eos_token_id, pad, k=h.k, quantum=h.quantum, noise_std=h.noise_std,
                                  logprobs=h.logprobs, control=h.control, max_bias=h.max_bias, seed=h.seed)

    def on_fit_start(self) -> None:
        self.target[0].to(self.device)  # the strategy moved this module's parameters; the unregistered target follows

    def on_validation_start(self) -> None:
        self.target[0].to(self.device)

    def teardown(self, stage: str) -> None:
        if self.adapters is not None:
            self.adapters.detach()  # the base model may be shared in this process: leave it as it was

    @property
    def tokenizer(self):
        return self.target[1]

    def configure_optimizers(self):
        return [self.policy_optimizer(self.adapters.parameters()), self.optimizer(self.net.parameters())]

    def manual_backward(self, loss: torch.Tensor, *args, **kwargs) -> None:
        """`BaseModule.manual_backward`; under DDP, `loss.backward()` and the gradients it wrote averaged over the ranks.

        The step alternates deliberately: the alignment phase trains the LoRA adapters only, the attack phase the
        BiasNet only, so each backward reaches one of the two, and DDP's reducer (which expects every parameter in each
        backward) is left out (`core/grad_sync.py`). Every rank is in the same phase at the same step (`data.py`)."""
        trainer = self._trainer
        if trainer is None or trainer.world_size == 1:
            return super().manual_backward(loss, *args, **kwargs)
        backward_and_average(self, loss, trainer.world_size, *args, **kwargs)

    def training_step(self, batch, batch_idx):
        opt_policy, opt_net = self.optimizers()
        self._forget_other_phase(batch["phase"])
        tb = chat_batch(self.tokenizer, batch["messages"], batch["replies"]).to(self.device)
        if batch["phase"] == "policy":
            # phase 1: the defender's alignment, cross-entropy of the policy replies through the LoRA-adapted target
            self.target[0].train()
            loss = anchored_reply_nll(self.target[0], self.adapters, tb, self.hparams.align_anchor).mean()
            opt_policy.zero_grad()
            self.manual_backward(loss)
            opt_policy.step()
            self.target[0].eval()
            self.log_train({"train/policy_nll": loss.detach()}, prog_bar=["train/policy_nll"])
            return loss
        # phase 2: the attacker sees only the API's top-k answers at each position of the target reply
        top_ids, top_lp = self.api.teacher_forced(tb, self.api.k)
        ids, lp = self.api.expose(top_ids, top_lp)
        clamp = self.hparams.max_bias if self.api.control == "logit_bias" else None
        loss, coverage = biasnet_loss(self.net, ids, lp, tb.reply_ids, tb.reply_mask, clamp)
        opt_net.zero_grad()
        self.manual_backward(loss)
        opt_net.step()
        self.log_train({"train/steer_nll": loss.detach(), "train/coverage": coverage}, prog_bar=["train/steer_nll"])
        return loss

    PHASE_KEYS = {"policy": ("train/policy_nll",), "attack": ("train/steer_nll", "train/coverage")}

    def _forget_other_phase(self, phase: str) -> None:
        """Drop the other phase's step metrics from Lightning's step results when the phase changes.

        Lightning keeps the last value of every key logged on step and writes it again into each later row of the
        epoch, so every attack-phase row of metrics.csv carried the last alignment loss. Those step results are not
        in the checkpoint: a run resumed inside the attack phase (a graceful stop) lacked the stale column in its first
        row, and its metrics.csv differed from an uninterrupted run's. A step now logs only its own phase's keys."""
        if getattr(self, "_phase", None) == phase:
            return
        self._phase = phase
        results = self.trainer._results if self._trainer is not None else None
        stale = {k for p, keys in self.PHASE_KEYS.items() if p != phase for k in keys}
        for item in (results.values() if results is not None else ()):
            if item.meta.name in stale:
                item.reset()  # marks it `has_reset`: Lightning's step metrics leave it out until logged again

    def headline(self) -> Headline:
        return Headline(
            metric="{stage}/violation/biasnet", higher_is_better=True,
            baselines={"best fixed-rank opening": "{stage}/violation/fixed_rank_best",  # r = 1..k, best on these requests
                       "plain decoding": "{stage}/violation/plain",
                       "random candidate": "{stage}/violation/random"},
            claim="BiasNet, reading only the API's top-k log-probabilities, makes the aligned target violate its policy "
                  "more often than the policy itself and than any fixed-rank opening",
            method="JULI (BiasNet)",
            extra=("{stage}/fixed_rank_best_r", "{stage}/opening/biasnet", "{stage}/ppl/biasnet",
                   "{stage}/detector_auroc", "{stage}/compliance"))

    def validation_step(self, batch, batch_idx):
        h = self.hparams
        metrics = evaluate(self.api, self.net, self.tokenizer, self.adapters, batch, h.max_new_tokens, seed=h.seed,
                           detector_temperature=h.detector_temperature, world=h.world)
        metrics.pop("example")
        self.log_dict({f"val/{k}": float(v) for k, v in metrics.items()}, batch_size=1)

    def summary_metrics(self):
        return ("{stage}/violation/*", "{stage}/opening/*", "{stage}/compliance", "{stage}/helpful", "{stage}/ppl/*",
                "{stage}/detector_auroc",
                "{stage}/speed_ratio")
