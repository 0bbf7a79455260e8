"""Seeing but Not Believing / VEA on the default evidence-VQA data: the analysis, VEA vs controls, and VEA's cost.

For each seed: pretrain the vision tower as an item classifier (cached), train projector + decoder on the VQA task (the
module's own training step, Lightning Trainer; the trained weights are cached), profile layers on the calibration split,
then on the (more cluttered) test split report per-layer RAPT image share / evidence AUROC / NDCG / top-patch hit rates,
the seeing-but-not-believing rate, and the accuracy of the plain answer, VEA, its controls and baselines (the same
trained model, the same number of kept patches, one re-answer each). Also: plain accuracy on training-like scenes (the
model's competence), and plain / VEA / annotated-evidence mask with 1-4 items per test scene (the same model).
Paired 95% CIs over seeds. Speed: seconds per question of one plain answer and of the whole VEA answer (first pass with
attention + mask + re-answer), interleaved in the same process (CPU time).

    OMP_NUM_THREADS=1 python benchmarks/vea.py --seeds 0 1 2 3 4           # configs/vea.yaml's setting
    OMP_NUM_THREADS=1 python benchmarks/vea.py --seeds 0 1 2 --max_steps 300  # a scale point (its own result folder)
    OMP_NUM_THREADS=1 python benchmarks/vea.py --seeds 0 1 2 --question_first 0   # LLaVA's [image; question] order
    OMP_NUM_THREADS=1 python benchmarks/vea.py --seeds 0 1 2 --patch_size 8 --depth 6 --vision_seed 0   # vea_grid.yaml
    python benchmarks/vea.py --scale <tag> <tag> ...                         # the scale table of finished runs

Every seed's result is a JSON file under --out_dir/<tag>/ (tag: the run's settings); a finished seed is not rerun.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import lightning as L
import numpy as np
import torch

from lit_iclr.core.stats import mean_std, paired_ci
from lit_iclr.vea import EvidenceVQA, VEAModule, analysis
from lit_iclr.vea.plots import layer_figure

ROOT = Path(__file__).resolve().parents[1]
CONTROLS = ("vea_random_layers", "vea_shallow_layers", "vea_random_mask", "crop", "assembly", "oracle_mask")
SWEEP_VARIANTS = ("plain", "vea", "vea_random_mask", "oracle_mask")


class EpochPrinter(L.Callback):
    """One line per validation (calibration-split accuracy, wall time) so a long run can be followed in its log."""

    def on_validation_epoch_end(self, trainer, pl_module):
        acc = trainer.callback_metrics.get("val/acc")
        if acc is not None and not trainer.sanity_checking:
            print(f"  step {trainer.global_step}: val/acc {float(acc):.3f} ({time.perf_counter() - START:.0f} s)", flush=True)


START = time.perf_counter()


def tag_of(args) -> str:
    frozen = "frozen" if args.freeze_vision else "tuned"
    return (f"items{args.min_items}-{args.num_items}_test{args.eval_items}_steps{args.max_steps}_dim{args.dim}"
            f"_vis{args.vision_dim}{'_qfirst' if args.question_first else ''}"
            f"_pre{args.pretrain_steps}{frozen}_g{args.gamma}{args.context}"
            + (f"_patch{args.patch_size}_depth{args.depth}" if (args.patch_size, args.depth) != (16, 3) else "")
            + (f"_vseed{args.vision_seed}" if args.vision_seed is not None else ""))


def datamodule(args, **over) -> EvidenceVQA:
    kw = dict(data_dir=args.data_dir, batch_size=args.batch_size, num_train=args.num_train, num_val=args.num_val,
              num_test=args.num_test, num_items=args.num_items, min_items=args.min_items, eval_num_items=args.eval_items,
              p_same_group=args.p_same_group, max_question_len=args.max_question_len)
    dm = EvidenceVQA(**{**kw, **over})
    dm.prepare_data()
    dm.setup("test")
    return dm


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def run_seed(seed: int, args, out: Path) -> dict:
    done = out / f"seed{seed}.json"
    if done.exists():
        return json.loads(done.read_text())
    L.seed_everything(seed, verbose=False)
    dm = datamodule(args)
    model = VEAModule(num_answers=dm.num_answers, vocab_size=dm.vocab_size, image_size=dm.image_size, dim=args.dim,
                      vision_dim=args.vision_dim, max_question_len=dm.max_question_len, question_first=bool(args.question_first),
                      depth=args.depth, heads=args.heads, patch_size=args.patch_size, control_seed=seed,
                      gamma=args.gamma, context=args.context, vision_pretrain_steps=args.pretrain_steps,
                      vision_pretrain_seed=seed if args.vision_seed is None else args.vision_seed,
                      freeze_vision=args.freeze_vision, vision_cache=str(out.parent / "vision"),
                      optimizer=lambda p: torch.optim.AdamW(p, lr=args.lr, weight_decay=0.05))
    trainer = L.Trainer(max_steps=args.max_steps, max_epochs=-1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                        val_check_interval=min(args.max_steps, 100), check_val_every_n_epoch=None, callbacks=[EpochPrinter()])
    weights = out / f"model_seed{seed}.pt"
    if weights.exists():  # trained earlier (a stopped benchmark): test only
        saved = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(saved["state_dict"])
        train_s, item_acc = float(saved["train_s"]), float(saved["item_acc"])
    else:
        t0 = time.process_time()
        trainer.fit(model, dm)
        train_s, item_acc = time.process_time() - t0, model.vision_item_acc
        tmp = weights.with_suffix(f".tmp{os.getpid()}")
        torch.save({"state_dict": model.state_dict(), "train_s": train_s, "item_acc": item_acc}, tmp)
        os.replace(tmp, weights)
    trainer.test(model, dm, verbose=False)
    res = dict(model.test_results, train_cpu_s=train_s, item_acc=item_acc, **speed(model, dm))
    res["plain_training_like"] = accuracies(model, datamodule(args, num_train=1, eval_num_items=None), ("plain",))["plain"]
    res["sweep"] = {str(k): accuracies(model, datamodule(args, num_train=1, eval_num_items=k), SWEEP_VARIANTS)
                    for k in args.sweep_items}
    res.update(seed=seed, num_test=args.num_test, tag=out.name)
    print(f"seed {seed}: plain {res['acc/plain']:.3f} vea {res['acc/vea']:.3f} oracle {res['acc/oracle_mask']:.3f} "
          f"training-like plain {res['plain_training_like']:.3f} item acc {item_acc:.3f} layers {res['layers']}", flush=True)
    write_json(done, res)
    return res


@torch.no_grad()
def accuracies(model: VEAModule, dm: EvidenceVQA, variants: tuple[str, ...]) -> dict[str, float]:
    """Accuracy of `variants` on dm's test split, VEA using the layers profiled on the main calibration split."""
    model.eval()
    cfg = replace(model.cfg, variants=variants)
    gen = torch.Generator().manual_seed(0)
    hits: dict[str, list] = {v: [] for v in variants}
    for batch in dm.test_dataloader():
        first = analysis.attention_batch(model.vlm, batch, model.image_size, cfg.min_overlap)
        var = analysis.intervene(model.vlm, batch, first, model.layer_auroc, cfg, model.image_size, gen)
        for v in variants:
            hits[v].append(var[v])
    return {v: torch.cat(h).float().mean().item() for v, h in hits.items()}


@torch.no_grad()
def speed(model: VEAModule, dm: EvidenceVQA, batches: int = 8) -> dict:
    """CPU seconds per question: plain answer vs VEA (attention pass + mask + re-answer), interleaved in one process."""
    model.eval()
    vlm, cfg = model.vlm, model.cfg
    cfg_vea = replace(cfg, variants=("vea",))
    loader = list(dm.test_dataloader())[:batches]
    gen = torch.Generator().manual_seed(0)
    plain = vea_t = 0.0
    n = 0
    for _ in range(2):
        for batch in loader:
            t = time.process_time()
            vlm(batch["x"], batch["q"])
            plain += time.process_time() - t
            t = time.process_time()
            first = analysis.attention_batch(vlm, batch, model.image_size, cfg.min_overlap)
            analysis.intervene(vlm, batch, first, model.layer_auroc, cfg_vea, model.image_size, gen)
            vea_t += time.process_time() - t
            n += len(batch["x"])
    return {"plain_s_per_q": plain / n, "vea_s_per_q": vea_t / n}


def table(results: list[dict]) -> str:
    get = lambda k: [r[k] for r in results]  # noqa: E731
    lines = [f"Accuracy on {results[0]['num_test']} test questions, {len(results)} seeds (mean +- std); paired 95% CI of "
             "the difference to the plain answer, and VEA minus each control:", "",
             "| answer | accuracy | minus plain | VEA minus this |", "|---|---|---|---|"]
    vea_acc = get("acc/vea")
    for name in ("plain", "vea", *CONTROLS):
        acc = get(f"acc/{name}")
        vs_plain = "" if name == "plain" else str(paired_ci(acc, get("acc/plain")))
        vea_minus = "" if name in ("plain", "vea") else str(paired_ci(vea_acc, acc))
        lines.append(f"| {name} | {mean_std(acc)} | {vs_plain} | {vea_minus} |")
    lines += ["", "| quantity | value |", "|---|---|",
              f"| held-out item accuracy of the pretrained vision tower | {mean_std(get('item_acc'))} |",
              f"| plain accuracy on training-like scenes | {mean_std(get('plain_training_like'))} |",
              f"| seeing-but-not-believing rate (wrong answers whose top profiled-layer patch is evidence) | "
              f"{mean_std(get('sbnb_rate'))} |",
              f"| same hit rate for right answers | {mean_std(get('hit_rate_correct'))} |",
              f"| chance (evidence fraction of patches) | {mean_std(get('evidence_fraction'))} |",
              f"| profiled layers (per seed) | {', '.join(str(r['layers']) for r in results)} |",
              f"| training CPU seconds per seed (decoder; tower pretraining cached) | {mean_std(get('train_cpu_s'))} |",
              f"| CPU s / question, plain answer | {mean_std(get('plain_s_per_q'))} |",
              f"| CPU s / question, VEA (attention pass + mask + re-answer) | {mean_std(get('vea_s_per_q'))} |",
              f"| VEA cost / plain answer | {mean_std([r['vea_s_per_q'] / r['plain_s_per_q'] for r in results])} |"]
    depth = len(results[0]["layer/auroc"])
    lines += ["", "Per decoder layer (mean +- std over seeds; test split; hit = top-attended patch inside the evidence):", "",
              "| layer | RAPT image share | attention mass on image | evidence AUROC | evidence NDCG | hit, right answers | "
              "hit, wrong answers |", "|---|---|---|---|---|---|---|"]
    for layer in range(depth):
        cells = [mean_std([r[k][layer] for r in results]) for k in
                 ("layer/rapt_share", "layer/image_mass", "layer/auroc", "layer/ndcg", "layer/hit_correct", "layer/hit_wrong")]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    lines += ["", "Items per test scene (the same trained models; paired 95% CI of the difference to the plain answer):", "",
              "| items | plain | vea - plain | random mask - plain | oracle mask - plain |", "|---|---|---|---|---|"]
    for k in results[0]["sweep"]:
        acc = {v: [r["sweep"][k][v] for r in results] for v in SWEEP_VARIANTS}
        lines.append(f"| {k} | {mean_std(acc['plain'])} | {paired_ci(acc['vea'], acc['plain'])} | "
                     f"{paired_ci(acc['vea_random_mask'], acc['plain'])} | {paired_ci(acc['oracle_mask'], acc['plain'])} |")
    return "\n".join(lines)


def scale_table(out_dir: Path, tags: list[str]) -> str:
    lines = ["| run (settings) | seeds | training-like plain | test plain | vea - plain | oracle mask - plain | "
             "best-layer AUROC |", "|---|---|---|---|---|---|---|"]
    for tag in tags:
        rs = [json.loads(f.read_text()) for f in sorted((out_dir / tag).glob("seed*.json"))]
        if not rs:
            continue
        get = {k: [r[k] for r in rs] for k in ("plain_training_like", "acc/plain", "acc/vea", "acc/oracle_mask")}
        lines.append(f"| {tag} | {len(rs)} | {mean_std(get['plain_training_like'])} | {mean_std(get['acc/plain'])} | "
                     f"{paired_ci(get['acc/vea'], get['acc/plain'])} | {paired_ci(get['acc/oracle_mask'], get['acc/plain'])}"
                     f" | {mean_std([max(r['layer/auroc']) for r in rs])} |")
    return "\n".join(lines)


def figure(results: list[dict], path: str) -> None:
    keys = [k for k in results[0] if k.startswith("layer/")]
    mean = {k: np.mean([r[k] for r in results], 0).tolist() for k in keys}
    std = {k: np.std([r[k] for r in results], 0, ddof=1).tolist() for k in keys} if len(results) > 1 else None
    mean["evidence_fraction"] = float(np.mean([r["evidence_fraction"] for r in results]))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    layer_figure(mean, std).savefig(path, dpi=110)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--max_steps", type=int, default=1500, help="decoder training steps")
    p.add_argument("--pretrain_steps", type=int, default=3000, help="vision-tower item pretraining steps (0: none)")
    p.add_argument("--freeze_vision", type=int, default=1, help="1: the pretrained tower stays fixed during VQA training")
    p.add_argument("--vision_seed", type=int, default=None,
                   help="one pretrained tower (this pretraining seed) for every seed, like one CLIP checkpoint; "
                        "default: a tower per seed")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--num_items", type=int, default=2, help="most items in a training scene")
    p.add_argument("--min_items", type=int, default=1, help="fewest items in a training scene")
    p.add_argument("--eval_items", type=int, default=4, help="items in every calibration / test scene (clutter)")
    p.add_argument("--sweep_items", type=int, nargs="*", default=[1, 2, 3, 4], help="test-scene item counts to sweep")
    p.add_argument("--p_same_group", type=float, default=0.0, help="distractors from the target's confusable group")
    p.add_argument("--max_question_len", type=int, default=12, help="question tokens kept (BOS + words + ANSWER)")
    p.add_argument("--num_train", type=int, default=3000)
    p.add_argument("--num_val", type=int, default=300)
    p.add_argument("--num_test", type=int, default=500)
    p.add_argument("--patch_size", type=int, default=16, help="16: 2x2 image tokens (configs/vea.yaml); 8: vea_scenes")
    p.add_argument("--vision_dim", type=int, default=96, help="ViT tower width")
    p.add_argument("--question_first", type=int, default=1, help="1: [question; image; ANSWER]; 0: [image; question; ANSWER]")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--gamma", type=float, default=0.0, help="retention of the context outside the mask")
    p.add_argument("--context", default="zero", help="what the context fades to: blur | mean | zero")
    p.add_argument("--data_dir", default=str(ROOT / "data"))
    p.add_argument("--out_dir", default=str(ROOT / "benchmarks" / "out" / "vea"))
    p.add_argument("--scale", nargs="+", help="result tags under --out_dir: print their scale table instead of running")
    p.add_argument("--figure", default=str(ROOT / "seeds" / "figures" / "vea_layers.png"))
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.scale:
        print(scale_table(Path(args.out_dir), args.scale))
    else:
        out = Path(args.out_dir) / tag_of(args)
        out.mkdir(parents=True, exist_ok=True)
        print(f"results in {out}", flush=True)
        results = [run_seed(s, args, out) for s in args.seeds]
        print(table(results))
        if args.figure:
            figure(results, args.figure)
