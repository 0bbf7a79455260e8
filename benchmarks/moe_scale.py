"""MoE fine-tuning at scale, measured on this CPU: sharding, expert compute vs pruning, merge memory, memory plans.

    python benchmarks/moe_scale.py                 # all sections (the sharded run takes a few minutes)
    python benchmarks/moe_scale.py --skip-sharded

1. FSDP2 (configs/trainer/fsdp.yaml) on 2 gloo processes vs 1 process: the NAMEx fine-tune of the tiny Qwen2-MoE
   through the CLI (tests/namex/fsdp_worker.py): loss curves and the parameters each rank holds.
2. Routed-expert layer throughput vs pruned fraction: `VariableWidthExperts` (grouped, sorted-token) and the per-expert
   loop it replaces, on experts whose atoms were pruned at random (global ranking, so widths differ per expert).
3. One NAMEx HF training step, propagated state in the weights basis (per-unit (U, P) states) vs the expert basis
   (coefficients over the banks): heap bytes kept for the backward, peak resident memory, CPU time (each in its own
   process).
4. The memory plan (formula in lit_iclr/core/moe/memory.py) for DeepSeek-MoE-16B and Qwen1.5-MoE-A2.7B on 8 x 80 GB.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lit_iclr.core.moe import VariableWidthExperts, tiny_model  # noqa: E402
from lit_iclr.core.moe.memory import PRESETS, GiB, plan  # noqa: E402
from lit_iclr.namex.ffn import MergeOptions  # noqa: E402
from lit_iclr.namex.hf import apply_merging  # noqa: E402


def sharded(out: Path) -> str:
    from tests.namex.fsdp_worker import run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", NODE_RANK="0",
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests/namex/fsdp_worker.py"), str(out)], cwd=ROOT,
                              env=dict(env, LOCAL_RANK=str(r), RANK=str(r)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT) for r in range(2)]
    run(out, "single", 1, 4, 4, None)
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("the sharded run failed: run tests/namex/test_fsdp.py for its output")
    wall = time.perf_counter() - t0
    single = json.loads((out / "single_rank0.json").read_text())
    ranks = [json.loads((out / f"sharded_rank{r}.json").read_text()) for r in range(2)]
    resumed = json.loads((out / "resumed_rank0.json").read_text())
    rows = ["| step | 1 process loss | 2 processes (FSDP2) loss | resumed from step 2 |", "|---:|---:|---:|---:|"]
    for i, (a, b) in enumerate(zip(single["losses"], ranks[0]["losses"], strict=True)):
        c = resumed["losses"][i - 2] if i >= 2 else float("nan")
        rows.append(f"| {i + 1} | {a:.6f} | {b:.6f} | {c:.6f} |")
    total = ranks[0]["total"]
    rows.append("")
    rows.append("| process | parameters held | share | param + grad + AdamW bytes (fp32) |")
    rows.append("|---|---:|---:|---:|")
    rows.append(f"| 1 process | {single['local']:,} | 1.000 | {16 * single['local']:,} |")
    for r, x in enumerate(ranks):
        rows.append(f"| FSDP2 rank {r} | {x['local']:,} | {x['local'] / total:.3f} | {16 * x['local']:,} |")
    rows.append(f"\nwall time of the three runs (concurrent, incl. start-up): {wall:.0f} s")
    return "\n".join(rows)


def _pruned_experts(d: int, width: int, E: int, frac: float, seed: int = 0) -> VariableWidthExperts:
    """Experts with a random global fraction `frac` of their atoms removed (each keeps at least one atom)."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(E, width, generator=g) >= frac
    widths = [max(int(k.sum()), 1) for k in keep]
    ex = VariableWidthExperts(d, widths, "silu")
    for p in ex.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return ex.requires_grad_(False)


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def throughput(d: int, width: int, E: int, k: int, tokens: int, repeats: int) -> str:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, d, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, generator=g)
    rows = ["| pruned atoms | kept compute | grouped tok/s | grouped speed-up | ideal (1/kept) | grouped / ideal | "
            "loop tok/s | loop speed-up |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = None
    for frac in (0.0, 0.25, 0.5, 0.75):
        ex = _pruned_experts(d, width, E, frac)
        kept = sum(ex.widths()) / (E * width)
        with torch.no_grad():
            tg = _best(lambda ex=ex: ex.grouped_forward(x, idx, w), repeats)
            tl = _best(lambda ex=ex: ex.loop_forward(x, idx, w), repeats)
        if base is None:
            base = (tg, tl)
        rows.append(f"| {frac:.2f} | {kept:.3f} | {tokens / tg:,.0f} | {base[0] / tg:.2f} | {1 / kept:.2f} | "
                    f"{base[0] / tg * kept:.2f} | {tokens / tl:,.0f} | {base[1] / tl:.2f} |")
    return "\n".join(rows)


# ------------------------------------------------------------------ 3. memory and time of a NAMEx HF step, per path
STEP_MODEL = dict(hidden_size=128, moe_intermediate_size=256, num_experts=8, num_hidden_layers=4,
                  intermediate_size=256, shared_expert_intermediate_size=256, num_attention_heads=4)
STEP_CASES = [  # (label, merge options, activation checkpointing)
    ("camex (no chain)", dict(mode="camex", chunk=16), False),
    ("namex, beta 0", dict(mode="namex", chain_state="weights"), False),
    ("namex, beta 0", dict(mode="namex", chain_state="coefficients", chunk=16), False),
    ("namex, beta 0, act. ckpt", dict(mode="namex", chain_state="weights"), True),
    ("namex, beta 0, act. ckpt", dict(mode="namex", chain_state="coefficients", chunk=16), True),
    ("namex, complex beta, act. ckpt", dict(mode="namex", chain_state="weights", beta_abs=0.9, beta_phase=0.4), True),
    ("namex, complex beta, act. ckpt", dict(mode="namex", chain_state="coefficients", chunk=16, beta_abs=0.9,
                                            beta_phase=0.4), True),
]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]


def _libc():
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return libc


def _heap_bytes() -> int:
    """Bytes in use in the C heap (glibc mallinfo2), where CPU tensors live: what any holder keeps alive."""
    m = _libc().mallinfo2()
    return m.uordblks + m.hblkhd


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def step_memory_one(case: int, seq: int, segment: int, steps: int) -> dict:
    """One case in this process: heap bytes kept by a training forward for its backward, the peak resident memory
    of one forward + backward above the level before it (heap trimmed, VmHWM reset through /proc/self/clear_refs),
    CPU seconds."""
    _, opts, ckpt = STEP_CASES[case]
    torch.manual_seed(0)
    model = tiny_model("qwen2_moe", **STEP_MODEL).train()
    apply_merging(model, MergeOptions(segment=segment, **opts))
    if ckpt:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(1))
    times, kept, peak = [], [], []
    for i in range(steps + 1):  # step 0 allocates the gradients and warms up
        model.zero_grad(set_to_none=False)
        gc.collect()
        _libc().malloc_trim(0)  # freed heap back to the system: the resident size below is what is in use
        Path("/proc/self/clear_refs").write_text("5")
        rss, heap, t0 = _status_kib("VmRSS"), _heap_bytes(), time.process_time()
        loss = model(ids, use_cache=False).logits.float().square().mean()
        k = _heap_bytes() - heap
        loss.backward()
        del loss
        if i:
            times.append(time.process_time() - t0)
            kept.append(k)
            peak.append((_status_kib("VmHWM") - rss) * 1024)
    return {"kept": min(kept), "peak": min(peak), "cpu_s": sorted(times)[len(times) // 2]}


def step_memory(seq: int, segment: int, steps: int) -> str:
    """Each case in a fresh process (peak resident memory is per process), one after the other."""
    res = []
    for i in range(len(STEP_CASES)):
        out = subprocess.run([sys.executable, __file__, "--step-case", str(i), "--seq", str(seq), "--segment",
                              str(segment), "--steps", str(steps)], cwd=ROOT, capture_output=True, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
        res.append(json.loads(out.stdout.strip().splitlines()[-1]))
    m = STEP_MODEL
    P = 3 * m["moe_intermediate_size"] * m["hidden_size"]
    U = 2 * seq // segment
    rows = [f"(d {m['hidden_size']}, {m['num_experts']} experts of width {m['moe_intermediate_size']} (P = {P:,}), "
            f"{m['num_hidden_layers']} MoE layers, 2 x {seq} tokens, segment {segment}: U = {U} units; one (U, P) "
            f"fp32 state = {U * P * 4 / 2**20:.1f} MiB, one layer's bank = {m['num_experts'] * P * 4 / 2**20:.1f} MiB)",
            "", "| case | chain state | kept for backward (MiB) | peak over the step (MiB) | step CPU s | time / weights |",
            "|---|---|---:|---:|---:|---:|"]
    ref_t = {}
    for (label, opts, _), r in zip(STEP_CASES, res, strict=True):
        state = opts.get("chain_state", "-")
        if state == "weights":
            ref_t[label] = r["cpu_s"]
        ratio = f"{r['cpu_s'] / ref_t[label]:.2f}" if label in ref_t else "-"
        rows.append(f"| {label} | {state} | {r['kept'] / 2**20:.2f} | {r['peak'] / 2**20:.2f} | {r['cpu_s']:.3f} | "
                    f"{ratio} |")
    return "\n".join(rows)


def plans() -> str:
    rows = ["| model | segment | mode | chain state | weights | grads | AdamW | gathered | activations | logits | "
            "merge bank | bank grads | merge state | merged | total GiB/device | fits 80 GB |",
            "|---|---:|---|---|" + "---:|" * 12]
    cases = [(16, "namex", "weights", 0.0), (16, "namex", "coefficients", 0.0), (16, "namex", "weights", 0.9),
             (16, "namex", "coefficients", 0.9), (32, "namex", "weights", 0.0), (16, "camex", "weights", 0.0)]
    for name in ("deepseek-moe-16b", "qwen1.5-moe-a2.7b"):
        for segment, mode, state, beta in cases:
            t = plan(PRESETS[name], 8, batch=1, seq_len=2048, segment=segment, mode=mode, chunk=16, beta_abs=beta,
                     chain_state=state)
            g = {k: v / GiB for k, v in t.items()}
            label = f"{mode}{' (complex beta)' if beta else ''}"
            rows.append(f"| {name} | {segment} | {label} | {state if mode == 'namex' else '-'} | {g['weights']:.1f} | "
                        f"{g['gradients']:.1f} | {g['optimizer']:.1f} | {g['gathered']:.1f} | {g['activations']:.2f} | "
                        f"{g['logits']:.2f} | {g['merge bank']:.2f} | {g['bank grads']:.2f} | {g['merge state']:.2f} | "
                        f"{g['merged']:.2f} | {g['total']:.1f} | {'yes' if t['total'] <= 80e9 else 'no'} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-sharded", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--segment", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--step-case", type=int, default=None, help=argparse.SUPPRESS)  # one case of section 3
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if a.step_case is not None:
        print(json.dumps(step_memory_one(a.step_case, a.seq, a.segment, a.steps)))
        return
    if not a.skip_sharded:
        with tempfile.TemporaryDirectory() as tmp:
            print("## 1. FSDP2 on 2 CPU processes vs 1 process (tiny Qwen2-MoE, NAMEx, CLI)\n")
            print(sharded(Path(tmp)), "\n")
    if not a.skip_throughput:
        print(f"## 2. Routed-expert layer (E=16, d=1024, width 512, top-2, {a.tokens} tokens): throughput vs pruned "
              "atoms\n")
        print(throughput(1024, 512, 16, 2, a.tokens, a.repeats), "\n")
    print("## 3. NAMEx HF training step: memory kept for the backward, peak memory and CPU time, per chain state\n")
    print(step_memory(a.seq, a.segment, a.steps), "\n")
    print("## 4. Memory plan, 8 devices, 1 x 2048 tokens per device, activation checkpointing, chunk 16\n")
    print(plans())


if __name__ == "__main__":
    main()
