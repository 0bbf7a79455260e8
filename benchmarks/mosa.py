"""MoSA benchmark: structure-first text-to-video vs. direct generation, a 2-D-skeleton-first pipeline and the ablations
(without HADC, without the tracking loss, without the contact loss) on the generated default data.

    .venv/bin/python benchmarks/mosa.py                 # configs/mosa.yaml's task: 3 seeds, 2 worker processes
    .venv/bin/python benchmarks/mosa.py --steps 800 --tag _steps800      # the scale row (evaluators reused)
    .venv/bin/python benchmarks/mosa.py --task 32px     # configs/mosa_32px.yaml's harder task, at the old CPU budget
    .venv/bin/python benchmarks/mosa.py --quick         # smoke run: 1 seed, 20 steps

Every video model has the same DiT (width, depth, patch), optimizer, batch size and number of steps; structure methods
add a structure transformer (the direct baseline has no structure stage by definition). "w/o contact" retrains only
the structure stage of MoSA's seed (the contact loss touches nothing else) and samples with MoSA's video network.
Evaluation networks (action classifier for the Frechet distance and text agreement, per-frame pose regressor) are
trained once on the real training clips. Prints a markdown table; writes benchmarks/out/mosa/results.json and
seeds/figures/mosa_samples.png.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from lit_iclr.core.stats import mean_std, paired_ci
from lit_iclr.mosa.data import HumanMotionVideo
from lit_iclr.mosa.maps import project
from lit_iclr.mosa.metrics import PoseRegressor, VideoClassifier, evaluate_videos, fit_evaluators, foot_penetration, foot_skating
from lit_iclr.mosa.module import MoSA

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
NO_CONTACT = "MoSA w/o contact loss"
KEYS = ("fd", "text_acc", "joint_err_px", "bone_err_cm", "warp_err", "penetration_cm", "skating_cm",
        "plan_penetration_cm", "plan_skating_cm", "train_s_per_step", "sample_s_per_video")


def stack(ds, idx) -> dict[str, torch.Tensor]:
    items = [ds[i] for i in idx]
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


_CACHE: dict[tuple, HumanMotionVideo] = {}  # one read of the data per worker process


def data(args) -> HumanMotionVideo:
    key = (args.task, args.clips)
    if key in _CACHE:
        return _CACHE[key]
    dm = _CACHE[key] = HumanMotionVideo(data_dir=str(ROOT / "data"), num_clips=args.clips, batch_size=args.batch,
                                        **TASKS[args.task]["data"])
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    return dm


def train(model: MoSA, train_ds, steps: int, batch: int, seed: int, lr: float, params=None, loss_fn=None) -> float:
    """Plain AdamW loop (the module's own losses); returns seconds per step."""
    opt = torch.optim.AdamW(params if params is not None else model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(len(train_ds), generator=g) for _ in range(steps * batch // len(train_ds) + 1)])
    model.train()
    t0 = time.perf_counter()
    for s in range(steps):
        b = stack(train_ds, order[s * batch:(s + 1) * batch].tolist())
        loss = loss_fn(b) if loss_fn else model.training_step(b, s)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return (time.perf_counter() - t0) / steps


def score(model: MoSA, ev: dict, clf, reg, real_feats, seed: int) -> tuple[dict, torch.Tensor]:
    model.eval()
    t0 = time.perf_counter()
    out = model.generate(ev, torch.Generator().manual_seed(seed))
    sec = (time.perf_counter() - t0) / len(ev["video"])
    plan_uv = None
    res = {}
    if "plan" in out:
        if model.structure == "3d":
            plan_uv = project(out["plan"], ev["K"], ev["extrinsics"])[0]
            res["plan_penetration_cm"] = float(foot_penetration(out["plan"]))
            res["plan_skating_cm"] = float(foot_skating(out["plan"]))
        else:
            plan_uv = (out["plan"] + 1) / 2 * model.hparams.image_size
    res |= evaluate_videos(out["video"], ev, clf, reg, real_feats, plan_uv)
    res["sample_s_per_video"] = sec
    return res, out["video"]


def job(name: str, seed: int, args) -> dict:
    torch.set_num_threads(1)
    dm = data(args)
    train_ds, test_ds = dm.splits["train"], dm.splits["test"]
    ev = stack(test_ds, range(min(args.n_eval, len(test_ds))))
    saved = torch.load(OUT / f"evaluators{suffix(args)}.pt", weights_only=True)
    clf, reg = VideoClassifier(), PoseRegressor(dm.image_size)
    clf.load_state_dict(saved["clf"])
    reg.load_state_dict(saved["reg"])
    clf.eval(), reg.eval()
    real_feats = saved["real_feats"].numpy()
    torch.manual_seed(seed)
    kw = {**TASKS[args.task]["model"], "log_videos": 0, **METHODS[name], "vocab_size": dm.vocab_size,
          "num_frames": dm.num_frames, "image_size": dm.image_size}
    model = MoSA(**kw)
    sps = train(model, train_ds, args.steps, args.batch, seed, args.lr)
    res, video = score(model, ev, clf, reg, real_feats, seed)
    res["train_s_per_step"] = sps
    results = {name: res}
    videos = {name: video[:2]}
    if name == "MoSA":  # the contact ablation: retrain the structure stage only, sample with MoSA's video network
        torch.manual_seed(seed)
        other = MoSA(**{**kw, "lambda_contact": 0.0})
        other.video_net.load_state_dict(model.video_net.state_dict())
        train(other, train_ds, args.steps, args.batch, seed, args.lr, other.structure_net.parameters(),
              lambda b: other.total(other.structure_loss(b)))
        res2, video2 = score(other, ev, clf, reg, real_feats, seed)
        res2["train_s_per_step"] = float("nan")
        results[NO_CONTACT] = res2
        videos[NO_CONTACT] = video2[:2]
    torch.save(videos, OUT / f"videos{suffix(args)}{args.tag}_{name.replace(' ', '_').replace('/', '')}_{seed}.pt")
    return {"seed": seed, "results": results}


def suffix(args) -> str:
    return "" if args.task == "default" else f"_{args.task}"


def table(runs: list[dict], seeds: list[int]) -> str:
    by: dict[str, dict[int, dict]] = {}
    for r in runs:
        for name, res in r["results"].items():
            by.setdefault(name, {})[r["seed"]] = res
    names = list(METHODS)[:1] + [NO_CONTACT] + list(METHODS)[1:]
    ref = by.get("direct text-to-video", by[next(iter(by))])
    ref_sample = np.mean([ref[s]["sample_s_per_video"] for s in seeds])
    ref_train = np.mean([ref[s]["train_s_per_step"] for s in seeds])
    head = ("| method | FD (classifier feats) | text agreement | joint err vs plan (px) | bone err (cm) | warp err (0-255) "
            "| penetration (cm) | skating (cm/frame) | plan penetration / skating (cm) | train s/step (x direct) "
            "| sample s/video (x direct) |")
    lines = [head, "|" + "---|" * 11]
    def col(n: str, k: str) -> list[float]:
        return [by[n][s].get(k, float("nan")) for s in seeds]

    def cell(n: str, k: str) -> str:
        return "n/a" if np.isnan(col(n, k)).all() else mean_std(col(n, k))

    for n in names:
        if n not in by:
            continue
        plan = "n/a" if np.isnan(col(n, "plan_penetration_cm")).all() else \
            f"{cell(n, 'plan_penetration_cm')} / {cell(n, 'plan_skating_cm')}"
        sps = np.mean(col(n, "train_s_per_step"))
        tr = "n/a" if np.isnan(sps) else f"{sps:.2f} ({sps / ref_train:.2f}x)"
        spv = np.mean(col(n, "sample_s_per_video"))
        lines.append(f"| {n} | {cell(n, 'fd')} | {cell(n, 'text_acc')} | {cell(n, 'joint_err_px')} | {cell(n, 'bone_err_cm')} | "
                     f"{cell(n, 'warp_err')} | {cell(n, 'penetration_cm')} | {cell(n, 'skating_cm')} | {plan} | {tr} | "
                     f"{spv:.3f} ({spv / ref_sample:.2f}x) |")
    lines.append("")
    lines.append("Paired differences over seeds (first minus second, 95% CI):")
    pairs = [("MoSA", "direct text-to-video", k) for k in ("fd", "text_acc", "bone_err_cm", "warp_err", "skating_cm")]
    pairs += [("MoSA", "2-D skeleton first", k) for k in ("joint_err_px", "bone_err_cm", "warp_err")]
    pairs += [("MoSA", "MoSA w/o HADC (concat)", k) for k in ("joint_err_px", "warp_err", "fd", "text_acc")]
    pairs += [("MoSA", "MoSA w/o tracking loss", k) for k in ("warp_err", "joint_err_px")]
    pairs += [("MoSA", NO_CONTACT, k) for k in ("plan_penetration_cm", "plan_skating_cm")]
    for a, b, k in pairs:
        if a in by and b in by:
            ci = paired_ci([by[a][s][k] for s in seeds], [by[b][s][k] for s in seeds])
            lines.append(f"- {k}: {a} - {b} = {ci}")
    return "\n".join(lines)


def figure(seeds: list[int], args) -> None:
    from lit_iclr.mosa.plots import frames_figure

    vids = {}
    for n in [*METHODS, NO_CONTACT]:
        p = OUT / f"videos{suffix(args)}_{n.replace(' ', '_').replace('/', '')}_{seeds[0]}.pt"
        if n == NO_CONTACT:
            p = OUT / f"videos{suffix(args)}_MoSA_{seeds[0]}.pt"
        if p.exists():
            vids[n] = torch.load(p, weights_only=True)[n]
    if vids:
        fig = frames_figure(vids, 0, f"same prompt, each method (seed {seeds[0]})")
        out = ROOT / "seeds" / "figures" / f"mosa_samples{suffix(args)}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=70)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--task", choices=list(TASKS), default="default")
    p.add_argument("--steps", type=int, default=None, help="training steps per model (default: the task's)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--clips", type=int, default=600)
    p.add_argument("--n_eval", type=int, default=32)
    p.add_argument("--eval_epochs", type=int, default=15)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--table_only", action="store_true", help="print the table of benchmarks/out/mosa/results.json")
    p.add_argument("--methods", nargs="+", default=list(METHODS), help="subset of the method names")
    p.add_argument("--tag", default="", help="suffix of results<tag>.json (e.g. a longer-training scale run)")
    args = p.parse_args()
    for k in ("steps", "batch", "lr"):
        if getattr(args, k) is None:
            setattr(args, k, TASKS[args.task][k])
    if args.table_only:
        runs = json.loads((OUT / f"results{suffix(args)}{args.tag}.json").read_text())["runs"]
        done = {}
        for r in runs:
            for name in r["results"]:
                done.setdefault(name, set()).add(r["seed"])
        seeds = sorted(set.intersection(*done.values()))  # seeds every method has finished
        print(table(runs, seeds))
        return
    if args.quick:
        args.seeds, args.steps, args.clips, args.n_eval, args.eval_epochs = 1, 20, 100, 8, 1
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    dm = data(args)
    if args.tag and (OUT / f"evaluators{suffix(args)}.pt").exists():  # a scale run reuses the main run's evaluators
        return run_all(args, json.loads((OUT / f"results{suffix(args)}.json").read_text())["evaluators"])
    t0 = time.perf_counter()
    tr = dm.splits["train"]
    clf, reg = fit_evaluators(stack(tr, range(len(tr))), epochs=args.eval_epochs)
    te = stack(dm.splits["test"], range(len(dm.splits["test"])))
    with torch.no_grad():
        real_feats = clf.features(te["video"]).numpy()
        acc = float((clf(te["video"]).argmax(-1) == te["action"]).float().mean())
        uv, _ = reg(te["video"].flatten(0, 1))
        jerr = float((uv - te["keypoints2d"].flatten(0, 1)).norm(dim=-1).mean())
    torch.save({"clf": clf.state_dict(), "reg": reg.state_dict(), "real_feats": torch.as_tensor(real_feats)},
               OUT / f"evaluators{suffix(args)}.pt")
    print(f"evaluators: classifier test accuracy {acc:.3f}, pose regressor test joint error {jerr:.2f} px "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    run_all(args, {"test_acc": acc, "joint_err_px": jerr})


def run_all(args, evaluators: dict) -> None:
    seeds = list(range(args.seeds))
    todo = [(n, s) for s in seeds for n in args.methods]
    runs = []
    path = OUT / f"results{suffix(args)}{args.tag}.json"
    with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
        futures = {ex.submit(job, n, s, args): (n, s) for n, s in todo}
        for f in futures:
            r = f.result()
            runs.append(r)
            path.write_text(json.dumps({"args": vars(args), "evaluators": evaluators, "runs": runs}, indent=1))  # partial
            print(f"done {futures[f]}: " + json.dumps({k: {m: round(v, 3) for m, v in res.items()}
                                                      for k, res in r["results"].items()}), flush=True)
    path.write_text(json.dumps({"args": vars(args), "evaluators": evaluators, "runs": runs}, indent=1))
    if not args.tag:
        figure(seeds, args)
    print(table(runs, seeds))


if __name__ == "__main__":
    main()
