"""Seeing but Not Believing / VEA on the default evidence-VQA data: the analysis, VEA vs controls, and VEA's cost.

For each seed: train the compact VLM (the module's own training step, Lightning Trainer), profile layers on the
calibration split, then on the test split report per-layer RAPT image share / evidence AUROC / NDCG / top-patch hit rates,
the seeing-but-not-believing rate, and the accuracy of the plain answer, VEA, its controls and baselines (the same trained
model, the same number of kept patches, one re-answer each). Paired 95% CIs over seeds. Speed: seconds per question of
one plain answer and of the whole VEA answer (first pass with attention + mask + re-answer), measured in the same run.

    OMP_NUM_THREADS=1 python benchmarks/vea.py --seeds 0 1 2          # the defaults of configs/vea.yaml
    # or one process per seed (then `--aggregate` the JSON files): faster on a shared machine
    OMP_NUM_THREADS=1 python benchmarks/vea.py --seeds 1 --out benchmarks/out/vea_1.json
    python benchmarks/vea.py --aggregate benchmarks/out/vea_*.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch

from lit_iclr.core.stats import mean_std, paired_ci
from lit_iclr.vea import EvidenceVQA, VEAModule, analysis
from lit_iclr.vea.plots import layer_figure

ROOT = Path(__file__).resolve().parents[1]
CONTROLS = ("vea_random_layers", "vea_shallow_layers", "vea_random_mask", "crop", "assembly", "oracle_mask")


class EpochPrinter(L.Callback):
    """One line per epoch (validation accuracy, wall time) so a long run can be followed in its log."""

    def on_validation_epoch_end(self, trainer, pl_module):
        acc = trainer.callback_metrics.get("val/acc")
        if acc is not None and not trainer.sanity_checking:
            print(f"  epoch {trainer.current_epoch}: val/acc {float(acc):.3f} ({time.perf_counter() - START:.0f} s)", flush=True)


START = time.perf_counter()


def run_seed(seed: int, args) -> dict:
    L.seed_everything(seed, verbose=False)
    dm = EvidenceVQA(data_dir=args.data_dir, batch_size=args.batch_size, num_train=args.num_train, num_val=args.num_val,
                     num_test=args.num_test, num_items=args.num_items, p_same_group=args.p_same_group)
    model = VEAModule(num_answers=dm.num_answers, vocab_size=dm.vocab_size, image_size=dm.image_size, dim=args.dim,
                      depth=args.depth, heads=args.heads, patch_size=args.patch_size, control_seed=seed,
                      optimizer=lambda p: torch.optim.AdamW(p, lr=args.lr, weight_decay=0.05))
    trainer = L.Trainer(max_epochs=args.epochs, max_steps=args.max_steps, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                        callbacks=[EpochPrinter()])
    t0 = time.perf_counter()
    trainer.fit(model, dm)
    train_s = time.perf_counter() - t0
    trainer.test(model, dm, verbose=False)
    res = dict(model.test_results, train_s=train_s, **speed(model, dm))
    print(f"seed {seed}: plain {res['acc/plain']:.3f} vea {res['acc/vea']:.3f} sbnb {res['sbnb_rate']:.3f} "
          f"layers {res['layers']} ({train_s:.0f} s training)", flush=True)
    return res


@torch.no_grad()
def speed(model: VEAModule, dm: EvidenceVQA, batches: int = 8) -> dict:
    """Seconds per question: plain answer vs VEA (attention pass + mask + re-answer), interleaved in the same run."""
    model.eval()
    vlm, cfg = model.vlm, model.cfg
    cfg_vea = analysis.VEAConfig(**{**cfg.__dict__, "variants": ("vea",)})
    loader = list(dm.test_dataloader())[:batches]
    gen = torch.Generator().manual_seed(0)
    plain = vea_t = 0.0
    n = 0
    for _ in range(2):
        for batch in loader:
            t = time.perf_counter()
            vlm(batch["x"], batch["q"])
            plain += time.perf_counter() - t
            t = time.perf_counter()
            first = analysis.attention_batch(vlm, batch, model.image_size, cfg.min_overlap)
            analysis.intervene(vlm, batch, first, model.layer_auroc, cfg_vea, model.image_size, gen)
            vea_t += time.perf_counter() - t
            n += len(batch["x"])
    return {"plain_s_per_q": plain / n, "vea_s_per_q": vea_t / n}


def table(results: list[dict], num_test: int) -> str:
    get = lambda k: [r[k] for r in results]  # noqa: E731
    lines = [f"Accuracy on {num_test} test questions, {len(results)} seeds (mean +- std); paired 95% CI of the "
             "difference to the plain answer, and VEA minus each control:", "",
             "| answer | accuracy | minus plain | VEA minus this |", "|---|---|---|---|"]
    vea_acc = get("acc/vea")
    for name in ("plain", "vea", *CONTROLS):
        acc = get(f"acc/{name}")
        vs_plain = "" if name == "plain" else str(paired_ci(acc, get("acc/plain")))
        vea_minus = "" if name in ("plain", "vea") else str(paired_ci(vea_acc, acc))
        lines.append(f"| {name} | {mean_std(acc)} | {vs_plain} | {vea_minus} |")
    lines += ["", "| quantity | value |", "|---|---|",
              f"| seeing-but-not-believing rate (wrong answers whose top profiled-layer patch is evidence) | "
              f"{mean_std(get('sbnb_rate'))} |",
              f"| same hit rate for right answers | {mean_std(get('hit_rate_correct'))} |",
              f"| chance (evidence fraction of patches) | {mean_std(get('evidence_fraction'))} |",
              f"| profiled layers (per seed) | {', '.join(str(r['layers']) for r in results)} |",
              f"| training seconds per seed | {mean_std(get('train_s'))} |",
              f"| s / question, plain answer | {mean_std(get('plain_s_per_q'))} |",
              f"| s / question, VEA (attention pass + mask + re-answer) | {mean_std(get('vea_s_per_q'))} |",
              f"| VEA cost / plain answer | {mean_std([r['vea_s_per_q'] / r['plain_s_per_q'] for r in results])} |"]
    depth = len(results[0]["layer/auroc"])
    lines += ["", "Per decoder layer (mean +- std over seeds; test split; hit = top-attended patch inside the evidence):", "",
              "| layer | RAPT image share | attention mass on image | evidence AUROC | evidence NDCG | hit, right answers | "
              "hit, wrong answers |", "|---|---|---|---|---|---|---|"]
    for layer in range(depth):
        cells = [mean_std([r[k][layer] for r in results]) for k in
                 ("layer/rapt_share", "layer/image_mass", "layer/auroc", "layer/ndcg", "layer/hit_correct", "layer/hit_wrong")]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--max_steps", type=int, default=-1, help="stop after this many optimizer steps (-1: epochs decide)")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--num_items", type=int, default=2, help="items per scene (the target and num_items - 1 distractors)")
    p.add_argument("--p_same_group", type=float, default=0.0, help="distractors from the target's confusable group")
    p.add_argument("--num_train", type=int, default=3000)
    p.add_argument("--num_val", type=int, default=300)
    p.add_argument("--num_test", type=int, default=500)
    p.add_argument("--patch_size", type=int, default=16, help="16: 2x2 image tokens (configs/vea.yaml); 8: vea_scenes")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--data_dir", default=str(ROOT / "data"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "vea.json"))
    p.add_argument("--aggregate", nargs="+", help="JSON files of earlier runs: print their table instead of running")
    p.add_argument("--figure", default=str(ROOT / "seeds" / "figures" / "vea_layers.png"))
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.aggregate:
        results = [r for f in args.aggregate for r in json.loads(Path(f).read_text())]
    else:
        results = [dict(run_seed(s, args), seed=s, num_test=args.num_test) for s in args.seeds]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    md = table(results, results[0]["num_test"])
    print(md)
    keys = [k for k in results[0] if k.startswith("layer/")]
    mean = {k: np.mean([r[k] for r in results], 0).tolist() for k in keys}
    std = {k: np.std([r[k] for r in results], 0, ddof=1).tolist() if len(results) > 1 else None for k in keys}
    mean["evidence_fraction"] = float(np.mean([r["evidence_fraction"] for r in results]))
    Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
    layer_figure(mean, std if len(results) > 1 else None).savefig(args.figure, dpi=110)
