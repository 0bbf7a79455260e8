"""The default target: a small Llama trained to answer every chat (no policy yet), saved as a Hugging Face model folder.

The generator writes it next to the chat files, so the default run reads the target the way it reads any checkpoint
(`AutoModelForCausalLM.from_pretrained`): a byte-level BPE `tokenizer.json` with ChatML turn tokens and a chat
template, `config.json` and `model.safetensors`. It plays the role of the capable base model: it reveals the passphrase
when asked; the method's first phase aligns it with a LoRA so that it declines.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from lit_iclr.core.tokenizer import PAD_TOKEN, train_bpe

from .batching import CHATML, encode_chats, pad_chats, reply_logits

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def build_tokenizer(records: list[dict], vocab_size: int):
    from transformers import PreTrainedTokenizerFast

    texts = [m["content"] for r in records for m in r["messages"]] + ["system", "user", "assistant"]
    tok = train_bpe(texts, vocab_size=vocab_size, min_frequency=2)
    tok.add_special_tokens([IM_START, IM_END])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD_TOKEN, unk_token=None)
    hf.chat_template = CHATML
    return hf


def build_model(vocab_size: int, hidden: int, layers: int, heads: int, max_positions: int, pad_id: int, eos_id: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
                      pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=None, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def train_base_lm(records: list[dict], out_dir: Path, seed: int = 0, steps: int = 600, batch_size: int = 32,
                  hidden: int = 64, layers: int = 2, heads: int = 4, vocab_size: int = 320, lr: float = 3e-3) -> dict:
    """Train on the assistant turns of `records` (every request answered) and save the HF folder; returns its stats."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_tokenizer(records, vocab_size)
    pairs = encode_chats(tokenizer, [r["messages"] for r in records], [r["messages"][-1]["content"] for r in records])
    longest = max(len(p) + len(c) for p, c in pairs)
    model = build_model(len(tokenizer), hidden, layers, heads, 2 * longest + 32, tokenizer.pad_token_id,
                        tokenizer.eos_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        batch = pad_chats(rng.sample(pairs, batch_size), tokenizer.pad_token_id)
        logits = reply_logits(model, batch)
        loss = torch.nn.functional.cross_entropy(logits[batch.reply_mask], batch.reply_ids[batch.reply_mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"final_loss": float(loss.detach()), "parameters": sum(p.numel() for p in model.parameters())}
