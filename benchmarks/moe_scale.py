"""MoE fine-tuning at scale, measured on this CPU: sharding, expert compute vs pruning, merge memory, memory plans.

    python benchmarks/moe_scale.py                 # all sections (the sharded run takes a few minutes)
    python benchmarks/moe_scale.py --skip-sharded

1. FSDP2 (configs/trainer/fsdp.yaml) on 2 gloo processes vs 1 process: the NAMEx fine-tune of the tiny Qwen2-MoE
   through the CLI (tests/namex/fsdp_worker.py): loss curves and the parameters each rank holds.
2. Routed-expert layer throughput vs pruned fraction: `VariableWidthExperts` (grouped, sorted-token) and the per-expert
   loop it replaces, on experts whose atoms were pruned at random (global ranking, so widths differ per expert).
3. Bytes kept for the backward by one NAMEx HF merging step (saved-tensor hooks): all merge units at once vs `chunk`.
4. The memory plan (formula in lit_iclr/core/moe/memory.py) for DeepSeek-MoE-16B and Qwen1.5-MoE-A2.7B on 8 x 80 GB.
"""
from __future__ import annotations

import argparse
import json
import os
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


def saved_bytes(model, ids) -> int:
    """Bytes of the distinct tensors autograd keeps for the backward of one forward."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, use_cache=False).logits.square().mean()
    loss.backward()
    return sum(seen.values())


def merge_memory(seq: int, segment: int) -> str:
    rows = ["| mode | chunk | kept for backward (MiB) | vs all units |", "|---|---:|---:|---:|"]
    ids = torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(0))
    for mode in ("smear", "camex", "namex"):
        ref = None
        for chunk in (None, 4):
            model = tiny_model("qwen2_moe", hidden_size=64, moe_intermediate_size=128, num_experts=8,
                               num_hidden_layers=2).train()
            apply_merging(model, MergeOptions(mode=mode, segment=segment, beta_abs=0.9, beta_phase=0.4, chunk=chunk))
            b = saved_bytes(model, ids)
            ref = ref or b
            rows.append(f"| {mode} | {chunk or 'all'} | {b / 2**20:.2f} | {b / ref:.2f} |")
    return "\n".join(rows)


def plans() -> str:
    rows = ["| model | segment | mode | weights | grads | AdamW | gathered | activations | logits | merge bank | "
            "merge state | total GiB/device | fits 80 GB |", "|---|---:|---|" + "---:|" * 10]
    for name in ("deepseek-moe-16b", "qwen1.5-moe-a2.7b"):
        for segment, mode in ((16, "namex"), (256, "namex"), (16, "camex")):
            t = plan(PRESETS[name], 8, batch=1, seq_len=2048, segment=segment, mode=mode, chunk=16)
            g = {k: v / GiB for k, v in t.items()}
            rows.append(f"| {name} | {segment} | {mode} | {g['weights']:.1f} | {g['gradients']:.1f} | "
                        f"{g['optimizer']:.1f} | {g['gathered']:.1f} | {g['activations']:.2f} | {g['logits']:.2f} | "
                        f"{g['merge bank']:.2f} | {g['merge state']:.1f} | {g['total']:.1f} | "
                        f"{'yes' if t['total'] <= 80e9 else 'no'} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-sharded", action="store_true")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if not a.skip_sharded:
        with tempfile.TemporaryDirectory() as tmp:
            print("## 1. FSDP2 on 2 CPU processes vs 1 process (tiny Qwen2-MoE, NAMEx, CLI)\n")
            print(sharded(Path(tmp)), "\n")
    print(f"## 2. Routed-expert layer (E=16, d=1024, width 512, top-2, {a.tokens} tokens): throughput vs pruned atoms\n")
    print(throughput(1024, 512, 16, 2, a.tokens, a.repeats), "\n")
    print("## 3. NAMEx HF step (2 x 128 tokens, segment 8): tensors kept for the backward\n")
    print(merge_memory(128, 8), "\n")
    print("## 4. Memory plan, 8 devices, 1 x 2048 tokens per device, activation checkpointing\n")
    print(plans())


if __name__ == "__main__":
    main()
