"""Chat records -> token batches: prompts left-padded (they all end in one column), replies right-padded after them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@dataclass
class ChatBatch:
    """`ids [B, P+R]`: prompt block (left-padded, length P) then reply block (right-padded, length R).

    Logits at column P-1+t predict reply token t, so `reply_mask [B, R]` marks the reply tokens a loss may use.
    """

    ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    reply_mask: torch.Tensor

    @property
    def position_ids(self) -> torch.Tensor:
        return position_ids(self.attention_mask)

    @property
    def reply_ids(self) -> torch.Tensor:
        return self.ids[:, self.prompt_len:]

    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.ids[:, :self.prompt_len]

    def to(self, device) -> ChatBatch:
        return ChatBatch(self.ids.to(device), self.attention_mask.to(device), self.prompt_len, self.reply_mask.to(device))


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding (0 at each row's first real token)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def prompt_text(tokenizer, messages: list[dict]) -> str:
    """The chat up to the assistant's turn, through the tokenizer's own chat template (ChatML when it has none)."""
    conv = [m for m in messages if m["role"] != "assistant"]
    template = getattr(tokenizer, "chat_template", None) or CHATML
    return tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, chat_template=template)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_chats(tokenizer, messages: list[list[dict]], replies: list[str] | None = None, end_token: bool = True
                 ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids [+ end-of-turn token]) per chat; encode once, batch many times with `pad_chats`."""
    eos = [tokenizer.eos_token_id] if end_token and tokenizer.eos_token_id is not None else []
    prompts = [encode(tokenizer, prompt_text(tokenizer, m)) for m in messages]
    conts = [encode(tokenizer, r) + eos for r in replies] if replies is not None else [[] for _ in prompts]
    return list(zip(prompts, conts, strict=True))


def pad_chats(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> ChatBatch:
    p_len, r_len = max(len(p) for p, _ in pairs), max(len(c) for _, c in pairs)
    b = len(pairs)
    ids = torch.full((b, p_len + r_len), pad_id, dtype=torch.long)
    mask = torch.zeros(b, p_len + r_len, dtype=torch.long)
    reply_mask = torch.zeros(b, r_len, dtype=torch.bool)
    for i, (p, c) in enumerate(pairs):
        ids[i, p_len - len(p):p_len] = torch.tensor(p)
        mask[i, p_len - len(p):p_len + len(c)] = 1
        if c:
            ids[i, p_len:p_len + len(c)] = torch.tensor(c)
            reply_mask[i, :len(c)] = True
    return ChatBatch(ids, mask, p_len, reply_mask)


def chat_batch(tokenizer, messages: list[list[dict]], replies: list[str] | None = None, end_token: bool = True
               ) -> ChatBatch:
    """Tokenize prompts (and replies) into one `ChatBatch`."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return pad_chats(encode_chats(tokenizer, messages, replies, end_token), pad)


def reply_logits(model, batch: ChatBatch) -> torch.Tensor:
    """Logits `[B, R, V]` predicting each reply token (one causal forward over prompt + reply)."""
    out = model(input_ids=batch.ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False)
    r = batch.ids.shape[1] - batch.prompt_len
    return out.logits[:, batch.prompt_len - 1:batch.prompt_len - 1 + r].float()
