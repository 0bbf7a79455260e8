"""`TopKLogprobAPI`: a local causal LM seen only through what a completion API exposes, with its mitigations as settings.

Per generated position the API returns the top-k candidate tokens and their log-probabilities, as chat APIs with
`logprobs` / `top_logprobs` do. Its settings are the defences this module measures:

- `k`: how many candidates are returned (k = 1 leaves nothing to choose: the same as returning text only);
- `quantum`: log-probabilities rounded to multiples of this many nats (0: exact);
- `noise_std`: Gaussian noise added to every returned log-probability;
- `logprobs`: false returns the k candidate tokens in rank order without their values;
- `control`: how a client can influence the next token: `prefill` (it sends the text so far as an assistant prefix, so
  it may continue with any returned candidate), `logit_bias` (it sends a bias per token id, clamped to +-`max_bias`,
  added to the true logits before the API's greedy choice) or `none` (neither: the API decodes on its own).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .batching import ChatBatch, position_ids

CONTROLS = ("prefill", "logit_bias", "none")


@dataclass
class Trace:
    """One batch of decoded replies and what the provider's logs hold about them."""

    tokens: torch.Tensor      # [B, T] emitted tokens (pad after the end-of-turn token)
    mask: torch.Tensor        # [B, T] true where a token was emitted (up to and including the end-of-turn token)
    true_logp: torch.Tensor   # [B, T] log p of each emitted token under the target (what the provider computed)
    true_rank: torch.Tensor   # [B, T] its rank under the target (0 = the greedy token)


class TopKLogprobAPI:
    """The target model behind a top-k log-probability API (see the module docstring for the settings).

    Args:
        model: A Hugging Face causal LM (kept frozen; any adapters are attached by its owner).
        eos_id / pad_id: End-of-turn and padding token ids.
        k: Candidates returned per position (the paper's threat model: 5).
        quantum: Rounding step of the returned log-probabilities in nats (0: exact).
        noise_std: Standard deviation of the Gaussian noise added to them.
        logprobs: False returns candidates without values (ranks only).
        control: prefill | logit_bias | none.
        max_bias: Largest |bias| the API accepts with `control: logit_bias` (OpenAI accepts 100).
        seed: Seed of the API's noise.
    """

    def __init__(self, model, eos_id: int, pad_id: int, k: int = 5, quantum: float = 0.0, noise_std: float = 0.0,
                 logprobs: bool = True, control: str = "prefill", max_bias: float = 100.0, seed: int = 0):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if control not in CONTROLS:
            raise ValueError(f"control must be one of {CONTROLS}, got {control!r}")
        self.model, self.eos_id, self.pad_id = model, eos_id, pad_id
        self.k, self.quantum, self.noise_std, self.logprobs = k, quantum, noise_std, logprobs
        self.control, self.max_bias = control, max_bias
        self.generator = torch.Generator().manual_seed(seed)

    # what the API returns -------------------------------------------------------------------------------------------
    def expose(self, top_ids: torch.Tensor, top_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The returned (ids, log-probs) `[..., k]` from the true top candidates `[..., >= k]` (sorted, descending)."""
        ids, lp = top_ids[..., :self.k], top_logp[..., :self.k]
        if not self.logprobs:
            return ids, torch.zeros_like(lp)
        if self.noise_std > 0:
            noise = torch.randn(lp.shape, generator=self.generator).to(lp.device)
            lp = lp + self.noise_std * noise
        if self.quantum > 0:
            lp = self.quantum * torch.round(lp / self.quantum)
        return ids, lp

    def teacher_forced(self, batch: ChatBatch, max_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """True top-`max_k` (ids, log-probs) `[B, R, max_k]` at every reply position of `batch` (one forward pass).

        This is what `R` API calls return when the client prefills the reply's first t tokens for t = 0..R-1; one causal
        forward computes all of them at once. Apply `expose` to get what the client sees.
        """
        with torch.no_grad():
            out = self.model(input_ids=batch.ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                             use_cache=False)
            r = batch.ids.shape[1] - batch.prompt_len
            logp = torch.log_softmax(out.logits[:, batch.prompt_len - 1:batch.prompt_len - 1 + r].float(), -1)
            top = logp.topk(max_k, -1)
        return top.indices, top.values

    # decoding ---------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, prompts: ChatBatch, chooser: Callable | None, max_new_tokens: int) -> Trace:
        """Decode `max_new_tokens` for every prompt (batched, with a key/value cache).

        `chooser(step, ids [B, k], logprobs [B, k], true_logp [B, V]) -> token [B]` is the client (None: plain greedy
        decoding). Under `prefill` the client's token is emitted; under `logit_bias` the chooser returns a bias `[B, k]`
        for the candidates and the API emits argmax(true logits + clamped bias); under `none` the API decodes greedily.
        """
        ids, mask = prompts.prompt_ids, prompts.attention_mask[:, :prompts.prompt_len]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        pos = position_ids(mask)[:, -1]
        b = ids.shape[0]
        done = torch.zeros(b, dtype=torch.bool, device=ids.device)
        tokens, emitted, lps, ranks = [], [], [], []
        for t in range(max_new_tokens):
            logp = torch.log_softmax(logits.float(), -1)
            token = self._next_token(t, logp, chooser)
            token = torch.where(done, torch.full_like(token, self.pad_id), token)
            tok_lp = logp.gather(-1, token[:, None]).squeeze(-1)
            tokens.append(token)
            emitted.append(~done)
            lps.append(tok_lp)
            ranks.append((logp > tok_lp[:, None]).sum(-1))
            done = done | (token == self.eos_id)
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            mask = torch.cat([mask, emitted[-1].long()[:, None]], 1)  # the fed token is real unless the row had ended
            pos = pos + 1
            out = self.model(input_ids=token[:, None], attention_mask=mask, position_ids=pos[:, None],
                             past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]
        return Trace(torch.stack(tokens, 1), torch.stack(emitted, 1), torch.stack(lps, 1), torch.stack(ranks, 1))

    def _next_token(self, step: int, logp: torch.Tensor, chooser: Callable | None) -> torch.Tensor:
        if chooser is None or self.control == "none" or self.k == 1:
            return logp.argmax(-1)  # nothing the client sends can change the greedy choice
        top = logp.topk(self.k, -1)
        ids, lp = self.expose(top.indices, top.values)
        choice = chooser(step, ids, lp, logp)
        if self.control == "prefill":
            return choice
        bias = torch.zeros_like(logp).scatter(-1, ids, choice.clamp(-self.max_bias, self.max_bias))
        return (logp + bias).argmax(-1)  # logit_bias: the API adds the bias to its true logits
