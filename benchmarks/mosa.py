"""MoSA benchmark: structure-first text-to-video vs. direct generation, a 2-D-skeleton-first pipeline and the ablations
(without HADC, without the tracking loss, without the contact loss) on the generated default data.

    .venv/bin/python benchmarks/mosa.py --methods MoSA "direct text-to-video"      # 3 seeds of the headline pair
    .venv/bin/python benchmarks/mosa.py --seeds 1 --methods "2-D skeleton first" "MoSA w/o HADC (concat)" "MoSA w/o tracking loss"
    .venv/bin/python benchmarks/mosa.py --seeds 1 --steps 600 --tag _steps600 --methods MoSA "direct text-to-video"
    .venv/bin/python benchmarks/mosa.py --table_only [--tag ...]                    # the table of the stored runs
    .venv/bin/python benchmarks/mosa.py --quick                                     # smoke run: 1 seed, 20 steps

Training is two-stage, as in the paper: the video DiT is trained on ground-truth structure maps (teacher forcing) for
`--steps` AdamW steps, then the structure transformer alone for `--structure_steps` (default 2 x steps; a structure step
costs about a quarter of a video step). Every video model has the same DiT (width, depth, patch), optimizer, batch, seed
and number of video steps; the direct baseline has no structure stage by definition, so the structure methods spend more
compute: the table gives each method's training CPU seconds, and the `--steps 600` run gives the direct baseline more
compute than 300-step MoSA. "w/o contact" retrains only the structure stage (the contact loss touches nothing else) and
samples with MoSA's video network. "MoSA, ground-truth structure" samples MoSA's video network on the prompt clip's true
structure maps (the ceiling of the video stage). Evaluation networks (action classifier for the Frechet distance and
text agreement, per-frame pose regressor) are trained once on the real training clips; a logistic regression on the
training motions scores whether a plan shows the caption's action ("plan action acc.").

Evaluation set: a second generated pool of the same task (generator seed 1, never trained on) split into two disjoint
halves of `--n_eval` (256) clips: every method samples half A's prompts (with their cameras) and is compared with half
B's real clips: FD (classifier features, 256 samples in 32 dimensions), KID (unbiased MMD^2, cubic polynomial kernel),
and the "real clips" row scores half A's real clips the same way (the floor of FD/KID, and the real clips' own warp
error, joint jerk and flicker). Joint jerk (third difference of the regressed 2-D joints) is the temporal-consistency
measure no loss optimises; warp error is the tracking loss's own quantity, kept for reference.
Each finished (method, seed) is stored as one file in benchmarks/out/mosa/runs<task><tag>/ and skipped on restart
(processes started with different `--only_seeds` can run side by side). Prints a markdown table
and writes seeds/figures/mosa_samples.png.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from lit_iclr.core.stats import mean_std, paired_ci
from lit_iclr.mosa.data import HumanMotionVideo, MotionVideoDataset
from lit_iclr.mosa.maps import project
from lit_iclr.mosa.metrics import evaluate_videos, foot_penetration, foot_skating, joint_jerk, load_or_fit_evaluators
from lit_iclr.mosa.module import MoSA
from lit_iclr.mosa.objectives import euler_sample

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out" / "mosa"
# per task: the generated data (as in configs/mosa*.yaml), the shared model sizes, learning rate, steps and batch
TASKS = {
    "default": {"data": dict(image_size=16, actions=("walk", "jump", "wave", "squat"), scene="plain"),
                "model": dict(dim=64, depth=2, heads=4, patch=4, structure_dim=64, structure_layers=2, video_steps=10,
                              structure_steps=10),
                "lr": 2e-3, "steps": 300, "batch": 16},
    "32px": {"data": dict(image_size=32, scene="room"),
             "model": dict(dim=32, depth=2, heads=2, patch=8, structure_dim=32, structure_layers=2, video_steps=8,
                           structure_steps=8),
             "lr": 1e-3, "steps": 120, "batch": 8},
}
METHODS = {
    "MoSA": dict(structure="3d", control="hadc"),
    "direct text-to-video": dict(structure="none"),
    "2-D skeleton first": dict(structure="2d", control="hadc"),
    "MoSA w/o HADC (concat)": dict(structure="3d", control="concat"),
    "MoSA w/o tracking loss": dict(structure="3d", control="hadc", lambda_track=0.0),
}
NO_CONTACT, ORACLE = "MoSA w/o contact loss", "MoSA, ground-truth structure"
ROWS = ["MoSA", ORACLE, NO_CONTACT, *list(METHODS)[1:]]


def stack(ds, idx) -> dict[str, torch.Tensor]:
    items = [ds[i] for i in idx]
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def data(args, seed: int = 0, clips: int | None = None) -> HumanMotionVideo:
    dm = HumanMotionVideo(data_dir=str(ROOT / "data"), num_clips=clips or args.clips, batch_size=args.batch,
                          generator_seed=seed, **TASKS[args.task]["data"])
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    return dm


def eval_pool(args) -> tuple[dict, dict]:
    """Halves A (prompts) and B (real reference) of `n_eval` clips each from a pool generated with another seed."""
    pool = data(args, seed=1, clips=int(2 * args.n_eval / 0.8) + 1)
    clips = [c for split in ("train", "val", "test") for c in pool.splits[split].clips]
    ds = MotionVideoDataset(clips, train=False)  # first caption of every clip
    assert len(ds) >= 2 * args.n_eval
    return stack(ds, range(args.n_eval)), stack(ds, range(args.n_eval, 2 * args.n_eval))


def train(model: MoSA, train_ds, steps: int, batch: int, seed: int, lr: float, params, loss_fn) -> float:
    """Plain AdamW loop on one stage's parameters and loss; returns CPU seconds per step."""
    params = list(params)
    opt = torch.optim.AdamW(params, lr=lr)
    g = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(len(train_ds), generator=g) for _ in range(steps * batch // len(train_ds) + 1)])
    model.train()
    t0 = time.process_time()
    for s in range(steps):
        loss = loss_fn(stack(train_ds, order[s * batch:(s + 1) * batch].tolist()))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return (time.process_time() - t0) / max(steps, 1)


def train_structure(model: MoSA, train_ds, args, seed: int) -> float:
    torch.manual_seed(seed + 10_000)
    return train(model, train_ds, args.structure_steps, args.batch, seed + 10_000, args.lr, model.structure_net.parameters(),
                 lambda b: model.total(model.structure_loss(b)))


def plan_features(plan: torch.Tensor) -> np.ndarray:
    """A motion as the action classifier of plans sees it: joints relative to the first frame's pelvis (ground plane)."""
    ref = plan[:, :1, :1].clone()
    if plan.shape[-1] == 3:
        ref[..., 1] = 0
    return (plan - ref).flatten(1).numpy()


def generate(model: MoSA, ev: dict, g: torch.Generator, maps=None, chunk: int = 64) -> dict[str, torch.Tensor]:
    """model.generate (or, given `maps`, the video stage alone on them) over `ev` in chunks of prompts."""
    outs = []
    for i in range(0, len(ev["video"]), chunk):
        part = {k: v[i:i + chunk] for k, v in ev.items()}
        if maps is None:
            outs.append(model.generate(part, g))
        else:
            m = maps[i:i + chunk]
            def field(x, t, part=part, m=m):
                return model.video_net(x, t, part["text_ids"], part["text_mask"], m)

            outs.append({"video": euler_sample(field, tuple(part["video"].shape), model.hparams.video_steps,
                                               g).clamp(-1, 1)})
    return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}


def score(model: MoSA, ev: dict, clf, reg, real_feats, seed: int, plan_clf, maps=None) -> tuple[dict, torch.Tensor]:
    """Sample the prompts of `ev` (or, given `maps`, the video stage on those structure maps) and evaluate them
    against the real reference features (half B)."""
    model.eval()
    t0 = time.process_time()
    res, plan_uv = {}, None
    g = torch.Generator().manual_seed(seed)
    out = generate(model, ev, g, maps)
    video = out["video"]
    if maps is not None:  # the video stage alone on the true structure
        plan_uv = ev["keypoints2d"]
    else:
        if "plan" in out:
            res["plan_action_acc"] = float(plan_clf[model.structure].score(plan_features(out["plan"]), ev["action"].numpy()))
            if model.structure == "3d":
                plan_uv = project(out["plan"], ev["K"], ev["extrinsics"])[0]
                res["plan_penetration_cm"] = float(foot_penetration(out["plan"]))
                res["plan_skating_cm"] = float(foot_skating(out["plan"]))
            else:
                plan_uv = (out["plan"] + 1) / 2 * model.hparams.image_size
    res["sample_s_per_video"] = (time.process_time() - t0) / len(video)
    res |= evaluate_videos(video, ev, clf, reg, real_feats, plan_uv)
    return res, video


def job(name: str, seed: int, args, dm, evaluators, ev: dict) -> tuple[dict, dict]:
    clf, reg, real_feats, plan_clf = evaluators
    train_ds = dm.splits["train"]
    torch.manual_seed(seed)
    kw = {**TASKS[args.task]["model"], "log_videos": 0, **METHODS[name], "vocab_size": dm.vocab_size,
          "num_frames": dm.num_frames, "image_size": dm.image_size}
    model = MoSA(**kw)
    t0 = time.process_time()
    video_sps = train(model, train_ds, args.steps, args.batch, seed, args.lr, model.video_net.parameters(),
                      lambda b: model.total(model.video_loss(b)))
    struct_sps = train_structure(model, train_ds, args, seed) if model.structure_net is not None else 0.0
    train_cpu = time.process_time() - t0
    res, video = score(model, ev, clf, reg, real_feats, seed, plan_clf)
    res |= {"video_s_per_step": video_sps, "structure_s_per_step": struct_sps, "train_cpu_s": train_cpu}
    results, videos = {name: res}, {name: video[:2]}
    if name == "MoSA":
        res_o, video_o = score(model, ev, clf, reg, real_feats, seed, plan_clf, ev["maps"][:, :, : model.channels])
        results[ORACLE], videos[ORACLE] = res_o, video_o[:2]
        torch.manual_seed(seed)
        other = MoSA(**{**kw, "lambda_contact": 0.0})
        other.video_net.load_state_dict(model.video_net.state_dict())
        sps = train_structure(other, train_ds, args, seed)
        res2, video2 = score(other, ev, clf, reg, real_feats, seed, plan_clf)
        res2 |= {"structure_s_per_step": sps, "train_cpu_s": train_cpu}
        results[NO_CONTACT], videos[NO_CONTACT] = res2, video2[:2]
    return results, videos


def suffix(args) -> str:
    return "" if args.task == "default" else f"_{args.task}"


REAL = "real clips (floor)"
KEYS = ("fd", "kid", "text_acc", "plan_action_acc", "jerk_px", "flicker", "warp_err", "joint_err_px", "bone_err_cm",
        "skating_cm")
HEAD = ("| method | seeds | FD (256 vs 256) | KID x 1e3 | text agreement | plan action acc. | joint jerk (px/frame^3) "
        "| flicker (0-255) | warp err (0-255) | joint err vs plan (px) | bone err (cm) | skating (cm/frame) "
        "| plan penetration / skating (cm) | train CPU s (x direct) | sample CPU s/video (x direct) |")
PAIRS = [("MoSA", "direct text-to-video", k) for k in ("kid", "fd", "jerk_px", "text_acc", "warp_err", "bone_err_cm")]
PAIRS += [(ORACLE, "direct text-to-video", k) for k in ("kid", "fd", "jerk_px", "text_acc")]
PAIRS += [("MoSA", "MoSA w/o tracking loss", k) for k in ("jerk_px", "flicker", "kid", "fd", "warp_err", "skating_cm")]
PAIRS += [("MoSA", NO_CONTACT, k) for k in ("plan_skating_cm", "plan_penetration_cm", "kid", "jerk_px", "text_acc")]
PAIRS += [("MoSA", "MoSA w/o HADC (concat)", k) for k in ("kid", "jerk_px", "text_acc", "joint_err_px")]
PAIRS += [("MoSA", "2-D skeleton first", k) for k in ("kid", "jerk_px", "text_acc", "bone_err_cm")]


def table(runs: list[dict], floor: dict | None = None) -> str:
    by: dict[str, dict[int, dict]] = {}
    for r in runs:
        for name, res in r["results"].items():
            by.setdefault(name, {})[r["seed"]] = {**res, "kid": res["kid"] * 1e3}
    ref = by.get("direct text-to-video", {})

    def col(n: str, k: str, seeds=None) -> list[float]:
        return [by[n][s].get(k, float("nan")) for s in (seeds or sorted(by[n]))]

    def cell(n: str, k: str) -> str:
        v = col(n, k)
        return "n/a" if np.isnan(v).all() else (f"{v[0]:.3g}" if len(v) == 1 else mean_std(v))

    lines = [HEAD, "|" + "---|" * 15]
    ref_train = np.mean(col("direct text-to-video", "train_cpu_s")) if ref else float("nan")
    ref_sample = np.mean(col("direct text-to-video", "sample_s_per_video")) if ref else float("nan")
    for n in [r for r in ROWS if r in by]:
        plan = "n/a" if np.isnan(col(n, "plan_penetration_cm")).all() else \
            f"{cell(n, 'plan_penetration_cm')} / {cell(n, 'plan_skating_cm')}"
        tr = np.mean(col(n, "train_cpu_s"))
        tr_s = "n/a" if n in (ORACLE, NO_CONTACT) else f"{tr:.0f} ({tr / ref_train:.2f}x)"
        spv = np.mean(col(n, "sample_s_per_video"))
        lines.append(f"| {n} | {len(by[n])} | " + " | ".join(cell(n, k) for k in KEYS)
                     + f" | {plan} | {tr_s} | {spv:.3f} ({spv / ref_sample:.2f}x) |")
    if floor:
        f = {**floor, "kid": floor["kid"] * 1e3}
        lines.append(f"| {REAL} | - | " + " | ".join(f"{f[k]:.3g}" if k in f else "n/a" for k in KEYS)
                     + " | n/a | n/a | n/a |")
        lines.append(f"\nTrue motion (ground-truth 2-D keypoints of half A): joint jerk {floor['jerk_px_true_motion']:.3g} "
                     "px/frame^3; the real row's jerk is that motion seen through the pose regressor.")
    lines += ["", "Paired differences over the seeds both methods ran (first minus second, 95% CI; KID x 1e3):"]
    for a, b, k in PAIRS:
        if a in by and b in by:
            seeds = sorted(set(by[a]) & set(by[b]))
            if len(seeds) < 2:
                lines.append(f"- {k}: {a} - {b} = {col(a, k, seeds)[0] - col(b, k, seeds)[0]:+.3g} (1 seed, no interval)")
            else:
                lines.append(f"- {k}: {a} - {b} = {paired_ci(col(a, k, seeds), col(b, k, seeds))} (n = {len(seeds)})")
    return "\n".join(lines)


def video_path(args, name: str, seed: int) -> Path:
    return OUT / f"videos{suffix(args)}{args.tag}_{name.replace(' ', '_').replace('/', '').replace(',', '')}_{seed}.pt"


def figure(args, seed: int = 0) -> None:
    from lit_iclr.mosa.plots import frames_figure

    vids = {}
    for n in ROWS:
        p = video_path(args, n, seed)
        if p.exists():
            vids[n] = torch.load(p, weights_only=True)
    if vids:
        fig = frames_figure(vids, 0, f"same prompt, each method (seed {seed}, {args.steps} video steps)")
        out = ROOT / "seeds" / "figures" / f"mosa_samples{suffix(args)}{args.tag}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=70)


def evaluators(args, dm, ev: dict, ref: dict) -> tuple[tuple, dict, dict]:
    """The action classifier and pose regressor (fit once on the real training clips and stored), the reference
    features of half B, the real-data floor (half A's real clips scored like a method), and the plans' classifiers."""
    tr = stack(dm.splits["train"], range(len(dm.splits["train"])))
    t0 = time.process_time()
    clf, reg = load_or_fit_evaluators(tr, OUT / f"evaluators{suffix(args)}_e{args.eval_epochs}.pt", args.eval_epochs)
    with torch.no_grad():
        real_feats = clf.features(ref["video"]).numpy()
        acc = float((clf(ref["video"]).argmax(-1) == ref["action"]).float().mean())
        uv, _ = reg(ref["video"].flatten(0, 1))
        jerr = float((uv - ref["keypoints2d"].flatten(0, 1)).norm(dim=-1).mean())
    info = {"classifier_acc_half_B": acc, "pose_joint_err_px_half_B": jerr, "cpu_s": time.process_time() - t0}
    floor = evaluate_videos(ev["video"], ev, clf, reg, real_feats)
    floor["jerk_px_true_motion"] = float(joint_jerk(ev["keypoints2d"]))
    print(f"evaluators: {info}\nreal floor: {floor}", flush=True)
    y = tr["action"].numpy()
    plan_clf = {"3d": LogisticRegression(max_iter=2000).fit(plan_features(tr["joints3d"]), y),
                "2d": LogisticRegression(max_iter=2000).fit(plan_features(tr["keypoints2d"] / dm.image_size * 2 - 1), y)}
    return (clf, reg, real_feats, plan_clf), info, floor


def load_runs(folder: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(folder.glob("*.json")) if f.name != "floor.json"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--only_seeds", type=int, nargs="+", default=None, help="run these seeds (default: range(seeds))")
    p.add_argument("--task", choices=list(TASKS), default="default")
    p.add_argument("--steps", type=int, default=None, help="video-stage training steps per model (default: the task's)")
    p.add_argument("--structure_steps", type=int, default=None, help="structure-stage steps (default: 2 x steps)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--clips", type=int, default=600)
    p.add_argument("--n_eval", type=int, default=256, help="prompts sampled per run (and real reference clips)")
    p.add_argument("--eval_epochs", type=int, default=15)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--table_only", action="store_true", help="print the table of the stored runs")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--tag", default="", help="suffix of the runs folder (e.g. a longer-training scale run)")
    args = p.parse_args()
    for k in ("steps", "batch", "lr"):
        if getattr(args, k) is None:
            setattr(args, k, TASKS[args.task][k])
    if args.structure_steps is None:
        args.structure_steps = 2 * args.steps
    folder = OUT / f"runs{suffix(args)}{args.tag}"
    if args.quick:
        args.seeds, args.steps, args.structure_steps, args.clips, args.n_eval, args.eval_epochs = 1, 20, 20, 100, 16, 1
        folder = OUT / "runs_quick"
    if args.table_only:
        floor = folder / "floor.json"
        print(table(load_runs(folder), json.loads(floor.read_text())["floor"] if floor.exists() else None))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    folder.mkdir(parents=True, exist_ok=True)
    dm = data(args)
    ev, ref = eval_pool(args)
    evs, info, floor = evaluators(args, dm, ev, ref)
    (folder / "floor.json").write_text(json.dumps({"args": vars(args), "evaluators": info, "floor": floor}, indent=1))
    for seed in args.only_seeds if args.only_seeds is not None else range(args.seeds):
        for name in args.methods:
            out = folder / f"{name.replace(' ', '_').replace('/', '').replace(',', '')}_{seed}.json"
            if out.exists():
                continue  # finished earlier
            results, videos = job(name, seed, args, dm, evs, ev)
            out.write_text(json.dumps({"seed": seed, "method": name, "results": results, "args": vars(args)}, indent=1))
            for n, v in videos.items():
                torch.save(v, video_path(args, n, seed))
            print(f"done {name} seed {seed}: " + json.dumps({k: {m: round(v, 4) for m, v in res.items()}
                                                              for k, res in results.items()}), flush=True)
    if not args.quick:
        figure(args)
    print(table(load_runs(folder), floor))


if __name__ == "__main__":
    main()
