"""HEAPr on a large local Hugging Face checkpoint, one decoder layer in memory at a time.

    python -m lit_iclr.heapr.streaming --checkpoint /models/Qwen1.5-MoE-A2.7B --calib wikitext-2-raw/wiki.train.raw \\
        --ratio 0.25 --out /models/Qwen1.5-MoE-A2.7B-heapr25 [--nsamples 128 --seqlen 2048 --device cuda --hf]

The model is never materialised, let alone twice. The skeleton lives on the meta device; each step materialises one
decoder layer from the safetensors and frees it again:

1. forward, layer by layer: the calibration hidden states entering every layer are kept (on disk under `--offload`,
   or in memory), each layer computed once;
2. the final norm and LM head give the summed next-token loss and its gradient at the last hidden state;
3. backward, layer by layer from the top: layer l is recomputed from its stored input with gradients on the activations
   only, the observers of its routed experts accumulate n_e, sum h_k^2 and sum g g^T (the paper's two forward + one
   backward passes, fused), the gradient is passed down, and the layer's atom scores S_k are computed and its d x d
   Fisher matrices freed (so only one layer's M, E x d x d, is ever held);
4. global ranking of all atoms (as in memory), then the checkpoint is rewritten shard by shard: the compact form
   (each expert its own width + `expert_widths.json`, read by `lit_iclr.core.moe.load_compact`) and, with `--hf`,
   the standard transformers layout zero-padded to one width (`AutoModelForCausalLM.from_pretrained` loads it).

Calibration text: WikiText-2-style raw files (or any UTF-8 text) tokenised with the checkpoint's own `tokenizer.json`.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lit_iclr.core.corpus import read_raw_text
from lit_iclr.core.errors import DatasetNotFoundError, LitIclrError
from lit_iclr.core.moe import (
    WIDTH_ATTR,
    Checkpoint,
    MoEBlock,
    check_moe,
    materialize,
    meta_model,
    padded_width,
    unfuse_experts,
)
from lit_iclr.core.tokenizer import load_tokenizer

from .calibrate import Calibration, ExpertStats, lm_loss_sum
from .scores import AVERAGING, atom_scores, check_ratio, global_keep


def calibration_batches(tokenizer_dir: str | Path, texts: list[str | Path], nsamples: int = 128,
                        seqlen: int = 2048) -> torch.Tensor:
    """[nsamples, seqlen] consecutive blocks of the calibration text (raw files read as WikiText-style documents)."""
    tok = load_tokenizer(tokenizer_dir)
    docs = [d for t in texts for d in read_raw_text(t)]
    ids: list[int] = []
    for enc in tok.encode_batch([f"{d.title}\n{d.text}" for d in docs], add_special_tokens=False):
        ids.extend(enc.ids)
        if len(ids) >= nsamples * seqlen:
            break
    n = min(nsamples, len(ids) // seqlen)
    if n == 0:
        raise DatasetNotFoundError(texts[0], f"fewer than {seqlen} tokens of calibration text",
                                   "give more text or a smaller --seqlen")
    return torch.tensor(ids[: n * seqlen]).reshape(n, seqlen)


class _Store:
    """Per-layer tensors [nsamples, T, d], kept in memory or offloaded to files."""

    def __init__(self, folder: Path | None):
        self.folder, self.mem = folder, {}

    def put(self, key: str, t: torch.Tensor) -> None:
        if self.folder is None:
            self.mem[key] = t
        else:
            save_file({"t": t.contiguous()}, str(self.folder / f"{key}.safetensors"))

    def get(self, key: str) -> torch.Tensor:
        return self.mem[key] if self.folder is None else load_file(str(self.folder / f"{key}.safetensors"))["t"]


def _causal_mask(b: int, t: int, dtype, device) -> torch.Tensor:
    mask = torch.full((t, t), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
    return mask[None, None].expand(b, 1, t, t)


def _load(module: nn.Module, ckpt: Checkpoint, prefix: str, device, dtype) -> nn.Module:
    materialize(module, device)
    ckpt.load_into(module, prefix)
    return module.to(dtype)


def _free(module: nn.Module) -> None:
    module.to("meta")


def stream_scores(checkpoint: str | Path, input_ids: torch.Tensor, method: str = "heapr",
                  averaging: str = "per_token", fisher_state: str = "full", batch_size: int = 8,
                  device: str = "cpu", dtype: torch.dtype = torch.float32, offload: str | Path | None = None,
                  log=print) -> tuple[nn.Module, list[list[torch.Tensor]], Calibration]:
    """Layer-by-layer calibration of a checkpoint folder; returns the meta skeleton (experts unfused), the atom scores
    of every MoE block and the (Fisher-free) calibration summary."""
    if method not in ("heapr", "wanda"):
        raise LitIclrError(f"streaming supports the calibration-based atomic scores heapr and wanda, not {method!r}")
    if averaging not in AVERAGING:
        raise LitIclrError(f"averaging must be one of {AVERAGING}")
    ckpt = Checkpoint(checkpoint)
    model = meta_model(checkpoint)
    check_moe(model)
    unfuse_experts(model)  # on the meta device: only the module structure changes
    base, layers = model.model, model.model.layers
    n, t = input_ids.shape
    chunks = [slice(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]
    store = _Store(Path(offload) if offload else None)
    pos = torch.arange(t, device=device)[None]
    rotary = materialize(base.rotary_emb, device)
    t0 = time.perf_counter()

    def run_layer(layer, x):
        emb = rotary(x, pos.expand(x.shape[0], -1))
        out = layer(x, attention_mask=_causal_mask(x.shape[0], t, x.dtype, device), position_ids=pos,
                    position_embeddings=emb)
        return out[0] if isinstance(out, tuple) else out

    # 1. forward, storing every layer's input
    emb = _load(base.embed_tokens, ckpt, "model.embed_tokens.", device, dtype)
    with torch.no_grad():
        h = torch.cat([emb(input_ids[c].to(device)).cpu() for c in chunks])
    _free(emb)
    for li, layer in enumerate(layers):
        store.put(f"h{li}", h)
        _load(layer, ckpt, f"model.layers.{li}.", device, dtype)
        with torch.no_grad():
            h = torch.cat([run_layer(layer, h[c].to(device)).cpu() for c in chunks])
        _free(layer)
        log(f"forward layer {li + 1}/{len(layers)}")
    # 2. loss and its gradient at the last hidden state
    norm = _load(base.norm, ckpt, "model.norm.", device, dtype)
    head = model.lm_head
    materialize(head, device)
    key = "lm_head.weight" if "lm_head.weight" in ckpt.where else "model.embed_tokens.weight"
    with torch.no_grad():
        head.weight.copy_(ckpt.get(key))
    head.to(dtype)
    grads, loss_sum, counted = [], 0.0, 0
    for c in chunks:
        x = h[c].to(device).requires_grad_(True)
        loss, cnt = lm_loss_sum(head(norm(x)), input_ids[c].to(device))
        loss.backward()
        grads.append(x.grad.cpu())
        loss_sum, counted = loss_sum + float(loss), counted + int(cnt)
    g = torch.cat(grads)
    _free(norm)
    _free(head)
    # 3. backward, layer by layer, gathering the expert statistics and scoring each layer as it completes
    blocks = {b.layer: b for b in check_moe(model)}
    scores: dict[int, list[torch.Tensor]] = {}
    summaries: dict[int, ExpertStats] = {}
    for li in reversed(range(len(layers))):
        layer = _load(layers[li], ckpt, f"model.layers.{li}.", device, dtype)
        for p in layer.parameters():
            p.requires_grad_(False)
        block = blocks.get(li)
        stats = _attach(block, fisher_state, method == "heapr") if block is not None else None
        x_all, g_prev = store.get(f"h{li}"), []
        for c in chunks:
            x = x_all[c].to(device).requires_grad_(True)
            run_layer(layer, x).backward(g[c].to(device))
            g_prev.append(x.grad.cpu())
        g = torch.cat(g_prev)
        if block is not None:
            block.experts.observer = None
            cal = Calibration([stats], n * t, loss_sum / counted, 0.0, fisher_state)
            scores[li] = atom_scores(cal, [block], method, averaging)[0]
            summaries[li] = ExpertStats(stats.name, stats.n, [s.cpu() for s in stats.h2])  # drop the d x d state
        _free(layer)
        log(f"backward layer {li + 1}")
    order = sorted(scores)
    calib = Calibration([summaries[i] for i in order], n * t, loss_sum / counted, time.perf_counter() - t0,
                        fisher_state)
    return model, [scores[i] for i in order], calib


def _attach(block: MoEBlock, fisher_state: str, with_gradients: bool) -> ExpertStats:
    """Observers on one block's experts (the same accumulation as `calibrate`, for one layer)."""
    from .calibrate import make_observer

    dev = block.router.weight.device
    widths, d = block.widths(), block.hidden_size
    s = ExpertStats(block.name, torch.zeros(block.num_experts, dtype=torch.float64),
                    [torch.zeros(w, device=dev) for w in widths])
    if with_gradients:
        if fisher_state == "full":
            s.M = [torch.zeros(d, d, device=dev) for _ in widths]
        else:
            s.gh2 = [torch.zeros(w, device=dev) for w in widths]

    block.experts.observer = make_observer(s, with_gradients, dev)
    return s


def write_pruned(checkpoint: str | Path, model: nn.Module, keep: list[list[torch.Tensor]], out: str | Path,
                 padded_hf: bool = False, align: int = 8, dtype: torch.dtype | None = None) -> Path:
    """Rewrite the checkpoint with the kept atoms only, one decoder layer at a time (compact, or HF zero-padded)."""
    src, out = Path(checkpoint), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpoint(src)
    blocks = {b.layer: (i, b) for i, b in enumerate(check_moe(model))}
    kept_widths = {b.name: [int(m.sum()) for m in keep[i]] for _, (i, b) in blocks.items()}
    config = model.config
    width = None
    if padded_hf:  # the rule of moe.padded_width, applied to the kept widths (the skeleton is still full width)
        width = padded_width(config, max(max(w) for w in kept_widths.values()), align)
    index, shard = {}, 0

    def flush(tensors: dict[str, torch.Tensor]) -> None:
        nonlocal shard
        if not tensors:
            return
        shard += 1
        name = f"model-{shard:05d}.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / name), metadata={"format": "pt"})
        index.update({k: name for k in tensors})

    layer_keys = {k for k in ckpt.keys() if ".layers." in k}
    flush({k: ckpt.get(k) if dtype is None else ckpt.get(k).to(dtype) for k in ckpt.keys() if k not in layer_keys})
    for li, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{li}."
        _load(layer, ckpt, prefix, "cpu", dtype or torch.float32)
        if li in blocks:
            bi, b = blocks[li]
            for e, mask in enumerate(keep[bi]):
                b.set_expert(e, b.get_expert(e).select(mask.nonzero().flatten()))
        tensors = {prefix + k: v.detach().clone() for k, v in layer.state_dict().items()}
        if width is not None and li in blocks:
            _pad_layer(tensors, prefix, width)
        flush(tensors)
        _free(layer)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
    if width is not None:
        shared = (config.moe_intermediate_size * config.n_shared_experts
                  if getattr(config, "n_shared_experts", None) and config.model_type.startswith("deepseek") else None)
        setattr(config, WIDTH_ATTR.get(config.model_type, "moe_intermediate_size"), width)
        if shared:
            config.n_shared_experts = shared // width
    config.save_pretrained(out)
    if width is None:
        (out / "expert_widths.json").write_text(json.dumps(kept_widths, indent=1))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    return out


def _pad_layer(tensors: dict[str, torch.Tensor], prefix: str, width: int) -> None:
    """Zero-pad every routed expert of the layer to `width` (padded atoms are exactly zero: outputs unchanged)."""
    for k in list(tensors):
        if ".experts." not in k:
            continue
        t = tensors[k]
        if k.endswith("down_proj.weight"):
            tensors[k] = torch.cat([t, t.new_zeros(t.shape[0], width - t.shape[1])], 1)
        else:
            tensors[k] = torch.cat([t, t.new_zeros(width - t.shape[0], t.shape[1])], 0)


def stream_prune(checkpoint: str | Path, input_ids: torch.Tensor, ratio: float, out: str | Path,
                 method: str = "heapr", averaging: str = "per_token", fisher_state: str = "full", batch_size: int = 8,
                 device: str = "cpu", dtype: torch.dtype = torch.float32, offload: str | Path | None = None,
                 padded_hf: bool = False, log=print) -> dict:
    """Score (layer by layer), rank globally, write the pruned checkpoint; returns a small report."""
    check_ratio(ratio)
    model, scores, calib = stream_scores(checkpoint, input_ids, method, averaging, fisher_state, batch_size, device,
                                         dtype, offload, log)
    keep = global_keep(scores, ratio)
    write_pruned(checkpoint, model, keep, out, padded_hf=padded_hf, dtype=None)
    total = sum(m.numel() for per in keep for m in per)
    report = {"method": method, "ratio": ratio, "averaging": averaging, "atoms_total": total,
              "atoms_pruned": total - sum(int(m.sum()) for per in keep for m in per),
              "calib_tokens": calib.tokens, "calib_loss": calib.loss, "seconds": calib.seconds}
    (Path(out) / "heapr_report.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="local Hugging Face checkpoint folder (safetensors)")
    p.add_argument("--calib", nargs="+", required=True, help="raw text files (e.g. wikitext-2-raw/wiki.train.raw)")
    p.add_argument("--ratio", type=float, required=True, help="fraction of routed atoms removed, in (0, 1)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--method", default="heapr", choices=["heapr", "wanda"])
    p.add_argument("--averaging", default="per_token", choices=list(AVERAGING))
    p.add_argument("--fisher-state", default="full", choices=["full", "atom"])
    p.add_argument("--nsamples", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--offload", default=None, help="folder for the per-layer hidden states (default: a temp dir)")
    p.add_argument("--hf", action="store_true", help="write the transformers layout (zero-padded) instead of compact")
    a = p.parse_args(argv)
    try:
        check_ratio(a.ratio)
        ids = calibration_batches(a.checkpoint, a.calib, a.nsamples, a.seqlen)
        with tempfile.TemporaryDirectory(dir=a.offload) as tmp:
            report = stream_prune(a.checkpoint, ids, a.ratio, a.out, a.method, a.averaging, a.fisher_state,
                                  a.batch_size, a.device, getattr(torch, a.dtype), tmp, a.hf)
    except LitIclrError as e:
        raise SystemExit(f"heapr: error: {e}") from None
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
