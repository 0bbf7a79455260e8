"""AsyncBEV benchmark: nuScenes NDS / mAP (all and dynamic objects) under LiDAR (or camera) delay, from nuscenes-devkit.

Per seed: (1) train the synchronous detector (LiDAR pillars + camera lift + CenterPoint head, both sensors at the
keyframe), cached in --out-dir; (2) train the AsyncBEV module on top of it with the detector frozen (the paper starts
from the synchronous checkpoint), with a random delay per sample (LiDAR 0-0.6 s in 20 Hz sweeps). Then evaluate the
same weights with no compensation, EMC, AsyncBEV and the oracle warp (EMC + ground-truth flow) at fixed offsets, the
flow end-point error per speed bucket, and the training speed of the detector with and without AsyncBEV (CPU time,
same process). Scale table: EMC / oracle after fewer detector steps, EMC / AsyncBEV after fewer flow steps.

    OMP_NUM_THREADS=1 python benchmarks/asyncbev.py --seeds 0 1 2 --figure seeds/figures/asyncbev_flow.png

Resumable: detectors are cached per seed and step count, finished seeds are `<out-dir>/<tag>_seed<s>.json`.
Prints a markdown table.
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
NAMES = {"none": "no compensation", "emc": "EMC", "asyncbev": "AsyncBEV", "oracle": "oracle flow (EMC + GT flow)"}


def batches(loader):
    """Endless batches; every pass over the data is a new epoch of random delays."""
    while True:
        yield from loader
        loader.dataset.epoch += 1


def optimise(loss_fn, it, steps: int, opt, params, tag: str = "") -> float:
    """`steps` steps of `opt` on `loss_fn(batch)`, gradients clipped at 10; returns training samples per CPU second
    (process time: stable on a shared machine)."""
    n, t0 = 0, time.process_time()
    for step in range(steps):
        b = next(it)
        loss = loss_fn(b)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        opt.step()
        n += len(b["dt"])
        if step % 50 == 0:
            print(f"  {tag}step {step} loss {float(loss.detach()):.3f}", flush=True)
    return n / max(time.process_time() - t0, 1e-9)


def adamw(params, lr: float):
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)


def full_loss(model: AsyncBEV):
    return lambda b: model.losses(b)["loss"]


def flow_only_loss(model: AsyncBEV):
    """The flow loss alone: the frozen detector's BEV maps are computed without gradient, so a step costs the two
    encoders' forward pass plus the flow module (the paper's objective adds the frozen head's detection loss)."""
    net = model.net

    def loss_fn(b):
        gt_v = gt_velocity_field(b["boxes"], b["boxes_mask"], b["dt"], net.grid)
        with torch.no_grad():
            cam, lid = net.flow_inputs(*net.encode(b), b)
        _, flow = net.flow(cam, lid, b["emc"], b["dt"])
        return flow_loss(flow, gt_v * b["dt"].view(-1, 1, 1, 1), gt_v)

    return loss_fn


def freeze_detector(model: AsyncBEV) -> list:
    """Detector weights and BatchNorm statistics frozen, the flow module in training mode; returns its parameters."""
    model.train()
    for p in model.detector_parameters():
        p.requires_grad_(False)
    for name, m in model.net.named_modules():
        if not name.startswith("flow") and isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
    return list(model.net.flow.parameters())


_VAL: dict = {}


def val_batches(dm: NuScenesAsync, delayed: str, offset: float, batch_size: int) -> list[dict]:
    """The validation batches of one (delayed modality, offset), read once and kept (every method sees the same)."""
    key = (str(dm.path), delayed, offset, batch_size)
    if key not in _VAL:
        _VAL[key] = list(DataLoader(dm.dataset("val", offset, delayed), batch_size=batch_size))
    return _VAL[key]


@torch.no_grad()
def evaluate(model: AsyncBEV, dm: NuScenesAsync, delayed: str, offset: float, comp: str, batch_size: int,
             detect: bool = True) -> dict:
    model.eval()
    results, epe = {}, {}
    for b in val_batches(dm, delayed, offset, batch_size):
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
            m = nuscenes_metrics(dm.reader.nusc, write_results(Path(tmp) / "r.json", results), dm.val_split, tmp,
                                 class_range=model.net.grid.half_range)
    m["epe"] = {k: s / c if c else float("nan") for k, (s, c) in epe.items()}  # nan: no cell of that speed
    return m


def speed(model: AsyncBEV, loader, steps: int) -> dict[str, float]:
    """Training samples per CPU second of the detector alone (no compensation) and with AsyncBEV (detector + flow module
    + flow loss), all weights trainable, same batches, same process."""
    out = {}
    model.train()
    for comp in ("none", "asyncbev"):
        model.compensation = comp
        params = [p for p in model.parameters() if p.requires_grad]
        opt = adamw(params, 0.0)
        optimise(full_loss(model), batches(loader), 1, opt, params)  # warm-up
        out[comp] = optimise(full_loss(model), batches(loader), steps, opt, params)
    return out


def datamodule(seed: int, args) -> NuScenesAsync:
    dm = NuScenesAsync(batch_size=args.batch_size, num_sweeps=args.num_sweeps, max_points=args.max_points, seed=seed,
                       data_dir=args.data_dir, root=args.root, scene_seconds=args.scene_seconds,
                       objects_per_scene=args.objects_per_scene, moving_share=args.moving_share,
                       meet_ego=args.meet_ego, image_width=args.image_width, image_height=args.image_height)
    dm.prepare_data()
    dm.setup()
    return dm


def new_model(args) -> AsyncBEV:
    return AsyncBEV(half_range=args.half_range, grid_size=args.grid_size, channels=args.channels, compensation="none",
                    image_backbone=args.backbone, image_size=(args.image_height, args.image_width))


def detector_path(seed: int, dm: NuScenesAsync, args, steps: int) -> Path:
    key = (f"{dm.path.name}_r{args.half_range}g{args.grid_size}c{args.channels}s{args.num_sweeps}p{args.max_points}_"
           f"{args.backbone}_lr{args.lr}_b{args.batch_size}_det{steps}_seed{seed}")
    return Path(args.out_dir) / f"asyncbev_detector_{key}.pt"


def detector(seed: int, dm: NuScenesAsync, args) -> AsyncBEV:
    """The synchronous detector of this seed, cached in --out-dir after each of --scale-det-steps and after --det-steps
    (a stopped run restarts from the last cached one, with a fresh optimizer state)."""
    torch.manual_seed(seed)
    model = new_model(args)
    loader = DataLoader(dm.dataset("train", 0.0, "lidar"), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    it, params = batches(loader), list(model.parameters())
    opt, done, t = adamw(params, args.lr), 0, time.process_time()
    for mark in sorted({s for s in args.scale_det_steps if s < args.det_steps} | {args.det_steps}):
        path = detector_path(seed, dm, args, mark)
        if path.exists():
            model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            opt, done = adamw(params, args.lr), mark
            continue
        model.train()
        optimise(full_loss(model), it, mark - done, opt, params, tag="detector ")
        done = mark
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)  # complete files only
    print(f"seed {seed}: detector ready ({args.det_steps} steps, {time.process_time() - t:.0f} s CPU)", flush=True)
    return model


def detector_scale(seed: int, dm: NuScenesAsync, args) -> dict:
    """Synchronous, EMC and oracle dynamic metrics at the largest offset for the cached smaller detectors."""
    out = {}
    for mark in sorted(s for s in args.scale_det_steps if s < args.det_steps):
        model = new_model(args)
        model.load_state_dict(torch.load(detector_path(seed, dm, args, mark), map_location="cpu", weights_only=True))
        off = max(args.offsets)
        out[str(mark)] = {"sync": evaluate(model, dm, "lidar", 0.0, "none", args.batch_size),
                          "emc": evaluate(model, dm, "lidar", off, "emc", args.batch_size),
                          "oracle": evaluate(model, dm, "lidar", off, "oracle", args.batch_size)}
        print(f"seed {seed} detector {mark} steps, NDS dyn: " + ", ".join(
            f"{c} {v['dynamic']['NDS']:.3f}" for c, v in out[str(mark)].items()), flush=True)
    return out


def flow_stage(model: AsyncBEV, dm: NuScenesAsync, seed: int, args) -> dict:
    """AsyncBEV trained on the frozen detector; after each of --scale-flow-steps, AsyncBEV at the largest offset."""
    torch.manual_seed(seed)
    model.compensation = "asyncbev"
    loader = DataLoader(dm.dataset("train", None, args.train_delayed), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    it, params = batches(loader), freeze_detector(model)
    opt, done, scale, t = adamw(params, args.lr), 0, {}, time.process_time()
    loss_fn = flow_only_loss(model) if args.flow_loss_only else full_loss(model)
    for mark in sorted({s for s in args.scale_flow_steps if s < args.flow_steps} | {args.flow_steps}):
        freeze_detector(model)  # training mode again after an evaluation
        optimise(loss_fn, it, mark - done, opt, params, tag="flow ")
        done = mark
        if mark != args.flow_steps:
            scale[str(mark)] = evaluate(model, dm, "lidar", max(args.offsets), "asyncbev", args.batch_size,
                                        not args.epe_only)
            print(f"seed {seed} flow {mark} steps: AsyncBEV NDS dyn "
                  f"{scale[str(mark)].get('dynamic', {}).get('NDS', float('nan')):.3f}, EPE "
                  + ", ".join(f"{k} {v:.3f}" for k, v in scale[str(mark)]["epe"].items()), flush=True)
    print(f"seed {seed}: AsyncBEV trained ({args.flow_steps} steps, {time.process_time() - t:.0f} s CPU)", flush=True)
    return scale


def run_seed(seed: int, args) -> dict:
    dm = datamodule(seed, args)
    model = detector(seed, dm, args)
    res = {"det_scale": detector_scale(seed, dm, args) if not args.epe_only else {}}
    res["flow_scale"] = flow_stage(model, dm, seed, args)
    for delayed in args.delayed:
        for off in args.offsets:
            for comp in COMPS:
                if off == 0 and comp not in ("none", "asyncbev"):
                    continue  # at 0 s EMC and the oracle are the identity; AsyncBEV shows whether it costs anything
                if args.epe_only and comp == "oracle":
                    continue
                res[f"{delayed}/{off}/{comp}"] = evaluate(model, dm, delayed, off, comp, args.batch_size, not args.epe_only)
            print(f"seed {seed} {delayed} {off}: " + ", ".join(
                f"{k.split('/')[-1]} NDS dyn {v.get('dynamic', {}).get('NDS', float('nan')):.3f} "
                f"EPE>1 {v['epe'].get('>1.0', float('nan')):.3f}" for k, v in res.items()
                if k.startswith(f"{delayed}/{off}/")), flush=True)
    if seed == args.seeds[0] and args.figure:
        flow_figure(model, dm, args.delayed[0], max(args.offsets), args.figure)
    if seed == args.seeds[0] and args.speed_steps:
        torch.manual_seed(seed)
        loader = DataLoader(dm.dataset("train", None, args.train_delayed), batch_size=args.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(seed))
        res["speed"] = speed(new_model(args), loader, args.speed_steps)
    return res


@torch.no_grad()
def flow_figure(model: AsyncBEV, dm: NuScenesAsync, delayed: str, offset: float, path: str) -> None:
    """BEV figure of one validation keyframe: LiDAR occupancy, ground-truth and predicted flow arrows, GT boxes at t1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model.eval()
    ds = dm.dataset("val", offset, delayed)
    grid = model.net.grid

    def moving_cells(b):
        return int((gt_velocity_field(b["boxes"], b["boxes_mask"], b["dt"], grid).norm(dim=1) > 1.0).sum())

    cands = [b for b in DataLoader(ds, batch_size=1) if float(b["dt"][0]) > offset - 0.01]  # not a scene's first keyframe
    b = max(cands[: len(cands) // 2], key=moving_cells)  # the first val scene's keyframe with the most moving cells
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


def detection_table(all_res: dict[int, dict], seeds: list[int]) -> list[str]:
    """Dynamic / static: ground truth by its own speed (> 0.2 m/s), predictions with the ground truth they match
    (`lit_iclr.asyncbev.evaluate.motion_split`)."""
    lines = ["| delayed | offset (s) | method | NDS dynamic | mAP dynamic | mAVE dynamic | NDS static | NDS all | mAP all "
             "| mAVE all |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k in result_keys(all_res[seeds[0]]):
        delayed, off, comp = k.split("/")
        name = "synchronous" if float(off) == 0 and comp == "none" else NAMES[comp]
        vals = [all_res[s][k] for s in seeds]
        cells = [mean_std([v.get(sp, {}).get(m, float("nan")) for v in vals]) for sp, m in
                 (("dynamic", "NDS"), ("dynamic", "mAP"), ("dynamic", "mAVE"), ("static", "NDS"), ("all", "NDS"),
                  ("all", "mAP"), ("all", "mAVE"))]
        lines.append(f"| {delayed} | {off} | {name} | " + " | ".join(cells) + " |")
    return lines


def result_keys(res: dict) -> list[str]:
    return [k for k in res if k.count("/") == 2]


def nds_cis(all_res: dict[int, dict], seeds: list[int], args) -> list[str]:
    """Paired 95% CIs of dynamic / all NDS: AsyncBEV against EMC and no compensation, EMC - no compensation,
    oracle - EMC, EMC - synchronous, AsyncBEV@0 - synchronous."""
    out, r0 = [], all_res[seeds[0]]
    for delayed in args.delayed:
        sync = f"{delayed}/0.0/none"
        for off in args.offsets:
            pairs = ([("asyncbev", "emc"), ("asyncbev", "none"), ("emc", "none"), ("oracle", "emc"), ("emc", sync)]
                     if off else [("asyncbev", sync)])
            for a, b in pairs:
                ka = f"{delayed}/{off}/{a}"
                kb = b if "/" in b else f"{delayed}/{off}/{b}"
                if ka not in r0 or kb not in r0:
                    continue
                for sp in ("dynamic", "all"):
                    ci = paired_ci([all_res[s][ka][sp]["NDS"] for s in seeds], [all_res[s][kb][sp]["NDS"] for s in seeds])
                    ref = "synchronous" if kb == sync else NAMES[b]
                    out.append(f"- {delayed} delayed {off} s, NDS {sp}: {NAMES[a]} - {ref} = {ci} (paired 95% CI, "
                               f"{len(seeds)} seeds)")
    return out


def epe_table(all_res: dict[int, dict], seeds: list[int], args) -> list[str]:
    out = ["| delayed | offset (s) | flow | EPE <0.4 m/s | EPE 0.4-1.0 m/s | EPE >1.0 m/s |", "|---|---|---|---|---|---|"]
    names = {"none": "no compensation", "emc": "zero flow after EMC", "asyncbev": "AsyncBEV"}
    for k in result_keys(all_res[seeds[0]]):
        delayed, off, comp = k.split("/")
        if comp in names and float(off) > 0:
            cells = [mean_std([all_res[s][k]["epe"].get(b, float("nan")) for s in seeds]) for b in ("<0.4", "0.4-1.0", ">1.0")]
            out.append(f"| {delayed} | {off} | {names[comp]} | " + " | ".join(cells) + " |")
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
    return out


def scale_table(all_res: dict[int, dict], seeds: list[int], args) -> list[str]:
    """LiDAR delayed by the largest offset: dynamic NDS of EMC, oracle and AsyncBEV against detector and flow steps."""
    off = max(args.offsets)
    final = {"sync": "lidar/0.0/none", "emc": f"lidar/{off}/emc", "oracle": f"lidar/{off}/oracle",
             "asyncbev": f"lidar/{off}/asyncbev"}
    if any(k not in all_res[seeds[0]] or "dynamic" not in all_res[seeds[0]][k] for k in final.values()):
        return []
    rows = []  # (detector steps, flow steps, {method: [per-seed result]})
    for n in sorted({int(k) for s in seeds for k in all_res[s]["det_scale"]}):
        rows.append((n, 0, {c: [all_res[s]["det_scale"][str(n)][c] for s in seeds] for c in ("sync", "emc", "oracle")}))
    emc = [all_res[s][final["emc"]] for s in seeds]
    for n in sorted({int(k) for s in seeds for k in all_res[s]["flow_scale"]}):
        rows.append((args.det_steps, n, {"sync": [all_res[s][final["sync"]] for s in seeds], "emc": emc,
                                         "oracle": [all_res[s][final["oracle"]] for s in seeds],
                                         "asyncbev": [all_res[s]["flow_scale"][str(n)] for s in seeds]}))
    rows.append((args.det_steps, args.flow_steps, {c: [all_res[s][k] for s in seeds] for c, k in final.items()}))
    out = [f"| detector steps | flow steps | NDS dyn synchronous | NDS dyn EMC ({off} s) | NDS dyn oracle | "
           "NDS dyn AsyncBEV | oracle - EMC (95% CI) | AsyncBEV - EMC (95% CI) | EPE >1.0 AsyncBEV |",
           "|---|---|---|---|---|---|---|---|---|"]
    for det, flow, r in rows:
        nds = {c: [v["dynamic"]["NDS"] for v in vals] for c, vals in r.items()}
        a = "asyncbev" in nds
        cells = [mean_std(nds["sync"]), mean_std(nds["emc"]), mean_std(nds["oracle"]),
                 mean_std(nds["asyncbev"]) if a else "-", str(paired_ci(nds["oracle"], nds["emc"])),
                 str(paired_ci(nds["asyncbev"], nds["emc"])) if a else "-",
                 mean_std([v["epe"][">1.0"] for v in r["asyncbev"]]) if a else "-"]
        out.append(f"| {det} | {flow if a else '-'} | " + " | ".join(cells) + " |")
    return out


def table(all_res: dict[int, dict], args) -> str:
    seeds = sorted(all_res)
    detect = "all" in all_res[seeds[0]][result_keys(all_res[seeds[0]])[0]]
    out = detection_table(all_res, seeds) + [""] + nds_cis(all_res, seeds, args) + [""] if detect else []
    out += epe_table(all_res, seeds, args)
    sp = all_res[seeds[0]].get("speed")
    if sp:
        out += ["", f"Training speed (seed {seeds[0]}, batch {args.batch_size}, all weights trainable, CPU time): detector "
                f"{sp['none']:.2f} samples/s, with AsyncBEV {sp['asyncbev']:.2f} samples/s "
                f"(ratio {sp['asyncbev'] / sp['none']:.2f})."]
    scale = scale_table(all_res, seeds, args)
    return "\n".join(out + ([""] + scale if scale else []))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--offsets", type=float, nargs="+", default=[0.0, 0.2, 0.5])
    ap.add_argument("--delayed", nargs="+", default=["lidar"], help="modalities delayed in evaluation: lidar camera")
    ap.add_argument("--train-delayed", default="lidar", help="delayed modality in the flow stage: lidar | camera | random")
    ap.add_argument("--det-steps", type=int, default=600)
    ap.add_argument("--flow-steps", type=int, default=600)
    ap.add_argument("--scale-det-steps", type=int, nargs="*", default=[150],
                    help="also evaluate synchronous / EMC / oracle after these detector steps (the scale table)")
    ap.add_argument("--scale-flow-steps", type=int, nargs="*", default=[150],
                    help="also evaluate AsyncBEV after these flow steps (the scale table)")
    ap.add_argument("--speed-steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--half-range", type=float, default=19.2)
    ap.add_argument("--grid-size", type=int, default=48)
    ap.add_argument("--channels", type=int, default=24)
    ap.add_argument("--backbone", default="test_resnet")
    ap.add_argument("--num-sweeps", type=int, default=3)
    ap.add_argument("--max-points", type=int, default=8000)
    ap.add_argument("--scene-seconds", type=float, default=10.0, help="generated world: length of each scene")
    ap.add_argument("--objects-per-scene", type=int, default=24, help="generated world: objects per scene")
    ap.add_argument("--moving-share", type=float, default=0.6, help="generated world: share of moving objects")
    ap.add_argument("--meet-ego", action=argparse.BooleanOptionalAction, default=True,
                    help="generated world: moving objects pass the ego at a random time of the scene")
    ap.add_argument("--image-width", type=int, default=64)
    ap.add_argument("--image-height", type=int, default=40)
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--root", default=None, help="nuScenes root (default: the generated world under --data-dir)")
    ap.add_argument("--flow-loss-only", action="store_true",
                    help="AsyncBEV stage on the flow loss alone (frozen detector encoded without gradient; faster)")
    ap.add_argument("--epe-only", action="store_true", help="flow end-point errors only (no devkit detection metrics)")
    ap.add_argument("--figure", default=None, help="write the BEV flow figure of the first seed to this PNG")
    ap.add_argument("--out-dir", default="benchmarks/out", help="cached detectors and per-seed results (resumable)")
    ap.add_argument("--tag", default="asyncbev", help="name of this run's per-seed result files in --out-dir")
    ap.add_argument("--from-json", nargs="+", default=None, help="only print the table of earlier per-seed files")
    args = ap.parse_args()
    if "camera" in args.delayed and args.train_delayed == "lidar":
        ap.error("camera-delayed rows need a flow stage that saw camera delays: --train-delayed camera or random")
    torch.set_num_threads(1)
    np.seterr(all="ignore")
    if args.from_json:  # seeds run as separate processes, merged here
        all_res = {int(k): v for f in args.from_json for k, v in json.loads(Path(f).read_text()).items()}
    else:
        all_res = {}
        for s in args.seeds:
            path = Path(args.out_dir) / f"{args.tag}_seed{s}.json"
            if path.exists():  # finished earlier: a stopped run loses at most the seed in progress
                all_res.update({int(k): v for k, v in json.loads(path.read_text()).items()})
                continue
            all_res[s] = run_seed(s, args)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({s: all_res[s]}, indent=1))
            tmp.rename(path)  # complete files only: a resumed run never reads a half-written seed
    print(table(all_res, args))


if __name__ == "__main__":
    main()
