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
from lit_iclr.asyncbev.targets import epe_by_bucket, flow_loss, gt_velocity_field, uncompensated_flow
from lit_iclr.core.stats import mean_std, paired_ci

COMPS = ("none", "emc", "asyncbev", "oracle")


def batches(loader):
    while True:
        yield from loader


def optimise(loss_fn, loader, steps: int, params, lr: float, tag: str = "") -> float:
    """`steps` AdamW steps on `loss_fn(batch)`, gradients clipped at 10; returns training samples per second."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    it, n, t0 = batches(loader), 0, time.perf_counter()
    for step in range(steps):
        b = next(it)
        loss = loss_fn(b)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        opt.step()
        n += len(b["dt"])
        if step % 20 == 0:
            print(f"  {tag}step {step} loss {float(loss):.3f}", flush=True)
    return n / (time.perf_counter() - t0)


def train(model: AsyncBEV, loader, steps: int, params, lr: float) -> float:
    """`steps` AdamW steps on the full objective; returns training samples per second."""
    model.train()
    return optimise(lambda b: model.losses(b)["loss"], loader, steps, params, lr)


def train_flow(model: AsyncBEV, loader, steps: int, lr: float) -> float:
    """The AsyncBEV stage with the flow loss alone: the frozen detector's BEV maps are computed without gradient, so a
    step costs the two encoders' forward pass plus the flow module (the full objective adds the frozen head's
    detection loss). Returns training samples per second."""
    net, params = model.net, freeze_detector(model)

    def loss_fn(b):
        gt_v = gt_velocity_field(b["boxes"], b["boxes_mask"], b["dt"], net.grid)
        with torch.no_grad():
            cam, lid = net.flow_inputs(*net.encode(b), b)
        _, flow = net.flow(cam, lid, b["emc"], b["dt"])
        return flow_loss(flow, gt_v * b["dt"].view(-1, 1, 1, 1), gt_v)

    return optimise(loss_fn, loader, steps, params, lr, tag="flow ")


def freeze_detector(model: AsyncBEV) -> list:
    for p in model.detector_parameters():
        p.requires_grad_(False)
    for name, m in model.net.named_modules():
        if not name.startswith("flow") and isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    return list(model.net.flow.parameters())


@torch.no_grad()
def evaluate(model: AsyncBEV, dm: NuScenesAsync, delayed: str, offset: float, comp: str, batch_size: int,
             detect: bool = True) -> dict:
    model.eval()
    results, epe = {}, {}
    for b in DataLoader(dm.dataset("val", offset, delayed), batch_size=batch_size):
        if detect:
            results.update(model.predict_boxes(b, comp))
        if comp in ("none", "emc", "asyncbev"):
            gt_v = gt_velocity_field(b["boxes"], b["boxes_mask"], b["dt"], model.net.grid)
            dt = b["dt"].view(-1, 1, 1, 1)
            pred = torch.zeros_like(gt_v)  # EMC: zero flow after ego-motion compensation
            if comp == "asyncbev":
                pred = model.net(b, "asyncbev")["velocity"] * dt
            target = gt_v * dt
            if comp == "none":  # no compensation: zero flow against the displacement of ego motion and object motion
                target = uncompensated_flow(target, b["emc"], model.net.grid)
            for k, (s, c) in epe_by_bucket(pred, target, gt_v).items():
                epe[k] = (epe.get(k, (0.0, 0))[0] + s, epe.get(k, (0.0, 0))[1] + c)
    m = {}
    if detect:
        with tempfile.TemporaryDirectory() as tmp:
            m = nuscenes_metrics(dm.reader.nusc, write_results(Path(tmp) / "r.json", results), dm.val_split, tmp)
    m["epe"] = {k: s / c if c else float("nan") for k, (s, c) in epe.items()}  # nan: no cell of that speed
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
    if args.flow_loss_only:
        train_flow(model, asyn, args.flow_steps, args.lr)
    else:
        train(model, asyn, args.flow_steps, freeze_detector(model), args.lr)
    print(f"seed {seed}: AsyncBEV trained in {time.perf_counter() - t:.0f} s", flush=True)
    res = {}
    for delayed in args.delayed:
        for off in args.offsets:
            for comp in COMPS:
                if off == 0 and comp != "none":
                    continue  # at 0 s every compensation is the identity up to the learned flow; see asyncbev@0 below
                if args.epe_only and comp == "oracle":
                    continue
                res[f"{delayed}/{off}/{comp}"] = evaluate(model, dm, delayed, off, comp, args.batch_size, not args.epe_only)
            if off == 0:
                res[f"{delayed}/0.0/asyncbev"] = evaluate(model, dm, delayed, 0.0, "asyncbev", args.batch_size,
                                                          not args.epe_only)
            print(f"seed {seed} {delayed} {off}: " + ", ".join(
                f"{k.split('/')[-1]} EPE>1 {v['epe'].get('>1.0', float('nan')):.3f}" for k, v in res.items()
                if k.startswith(f"{delayed}/{off}/")), flush=True)
    if seed == args.seeds[0] and args.figure:
        flow_figure(model, dm, args.delayed[0], max(args.offsets), args.figure)
    if seed == args.seeds[0] and args.speed_steps:
        model.load_state_dict(state)
        res["speed"] = speed(model, asyn, args.speed_steps)
    return res


@torch.no_grad()
def flow_figure(model: AsyncBEV, dm: NuScenesAsync, delayed: str, offset: float, path: str) -> None:
    """BEV figure of one validation keyframe: LiDAR occupancy, ground-truth and predicted flow arrows, GT boxes at t1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model.eval()
    ds = dm.dataset("val", offset, delayed)
    b = next(b for b in DataLoader(ds, batch_size=1) if float(b["dt"][0]) > offset - 0.01)  # not a scene's first keyframe
    grid = model.net.grid
    gt_v = gt_velocity_field(b["boxes"], b["boxes_mask"], b["dt"], grid)
    dt = float(b["dt"][0])
    pred = model.net(b, "asyncbev")["velocity"] * dt
    xy = grid.centres().numpy()
    pts = b["points"][0][b["points_mask"][0]].numpy()
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.4))
    for ax, flow, title in ((axes[0], gt_v[0] * dt, "ground-truth flow"), (axes[1], pred[0], "AsyncBEV flow")):
        ax.scatter(pts[:, 0], pts[:, 1], s=0.3, c="0.6")  # the delayed sweep, in its own frame (before EMC)
        f = flow.numpy()
        m = np.hypot(f[0], f[1]) > 0.2
        ax.quiver(xy[..., 0][m], xy[..., 1][m], f[0][m], f[1][m], angles="xy", scale_units="xy", scale=1, color="C3",
                  width=0.004)
        for row in b["boxes"][0][b["boxes_mask"][0]].numpy():
            x, y, w, length, yaw = row[0], row[1], row[3], row[4], row[6]
            c, s = np.cos(yaw), np.sin(yaw)
            corners = np.array([[length, w], [length, -w], [-length, -w], [-length, w], [length, w]]) / 2
            ax.plot(x + c * corners[:, 0] - s * corners[:, 1], y + s * corners[:, 0] + c * corners[:, 1],
                    color="C0" if np.hypot(row[7], row[8]) > 0.2 else "0.3", lw=0.8)
        ax.set(xlim=(-grid.half_range, grid.half_range), ylim=(-grid.half_range, grid.half_range), aspect="equal",
               title=f"{title} ({delayed} {dt:.2f} s late, after EMC)", xlabel="x (m)", ylabel="y (m)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(all_res: dict[int, dict], args) -> str:
    seeds = sorted(all_res)
    lines = ["| delayed | offset (s) | method | NDS all | mAP all | NDS dynamic | mAP dynamic | mAVE all |",
             "|---|---|---|---|---|---|---|---|"]
    keys = [k for k in all_res[seeds[0]] if k != "speed"]
    detect = "all" in all_res[seeds[0]][keys[0]]
    names = {"none": "no compensation", "emc": "EMC", "asyncbev": "AsyncBEV", "oracle": "oracle flow (EMC + GT flow)"}
    for k in keys if detect else []:
        delayed, off, comp = k.split("/")
        name = "synchronous" if float(off) == 0 and comp == "none" else names[comp]
        vals = [all_res[s][k] for s in seeds]
        cells = [mean_std([v[sp][m] for v in vals]) for sp, m in
                 (("all", "NDS"), ("all", "mAP"), ("dynamic", "NDS"), ("dynamic", "mAP"), ("all", "mAVE"))]
        lines.append(f"| {delayed} | {off} | {name} | " + " | ".join(cells) + " |")
    out = ["\n".join(lines), ""] if detect else []
    for delayed in args.delayed:
        for off in args.offsets:
            a, e = f"{delayed}/{off}/asyncbev", f"{delayed}/{off}/emc"
            if off == 0:
                e = f"{delayed}/0.0/none"
            if detect and a in all_res[seeds[0]] and e in all_res[seeds[0]]:
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
        if comp in ("none", "emc", "asyncbev") and all_res[seeds[0]][k]["epe"]:
            name = {"none": "no compensation", "emc": "zero flow after EMC", "asyncbev": "AsyncBEV"}[comp]
            cells = [mean_std([all_res[s][k]["epe"].get(b, float("nan")) for s in seeds]) for b in ("<0.4", "0.4-1.0", ">1.0")]
            out.append(f"| {delayed} | {off} | {name} | " + " | ".join(cells) + " |")
    out.append("")
    for delayed in args.delayed:
        for off in args.offsets:
            a, e = f"{delayed}/{off}/asyncbev", f"{delayed}/{off}/emc"
            if off == 0 or a not in all_res[seeds[0]] or e not in all_res[seeds[0]]:
                continue
            for bucket in ("<0.4", ">1.0"):
                ci = paired_ci([all_res[s][a]["epe"][bucket] for s in seeds], [all_res[s][e]["epe"][bucket] for s in seeds])
                out.append(f"- {delayed} delayed {off} s, flow EPE (m) of cells {bucket} m/s: AsyncBEV - EMC = {ci} "
                           f"(paired 95% CI, {len(seeds)} seeds)")
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
    ap.add_argument("--flow-loss-only", action="store_true",
                    help="AsyncBEV stage on the flow loss alone (frozen detector encoded without gradient; faster)")
    ap.add_argument("--epe-only", action="store_true", help="flow end-point errors only (no devkit detection metrics)")
    ap.add_argument("--figure", default=None, help="write the BEV flow figure of the first seed to this PNG")
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-json", nargs="+", default=None, help="only print the table of earlier --out files")
    args = ap.parse_args()
    torch.set_num_threads(1)
    np.seterr(all="ignore")
    if args.from_json:  # seeds run as separate processes, merged here
        all_res = {int(k): v for f in args.from_json for k, v in json.loads(Path(f).read_text()).items()}
        args.seeds = sorted(all_res)
    else:
        all_res = {}
        for s in args.seeds:
            all_res[s] = run_seed(s, args)
            if args.out:  # after every seed, so a long run that is stopped keeps its finished seeds
                Path(args.out).write_text(json.dumps(all_res, indent=1))
    print(table(all_res, args))


if __name__ == "__main__":
    main()
