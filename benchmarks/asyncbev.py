"""AsyncBEV benchmark: nuScenes NDS / mAP (all and dynamic objects) under LiDAR or camera delay, from nuscenes-devkit.

Per seed: (1) train the synchronous detector (LiDAR pillars + camera lift + CenterPoint head, both sensors at the keyframe);
(2) train the AsyncBEV module on top of it, detector frozen (as the paper starts from the synchronous checkpoint), with a
random delay per sample (LiDAR 0-0.6 s in 20 Hz sweeps or camera 0-8 frames at 12 Hz). Then evaluate the same weights
with no compensation, EMC, AsyncBEV and the oracle warp (EMC + ground-truth flow) at fixed offsets, plus the flow
end-point error per speed bucket, and time training steps of the detector with and without AsyncBEV.

    OMP_NUM_THREADS=1 python benchmarks/asyncbev.py --seeds 0 1 2 --offsets 0 0.5

Prints a markdown table (and writes --out JSON).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from lit_iclr.asyncbev.data import NuScenesAsync
from lit_iclr.asyncbev.evaluate import nuscenes_metrics, write_results
from lit_iclr.asyncbev.module import AsyncBEV
from lit_iclr.asyncbev.targets import epe_by_bucket, gt_velocity_field
from lit_iclr.core.stats import mean_std, paired_ci

COMPS = ("none", "emc", "asyncbev", "oracle")


def batches(loader):
    while True:
        yield from loader


def train(model: AsyncBEV, loader, steps: int, params, lr: float) -> float:
    """`steps` AdamW steps; returns training samples per second."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    model.train()
    it, n, t0 = batches(loader), 0, time.perf_counter()
    for step in range(steps):
        b = next(it)
        loss = model.losses(b)["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        opt.step()
        n += len(b["dt"])
        if step % 20 == 0:
            print(f"  step {step} loss {float(loss):.3f}", flush=True)
    return n / (time.perf_counter() - t0)


def freeze_detector(model: AsyncBEV) -> list:
    for p in model.detector_parameters():
        p.requires_grad_(False)
    for name, m in model.net.named_modules():
        if not name.startswith("flow") and isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    return list(model.net.flow.parameters())


@torch.no_grad()
def evaluate(model: AsyncBEV, dm: NuScenesAsync, delayed: str, offset: float, comp: str, batch_size: int) -> dict:
    model.eval()
    results, epe = {}, {}
    for b in DataLoader(dm.dataset("val", offset, delayed), batch_size=batch_size):
        results.update(model.predict_boxes(b, comp))
        if comp in ("emc", "asyncbev"):
            gt_v = gt_velocity_field(b["boxes"], b["boxes_mask"], b["dt"], model.net.grid)
            dt = b["dt"].view(-1, 1, 1, 1)
            pred = model.net(b, "asyncbev")["velocity"] * dt if comp == "asyncbev" else torch.zeros_like(gt_v)
            for k, (s, c) in epe_by_bucket(pred, gt_v * dt, gt_v).items():
                epe[k] = (epe.get(k, (0.0, 0))[0] + s, epe.get(k, (0.0, 0))[1] + c)
    with tempfile.TemporaryDirectory() as tmp:
        m = nuscenes_metrics(dm.reader.nusc, write_results(Path(tmp) / "r.json", results), dm.val_split, tmp)
    m["epe"] = {k: s / max(c, 1) for k, (s, c) in epe.items()}
    return m


def speed(model: AsyncBEV, loader, steps: int) -> dict[str, float]:
    """Training samples/s of the detector alone (no compensation) and with AsyncBEV, all weights trainable, same batches."""
    out = {}
    for comp in ("none", "asyncbev"):
        for p in model.parameters():
            p.requires_grad_(True)
        model.compensation = comp
        params = [p for p in model.parameters() if p.requires_grad]
        train(model, loader, 1, params, 0.0)  # warm-up
        out[comp] = train(model, loader, steps, params, 0.0)
    return out


def run_seed(seed: int, args) -> dict:
    torch.manual_seed(seed)
    dm = NuScenesAsync(batch_size=args.batch_size, num_sweeps=args.num_sweeps, max_points=args.max_points, seed=seed,
                       data_dir=args.data_dir, root=args.root)
    dm.prepare_data()
    dm.setup()
    model = AsyncBEV(channels=args.channels, compensation="none", image_backbone=args.backbone)
    sync = DataLoader(dm.dataset("train", 0.0, "lidar"), batch_size=args.batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed))
    t = time.perf_counter()
    train(model, sync, args.det_steps, [p for p in model.parameters()], args.lr)
    print(f"seed {seed}: detector trained in {time.perf_counter() - t:.0f} s", flush=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.compensation = "asyncbev"
    asyn = DataLoader(dm.dataset("train", None, args.train_delayed), batch_size=args.batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed))
    t = time.perf_counter()
    train(model, asyn, args.flow_steps, freeze_detector(model), args.lr)
    print(f"seed {seed}: AsyncBEV trained in {time.perf_counter() - t:.0f} s", flush=True)
    res = {}
    for delayed in args.delayed:
        for off in args.offsets:
            for comp in COMPS:
                if off == 0 and comp != "none":
                    continue  # at 0 s every compensation is the identity up to the learned flow; see asyncbev@0 below
                res[f"{delayed}/{off}/{comp}"] = evaluate(model, dm, delayed, off, comp, args.batch_size)
            if off == 0:
                res[f"{delayed}/0.0/asyncbev"] = evaluate(model, dm, delayed, 0.0, "asyncbev", args.batch_size)
            print(f"seed {seed} {delayed} {off}: " + ", ".join(
                f"{k.split('/')[-1]} dynNDS {v['dynamic']['NDS']:.3f}" for k, v in res.items()
                if k.startswith(f"{delayed}/{off}/")), flush=True)
    if seed == args.seeds[0] and args.speed_steps:
        model.load_state_dict(state)
        res["speed"] = speed(model, asyn, args.speed_steps)
    return res


def table(all_res: dict[int, dict], args) -> str:
    seeds = sorted(all_res)
    lines = ["| delayed | offset (s) | method | NDS all | mAP all | NDS dynamic | mAP dynamic | mAVE all |",
             "|---|---|---|---|---|---|---|---|"]
    keys = [k for k in all_res[seeds[0]] if k != "speed"]
    names = {"none": "no compensation", "emc": "EMC", "asyncbev": "AsyncBEV", "oracle": "oracle flow (EMC + GT flow)"}
    for k in keys:
        delayed, off, comp = k.split("/")
        name = "synchronous" if float(off) == 0 and comp == "none" else names[comp]
        vals = [all_res[s][k] for s in seeds]
        cells = [mean_std([v[sp][m] for v in vals]) for sp, m in
                 (("all", "NDS"), ("all", "mAP"), ("dynamic", "NDS"), ("dynamic", "mAP"), ("all", "mAVE"))]
        lines.append(f"| {delayed} | {off} | {name} | " + " | ".join(cells) + " |")
    out = ["\n".join(lines), ""]
    for delayed in args.delayed:
        for off in args.offsets:
            a, e = f"{delayed}/{off}/asyncbev", f"{delayed}/{off}/emc"
            if off == 0:
                e = f"{delayed}/0.0/none"
            if a in all_res[seeds[0]] and e in all_res[seeds[0]]:
                for sp in ("dynamic", "all"):
                    ci = paired_ci([all_res[s][a][sp]["NDS"] for s in seeds], [all_res[s][e][sp]["NDS"] for s in seeds])
                    ref = "synchronous" if off == 0 else "EMC"
                    out.append(f"- {delayed} delayed {off} s, NDS {sp}: AsyncBEV - {ref} = {ci} (paired 95% CI, "
                               f"{len(seeds)} seeds)")
    out.append("")
    out.append("| delayed | offset (s) | flow | EPE <0.4 m/s | EPE 0.4-1.0 m/s | EPE >1.0 m/s |")
    out.append("|---|---|---|---|---|---|")
    for k in keys:
        delayed, off, comp = k.split("/")
        if comp in ("emc", "asyncbev") and all_res[seeds[0]][k]["epe"]:
            name = "zero (EMC)" if comp == "emc" else "AsyncBEV"
            cells = [mean_std([all_res[s][k]["epe"].get(b, float("nan")) for s in seeds]) for b in ("<0.4", "0.4-1.0", ">1.0")]
            out.append(f"| {delayed} | {off} | {name} | " + " | ".join(cells) + " |")
    sp = all_res[seeds[0]].get("speed")
    if sp:
        out.append("")
        out.append(f"Training speed (seed {seeds[0]}, batch {args.batch_size}, all weights trainable): detector "
                   f"{sp['none']:.2f} samples/s, with AsyncBEV {sp['asyncbev']:.2f} samples/s "
                   f"(ratio {sp['asyncbev'] / sp['none']:.2f}).")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--offsets", type=float, nargs="+", default=[0.0, 0.5])
    ap.add_argument("--delayed", nargs="+", default=["lidar", "camera"])
    ap.add_argument("--train-delayed", default="random")
    ap.add_argument("--det-steps", type=int, default=150)
    ap.add_argument("--flow-steps", type=int, default=60)
    ap.add_argument("--speed-steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--backbone", default="test_resnet")
    ap.add_argument("--num-sweeps", type=int, default=3)
    ap.add_argument("--max-points", type=int, default=12000)
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--root", default=None, help="nuScenes root (default: the generated world under --data-dir)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-json", nargs="+", default=None, help="only print the table of earlier --out files")
    args = ap.parse_args()
    torch.set_num_threads(1)
    np.seterr(all="ignore")
    if args.from_json:  # seeds run as separate processes, merged here
        all_res = {int(k): v for f in args.from_json for k, v in json.loads(Path(f).read_text()).items()}
        args.seeds = sorted(all_res)
    else:
        all_res = {s: run_seed(s, args) for s in args.seeds}
    if args.out:
        Path(args.out).write_text(json.dumps(all_res, indent=1))
    print(table(all_res, args))


if __name__ == "__main__":
    main()
