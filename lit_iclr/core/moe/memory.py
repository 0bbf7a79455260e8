"""The memory plan of a (merging) MoE fine-tune per device, before it starts: what is kept, and the formula.

With D devices (FSDP2 full sharding), N parameters, micro-batch B sequences of T tokens per device, hidden d, L decoder
layers of which L_m are MoE layers with n routed experts of P = 3 I d parameters each, merge segment S (U = B T / S merge
units per device), master weights in fp32 and compute in `p` bytes (2 for bf16):

    weights      4 N / D                      sharded fp32 master copy
    gradients    4 N / D                      sharded fp32
    optimizer    8 N / D                      AdamW m and v, fp32
    gathered     2 p N_layer                  the current and the prefetched decoder layer, unsharded in compute dtype
    activations  34 B T d p L                 (Korthikanti et al. 2022, flash attention: no T^2 term)
                 with checkpointing: 2 B T d p L  (each layer's input) + 34 B T d p (one layer replayed)
    logits       8 B T V                      fp32 logits and their gradient
    merge bank   L_m (n + 1) P p              each MoE layer's experts concatenated (+ the mean base), kept for the
                                              backward; with checkpointing only the replayed layer's: (n + 1) P p
    merge state  L_m s U P p                  chain_state `weights`: the propagated base/momentum per merge unit
                                              (s = 0 SMEAR/CAMEx; 1 EP-CAMEx and NAMEx with beta = 0; 2 NAMEx with
                                              real beta != 0 (base, Re mu); 3 with complex beta (base, Re mu, Im mu));
                                              the base is also the merged expert the layer applies
    merged       L_m U P p                    SMEAR/CAMEx's per-unit merged experts kept for the backward; with
                                              `chunk` c units: c P p transient (recomputed in the backward)

chain_state `coefficients` (EP-CAMEx / NAMEx in the expert basis, `lit_iclr.namex.hf`) replaces the merge terms by

    merge bank   L_m n P p                    every MoE layer's flat experts, kept until the backward (each layer's
                                              merged experts are combinations of all earlier layers' experts)
    bank grads   L_m n P p                    their gradients, pending during the backward until each bank's own
                                              layer is reached (every later layer adds to them)
    merge state  L_m s U K 4 + K^2 8          fp32 coefficients over K <= L_m n experts + the float64 Gram matrix
    merged       2 c P p                      one chunk's merged weights and their gradient (c = chunk, else U),
                                              transient: rebuilt in the backward

This closed form is the MoE case of `cli.py plan` (`core/plan.py`): a method's plan.py returns `memory_hook` as its
`memory`, and the plan shows these terms (under its strategy and precision, `plan_terms`) next to its measured
parameters and FLOPs. `plan(config, devices, ...)` returns the terms in bytes; `format_plan` renders a table;
`plan_for_run(module)` prints the plan of a running NAMEx fine-tune (rank 0, before the first step). PRESETS holds the
public configurations of DeepSeek-MoE-16B and Qwen1.5-MoE-A2.7B (from their config.json files), so the formula needs no
download; the module's command line prints just this table for a preset:

    python -m lit_iclr.core.moe.memory --model qwen1.5-moe-a2.7b --devices 8 --seq-len 2048 --segment 16
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

GiB = 1024 ** 3

# The fields of the public config.json files that the formula needs.
PRESETS = {
    "qwen1.5-moe-a2.7b": dict(model_type="qwen2_moe", hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                              num_key_value_heads=16, vocab_size=151936, num_experts=60, moe_intermediate_size=1408,
                              shared_expert_intermediate_size=5632, intermediate_size=5632, num_experts_per_tok=4,
                              tie_word_embeddings=False),
    "deepseek-moe-16b": dict(model_type="deepseek", hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                             num_key_value_heads=16, vocab_size=102400, n_routed_experts=64, moe_intermediate_size=1408,
                             n_shared_experts=2, intermediate_size=10944, first_k_dense_replace=1,
                             num_experts_per_tok=6, tie_word_embeddings=False),
}


@dataclass
class Shape:
    """What the formula needs from a config."""

    d: int
    layers: int
    moe_layers: int
    experts: int
    width: int
    vocab: int
    params: int
    layer_params: int  # the largest decoder layer

    @property
    def expert_params(self) -> int:
        return 3 * self.width * self.d


def _get(cfg, name, default=None):
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def shape_of(cfg) -> Shape:
    """Parameter counts of a Qwen2-MoE / Mixtral / DeepSeek(-V2/V3) config (a dict or a transformers config)."""
    d, L, V = _get(cfg, "hidden_size"), _get(cfg, "num_hidden_layers"), _get(cfg, "vocab_size")
    heads = _get(cfg, "num_attention_heads")
    kv = _get(cfg, "num_key_value_heads") or heads
    hd = _get(cfg, "head_dim") or d // heads
    n = _get(cfg, "num_experts") or _get(cfg, "n_routed_experts") or _get(cfg, "num_local_experts")
    kind = _get(cfg, "model_type", "")
    width = _get(cfg, "intermediate_size") if kind == "mixtral" else _get(cfg, "moe_intermediate_size")
    shared = _get(cfg, "shared_expert_intermediate_size") or width * (_get(cfg, "n_shared_experts") or 0)
    dense_first = _get(cfg, "first_k_dense_replace") or 0
    attn = d * heads * hd * 2 + 2 * d * kv * hd + 2 * d  # q, o, k, v projections and the two norms
    if kind == "qwen2_moe":
        attn += heads * hd + 2 * kv * hd  # Qwen's q/k/v biases
    moe_layer = attn + n * d + n * 3 * width * d + 3 * shared * d + (d if kind == "qwen2_moe" else 0)
    dense_layer = attn + 3 * (_get(cfg, "intermediate_size") or 0) * d
    emb = V * d * (1 if _get(cfg, "tie_word_embeddings", False) else 2) + d
    total = emb + (L - dense_first) * moe_layer + dense_first * dense_layer
    return Shape(d, L, L - dense_first, n, width, V, total, max(moe_layer, dense_layer if dense_first else 0))


def plan(cfg, devices: int, batch: int = 1, seq_len: int = 2048, segment: int | None = 16, mode: str = "namex",
         beta_abs: float = 0.0, beta_phase: float = 0.3927, chunk: int | None = None,
         activation_checkpointing: bool = True, compute_bytes: int = 2, chain_state: str = "weights"
         ) -> dict[str, float]:
    """Bytes per device of each term of the module docstring's formula (and `total`).

    chain_state: `weights` or `coefficients` (`auto` resolves to coefficients, as it does without TIES/DARE masks).
    """
    s = shape_of(cfg)
    p, N, D, BT = compute_bytes, s.params, devices, batch * seq_len
    U = batch * (seq_len // segment if segment and segment < seq_len else 1)
    P, Lm = s.expert_params, s.moe_layers
    out = {"weights": 4 * N / D, "gradients": 4 * N / D, "optimizer": 8 * N / D, "gathered": 2 * p * s.layer_params}
    if activation_checkpointing:
        out["activations"] = 2 * BT * s.d * p * s.layers + 34 * BT * s.d * p
    else:
        out["activations"] = 34 * BT * s.d * p * s.layers
    out["logits"] = 8 * BT * s.vocab
    merging = mode in ("smear", "camex", "ep_camex", "namex")
    out["merge bank"] = ((s.experts + 1) * P * p * (1 if activation_checkpointing else Lm)) if merging else 0
    out["bank grads"] = 0.0
    states = {"ep_camex": 1, "namex": 1 + (1 if beta_abs else 0) + (1 if beta_abs and math.sin(beta_phase) else 0)
              }.get(mode, 0)
    out["merge state"] = Lm * states * U * P * p
    if states and chain_state in ("coefficients", "auto"):
        K = Lm * s.experts
        c = min(chunk, U) if chunk else U
        out["merge bank"] = out["bank grads"] = Lm * s.experts * P * p
        out["merge state"] = Lm * states * U * K * 4 + K * K * 8
        out["merged"] = 2 * c * P * p
    elif mode in ("smear", "camex"):
        kept = min(chunk, U) if chunk else U
        out["merged"] = kept * P * p * (1 if (chunk or activation_checkpointing) else Lm)
    else:
        out["merged"] = 0.0
    out["total"] = sum(out.values())
    return out


def format_plan(name: str, terms: dict[str, float], devices: int, capacity_gib: float | None = None) -> str:
    unit, scale = ("GiB", GiB) if terms["total"] >= GiB / 10 else ("MiB", 2 ** 20)
    rows = "\n".join(f"| {k} | {v / scale:,.3f} |" for k, v in terms.items())
    fit = ""
    if capacity_gib is not None:
        fit = f"\n\n{'fits' if terms['total'] / GiB <= capacity_gib else 'does NOT fit'} in {capacity_gib:.1f} GiB per device"
    return f"memory plan: {name} on {devices} device(s), per device\n\n| term | {unit} |\n|---|---:|\n{rows}{fit}"


def plan_terms(cfg, strategy, batch: int = 1, seq_len: int = 2048, precision: str = "bf16-mixed",
               activation_checkpointing: bool = True, options=None, chain_state: str | None = None) -> dict[str, float]:
    """The formula as the memory of `cli.py plan` (`core/plan.py`): its terms for the plan's `strategy` (a
    `core.plan_memory.Strategy`). FSDP shards over the devices of a node (HSDP replicates across nodes); DDP and one
    device hold full copies (no gathered layer) and DDP adds its gradient buckets. `options`: the module's MergeOptions
    (None: a plain fine-tune, no merging terms). `*-true` 16-bit precisions store weights, gradients and Adam state in
    2 bytes instead of the fp32 master copy."""
    o = options
    kind, shards = getattr(strategy, "kind", "fsdp"), getattr(strategy, "shards", 1)
    compute = 2 if "16" in str(precision) else 4
    terms = plan(cfg, shards, batch, seq_len, getattr(o, "segment", None), getattr(o, "mode", "none"),
                 getattr(o, "beta_abs", 0.0), getattr(o, "beta_phase", 0.3927), getattr(o, "chunk", None),
                 activation_checkpointing, compute, chain_state or getattr(o, "chain_state", "weights"))
    del terms["total"]
    if "true" in str(precision) and compute == 2:
        for k in ("weights", "gradients", "optimizer"):
            terms[k] /= 2
    if kind != "fsdp" or shards == 1:
        terms["gathered"] = 0.0
    if kind == "ddp":
        terms["ddp buckets"] = terms["gradients"]
    return terms


def memory_hook(module, batch, strategy, devices, precision) -> dict[str, float] | None:
    """A method plan.py's `memory` for a module wrapping a Hugging Face MoE (NAMExHFCausalLM's `net`, or a `model`):
    the formula with the module's config, merge options and activation checkpointing, the batch's (B, T) token ids.
    None (measure instead) when the module holds no MoE config the formula knows."""
    net = getattr(module, "net", None) or getattr(module, "model", None)
    cfg = getattr(net, "config", None)
    if cfg is None or not (_get(cfg, "num_experts") or _get(cfg, "n_routed_experts") or _get(cfg, "num_local_experts")):
        return None
    tokens = batch.get("input_ids") if isinstance(batch, dict) else batch
    if not hasattr(tokens, "shape") or len(tokens.shape) != 2:
        return None
    hp = getattr(module, "hparams", {}) or {}
    options = getattr(module, "merge", None)
    state = _resolved_chain_state(net, options) if options is not None else None
    return plan_terms(cfg, strategy, tokens.shape[0], tokens.shape[1], precision,
                      bool(hp.get("activation_checkpointing")), options, state)


def _resolved_chain_state(model, options) -> str:
    patches = [vars(m).get("_namex_patch") for m in model.modules()]
    patches = [x for x in patches if x is not None]
    if patches:
        return "coefficients" if patches[0].coefficients else "weights"
    return getattr(options, "chain_state", "weights")


def plan_for_run(module) -> str:
    """The plan of a running `NAMExHFCausalLM` fit (its model config, merge options, batch and strategy)."""
    trainer, hp, o = module.trainer, module.hparams, module.merge
    dm = getattr(trainer, "datamodule", None)
    batch, seq = getattr(dm, "batch_size", 1), getattr(dm, "seq_len", 2048)
    cfg = module.net.config
    prec = str(trainer.precision)
    bytes_ = 2 if ("bf16" in prec or "16" in prec or hp.get("param_dtype") in ("bfloat16", "float16")) else 4
    state = _resolved_chain_state(module.net, o)
    terms = plan(cfg, trainer.world_size, batch, seq, o.segment, o.mode, o.beta_abs, o.beta_phase, o.chunk,
                 bool(hp.get("activation_checkpointing")), bytes_, state)
    return format_plan(f"{cfg.model_type} ({shape_of(cfg).params / 1e9:.3g}B parameters), {o.mode}, chain state "
                       f"{state}", terms, trainer.world_size)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Memory plan of a merging MoE fine-tune per device.")
    ap.add_argument("--model", choices=sorted(PRESETS), required=True)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--capacity-gib", type=float, default=80e9 / GiB, help="per device (default: 80 GB = 74.5 GiB)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--segment", type=int, default=16)
    ap.add_argument("--mode", default="namex")
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--chain-state", choices=("weights", "coefficients"), default="coefficients")
    ap.add_argument("--beta-abs", type=float, default=0.0)
    ap.add_argument("--no-checkpointing", action="store_true")
    a = ap.parse_args(argv)
    terms = plan(PRESETS[a.model], a.devices, a.batch, a.seq_len, a.segment, a.mode, beta_abs=a.beta_abs,
                 chunk=a.chunk, activation_checkpointing=not a.no_checkpointing, chain_state=a.chain_state)
    print(format_plan(f"{a.model}, {a.mode}, segment {a.segment}", terms, a.devices, a.capacity_gib))


if __name__ == "__main__":
    main()
