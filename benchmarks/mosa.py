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
Runs are appended to benchmarks/out/mosa/results<tag>.json as they finish and skipped on restart. Prints a markdown table
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
from lit_iclr.mosa.data import HumanMotionVideo
from lit_iclr.mosa.maps import project
from lit_iclr.mosa.metrics import PoseRegressor, VideoClassifier, evaluate_videos, fit_evaluators, foot_penetration, foot_skating
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


def data(args) -> HumanMotionVideo:
    dm = HumanMotionVideo(data_dir=str(ROOT / "data"), num_clips=args.clips, batch_size=args.batch,
                          **TASKS[args.task]["data"])
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    return dm


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


def score(model: MoSA, ev: dict, clf, reg, real_feats, seed: int, plan_clf, maps=None) -> tuple[dict, torch.Tensor]:
    """Sample the prompts of `ev` (or, given `maps`, the video stage on those structure maps) and evaluate."""
    model.eval()
    t0 = time.process_time()
    res, plan_uv = {}, None
    g = torch.Generator().manual_seed(seed)
    if maps is not None:  # the video stage alone on the true structure
        video = euler_sample(lambda x, t: model.video_net(x, t, ev["text_ids"], ev["text_mask"], maps),
                             tuple(ev["video"].shape), model.hparams.video_steps, g).clamp(-1, 1)
        plan_uv = ev["keypoints2d"]
    else:
        out = model.generate(ev, g)
        video = out["video"]
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


def job(name: str, seed: int, args, dm, evaluators) -> tuple[dict, dict]:
    clf, reg, real_feats, plan_clf = evaluators
    train_ds = dm.splits["train"]
    ev = stack(dm.splits["test"], range(min(args.n_eval, len(dm.splits["test"]))))
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


def table(runs: list[dict]) -> str:
    by: dict[str, dict[int, dict]] = {}
    for r in runs:
        for name, res in r["results"].items():
            by.setdefault(name, {})[r["seed"]] = res
    ref = by.get("direct text-to-video", {})

    def col(n: str, k: str, seeds=None) -> list[float]:
        return [by[n][s].get(k, float("nan")) for s in (seeds or sorted(by[n]))]

    def cell(n: str, k: str) -> str:
        v = col(n, k)
        return "n/a" if np.isnan(v).all() else (f"{v[0]:.3g}" if len(v) == 1 else mean_std(v))

    keys = ("fd", "text_acc", "plan_action_acc", "joint_err_px", "warp_err", "bone_err_cm", "skating_cm")
    head = ("| method | seeds | FD (classifier feats) | text agreement | plan action acc. | joint err vs plan (px) "
            "| warp err (0-255) | bone err (cm) | skating (cm/frame) | plan penetration / skating (cm) "
            "| train CPU s (x direct) | sample CPU s/video (x direct) |")
    lines = [head, "|" + "---|" * 12]
    ref_train = np.mean(col("direct text-to-video", "train_cpu_s")) if ref else float("nan")
    ref_sample = np.mean(col("direct text-to-video", "sample_s_per_video")) if ref else float("nan")
    for n in [r for r in ROWS if r in by]:
        plan = "n/a" if np.isnan(col(n, "plan_penetration_cm")).all() else \
            f"{cell(n, 'plan_penetration_cm')} / {cell(n, 'plan_skating_cm')}"
        tr = np.mean(col(n, "train_cpu_s"))
        tr_s = "n/a" if n in (ORACLE, NO_CONTACT) else f"{tr:.0f} ({tr / ref_train:.2f}x)"
        spv = np.mean(col(n, "sample_s_per_video"))
        lines.append(f"| {n} | {len(by[n])} | " + " | ".join(cell(n, k) for k in keys)
                     + f" | {plan} | {tr_s} | {spv:.3f} ({spv / ref_sample:.2f}x) |")
    lines += ["", "Paired differences over the seeds both methods ran (first minus second, 95% CI):"]
    pairs = [("MoSA", "direct text-to-video", k) for k in ("fd", "text_acc", "warp_err", "bone_err_cm", "skating_cm")]
    pairs += [(ORACLE, "direct text-to-video", k) for k in ("fd", "text_acc")]
    pairs += [("MoSA", "2-D skeleton first", k) for k in ("joint_err_px", "bone_err_cm", "warp_err", "text_acc")]
    pairs += [("MoSA", "MoSA w/o HADC (concat)", k) for k in ("joint_err_px", "warp_err", "fd", "text_acc")]
    pairs += [("MoSA", "MoSA w/o tracking loss", k) for k in ("warp_err", "joint_err_px", "fd")]
    pairs += [("MoSA", NO_CONTACT, k) for k in ("plan_penetration_cm", "plan_skating_cm", "plan_action_acc", "fd", "text_acc")]
    pairs += [(NO_CONTACT, "direct text-to-video", k) for k in ("fd", "text_acc", "warp_err")]
    for a, b, k in pairs:
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


def evaluators(args, dm) -> tuple[tuple, dict]:
    """The action classifier and pose regressor (trained once and stored), and the plans' action classifiers."""
    tr = stack(dm.splits["train"], range(len(dm.splits["train"])))
    path = OUT / f"evaluators{suffix(args)}.pt"
    if path.exists():
        saved = torch.load(path, weights_only=True)
        clf, reg = VideoClassifier(), PoseRegressor(dm.image_size)
        clf.load_state_dict(saved["clf"])
        reg.load_state_dict(saved["reg"])
        clf.eval(), reg.eval()
        real_feats, info = saved["real_feats"].numpy(), saved.get("info", {})
    else:
        t0 = time.process_time()
        clf, reg = fit_evaluators(tr, epochs=args.eval_epochs)
        te = stack(dm.splits["test"], range(len(dm.splits["test"])))
        with torch.no_grad():
            real_feats = clf.features(te["video"]).numpy()
            acc = float((clf(te["video"]).argmax(-1) == te["action"]).float().mean())
            uv, _ = reg(te["video"].flatten(0, 1))
            jerr = float((uv - te["keypoints2d"].flatten(0, 1)).norm(dim=-1).mean())
        info = {"test_acc": acc, "joint_err_px": jerr}
        torch.save({"clf": clf.state_dict(), "reg": reg.state_dict(), "real_feats": torch.as_tensor(real_feats),
                    "info": info}, path)
        print(f"evaluators: {info} ({time.process_time() - t0:.0f} CPU s)", flush=True)
    y = tr["action"].numpy()
    plan_clf = {"3d": LogisticRegression(max_iter=2000).fit(plan_features(tr["joints3d"]), y),
                "2d": LogisticRegression(max_iter=2000).fit(plan_features(tr["keypoints2d"] / dm.image_size * 2 - 1), y)}
    return (clf, reg, real_feats, plan_clf), info


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--task", choices=list(TASKS), default="default")
    p.add_argument("--steps", type=int, default=None, help="video-stage training steps per model (default: the task's)")
    p.add_argument("--structure_steps", type=int, default=None, help="structure-stage steps (default: 2 x steps)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--clips", type=int, default=600)
    p.add_argument("--n_eval", type=int, default=32, help="test prompts sampled per run")
    p.add_argument("--eval_epochs", type=int, default=15)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--table_only", action="store_true", help="print the table of the stored runs")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--tag", default="", help="suffix of results<tag>.json (e.g. a longer-training scale run)")
    args = p.parse_args()
    for k in ("steps", "batch", "lr"):
        if getattr(args, k) is None:
            setattr(args, k, TASKS[args.task][k])
    if args.structure_steps is None:
        args.structure_steps = 2 * args.steps
    path = OUT / f"results{suffix(args)}{args.tag}.json"
    if args.table_only:
        print(table(json.loads(path.read_text())["runs"]))
        return
    if args.quick:
        args.seeds, args.steps, args.structure_steps, args.clips, args.n_eval, args.eval_epochs = 1, 20, 20, 100, 8, 1
        path = OUT / "results_quick.json"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    dm = data(args)
    evs, info = evaluators(args, dm)
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    for seed in range(args.seeds):
        for name in args.methods:
            if any(r["seed"] == seed and r["method"] == name for r in runs):
                continue  # finished earlier
            results, videos = job(name, seed, args, dm, evs)
            runs.append({"seed": seed, "method": name, "results": results})
            path.write_text(json.dumps({"args": vars(args), "evaluators": info, "runs": runs}, indent=1))
            for n, v in videos.items():
                torch.save(v, video_path(args, n, seed))
            print(f"done {name} seed {seed}: " + json.dumps({k: {m: round(v, 3) for m, v in res.items()}
                                                              for k, res in results.items()}), flush=True)
    if not args.quick:
        figure(args)
    print(table(runs))


if __name__ == "__main__":
    main()
