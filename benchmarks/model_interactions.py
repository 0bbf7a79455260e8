"""Data-mediated model interactions: linear-Gaussian theory vs Monte Carlo, and K tiny LMs on Wikipedia topics.

    OMP_NUM_THREADS=1 python benchmarks/model_interactions.py [--seeds 0 1 2] [--generations 3] [--out seeds/figures]

Part 1 (seconds): exact mean/covariance recursions next to a Monte Carlo of the finite-sample process, the alpha x beta
sweep of own-task risk, cross-task risk, inter-model gap and rho(Q) after G generations, and collapse at rho(Q) = 1.
Part 2 (minutes): K = 2 LMs (Mathematics / History private, Geography public) for G generations with alpha in
{0 (isolation), 0.5, 1}, beta = 0.5, same steps and sizes; own / cross perplexity, JS divergence and CKA, paired 95% CIs.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from lit_iclr.core.stats import mean_std, paired_ci  # noqa: E402
from lit_iclr.model_interactions import theory as th  # noqa: E402


def theory_part(out: Path | None, generations: int = 30) -> None:
    p = th.default_problem(K=2, d=8, seed=0)
    rng = np.random.default_rng(0)
    n, G, R = 40, 6, 4000
    print("## Linear-Gaussian theory (K=2, d=8)\n")
    print("Exact recursion vs Monte Carlo of the finite-sample process (fixed designs, n=40, G=6, 4000 replicates):\n")
    print("| alpha | beta | rho(Q) | own risk exact | own risk MC | cross risk exact | cross risk MC | gap exact | gap MC |")
    print("|---|---|---|---|---|---|---|---|---|")
    for alpha, beta in [(0.0, 0.5), (0.5, 0.5), (1.0, 0.5)]:
        d0, d1 = th.draw_designs(p, n, 0.0, beta, rng), th.draw_designs(p, n, alpha, beta, rng)
        m, C, r = th.moments(p, n, alpha, beta, G, d0, d1)
        ex = th.summarize(p, **th.risks(p, m, C))
        theta = th.monte_carlo(p, d0, d1, G, R, rng).reshape(R, G + 1, -1)
        mc_m = theta.mean(0)
        mc_C = np.einsum("rti,rtj->tij", theta - mc_m, theta - mc_m) / (R - 1)
        mc = th.summarize(p, **th.risks(p, mc_m, mc_C))
        print(f"| {alpha} | {beta} | {r.spectral_radius:.3f} | {ex['own'][-1]:.3f} | {mc['own'][-1]:.3f} | "
              f"{ex['cross'][-1]:.3f} | {mc['cross'][-1]:.3f} | {ex['gap'][-1]:.3f} | {mc['gap'][-1]:.3f} |")
    grid = np.linspace(0, 1, 5)
    sw = th.sweep(p, 200, grid, grid, generations)
    total = sw["own"] + sw["cross"]
    print(f"\nPopulation theory after G={generations} generations (n=200); rows alpha, columns beta "
          f"{[round(float(g), 2) for g in grid]}; own + cross risk (lower is better), gap (homogenisation), rho(Q):\n")
    print("| alpha | own+cross risk | gap | rho(Q) |")
    print("|---|---|---|---|")
    for a, alpha in enumerate(grid):
        print(f"| {alpha:.2f} | {' / '.join(f'{v:.2f}' for v in total[a])} | {' / '.join(f'{v:.3f}' for v in sw['gap'][a])} "
              f"| {' / '.join(f'{v:.2f}' for v in sw['rho'][a])} |")
    a, b = np.unravel_index(np.argmin(total), total.shape)
    print(f"\nBest own+cross risk at alpha={grid[a]:.2f}, beta={grid[b]:.2f}.")
    # collapse: at alpha = 1, rho(Q) = 1 and the covariance grows linearly
    growth = []
    for alpha in (0.9, 1.0):
        m, C, r = th.moments(p, 200, alpha, 0.5, 200)
        growth.append((alpha, r.spectral_radius, th.summarize(p, **th.risks(p, m, C))["own"][[10, 50, 200]]))
    for alpha, rho, own in growth:
        print(f"alpha={alpha}: rho(Q)={rho:.4f}, own risk at generations 10/50/200 = "
              f"{own[0]:.3f} / {own[1]:.3f} / {own[2]:.3f}")
    if out is not None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
        for ax, (name, val) in zip(axes, [("own+cross risk", total), ("gap |theta_1-theta_2|^2", sw["gap"]),
                                          ("rho(Q)", sw["rho"])], strict=True):
            im = ax.imshow(val, origin="lower", extent=(0, 1, 0, 1), aspect="auto")
            ax.set_xlabel("beta")
            ax.set_ylabel("alpha")
            ax.set_title(name)
            fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(out / "model_interactions_theory_heatmaps.png", dpi=100)


def lm_part(seeds, generations: int, alphas, out: Path | None, sequences: int = 512) -> None:
    import lightning as L
    import torch

    from lit_iclr.model_interactions import InteractionData, InteractionLM

    torch.set_num_threads(1)
    dm = InteractionData(sequences_per_generation=sequences, seq_len=32, vocab_size=512, eval_sequences=64, batch_size=16)
    dm.prepare_data()
    dm.setup()
    results: dict[float, list[list[dict]]] = {a: [] for a in alphas}
    tmp = Path(tempfile.mkdtemp(prefix="mi_bench_"))
    t_start = time.time()
    for seed in seeds:
        for alpha in alphas:
            L.seed_everything(seed, verbose=False)
            dm.alpha, dm.seed, dm.pool_dir = alpha, seed, str(tmp / f"a{alpha}-s{seed}")
            model = InteractionLM(dm.vocab_size, dm.num_entities, dm.seq_len, 64, 2, 4,
                                  optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.01),
                                  synthetic_sequences=64, seed=seed)
            trainer = L.Trainer(accelerator="cpu", max_epochs=generations + 1, reload_dataloaders_every_n_epochs=1,
                                num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                                default_root_dir=str(tmp))
            trainer.fit(model, datamodule=dm)
            results[alpha].append(model.history)
            h = model.history[-1]
            print(f"  seed {seed} alpha {alpha}: own {h['own_ppl']:.1f} cross {h['cross_ppl']:.1f} js {h['js']:.4f} "
                  f"cka {h['cka']:.3f} ({time.time() - t_start:.0f}s)", flush=True)
    print(f"\n## K=2 tiny LMs, beta=0.5, {generations} interacting generations, {sequences} blocks (x32 tokens) per "
          f"entity per generation, seeds {list(seeds)}\n")
    print("| alpha | own-topic ppl | cross-topic ppl | JS divergence (nats) | CKA |")
    print("|---|---|---|---|---|")
    for alpha in alphas:
        last = [h[-1] for h in results[alpha]]
        print(f"| {alpha}{' (isolation)' if alpha == 0 else ''} | {mean_std([r['own_ppl'] for r in last], 4)} | "
              f"{mean_std([r['cross_ppl'] for r in last], 4)} | {mean_std([r['js'] for r in last], 3)} | "
              f"{mean_std([r['cka'] for r in last], 3)} |")
    base = [h[-1] for h in results[alphas[0]]]
    print("\nPaired 95% CIs vs isolation (alpha=0), same seeds:\n")
    for alpha in alphas[1:]:
        last = [h[-1] for h in results[alpha]]
        for key in ("own_ppl", "cross_ppl", "js", "cka"):
            print(f"- alpha={alpha} minus isolation, {key}: {paired_ci([r[key] for r in last], [r[key] for r in base])}")
    print("\nPer generation (mean over seeds): cross ppl / JS")
    for alpha in alphas:
        cross = np.mean([[r["cross_ppl"] for r in h] for h in results[alpha]], 0)
        js = np.mean([[r["js"] for r in h] for h in results[alpha]], 0)
        print(f"- alpha={alpha}: " + ", ".join(f"g{g}: {c:.1f} / {j:.4f}" for g, (c, j) in enumerate(zip(cross, js,
                                                                                                     strict=True))))
    if out is not None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
        for alpha in alphas:
            for ax, key in zip(axes, ("own_ppl", "cross_ppl", "js"), strict=True):
                ax.plot(np.mean([[r[key] for r in h] for h in results[alpha]], 0), marker="o", label=f"alpha={alpha}")
                ax.set_title(key)
                ax.set_xlabel("generation")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(out / "model_interactions_lm_generations.png", dpi=100)
    # speed: K entity models per step vs one model alone (the reference), same batch
    model = InteractionLM(dm.vocab_size, dm.num_entities, dm.seq_len)
    ids = dm.mix(0)[:, :16].transpose(0, 1)
    opt = torch.optim.AdamW(model.parameters(), 3e-3)

    def timed(fn, reps=10):
        t = time.perf_counter()
        for _ in range(reps):
            opt.zero_grad()
            fn().backward()
            opt.step()
        return (time.perf_counter() - t) / reps

    t_k = timed(lambda: sum(model.token_nll(m, ids[:, k])[0].mean() for k, m in enumerate(model.models)))
    t_1 = timed(lambda: model.token_nll(model.models[0], ids[:, 0])[0].mean())
    tokens = ids[:, 0].numel()
    k_rate, one_rate = dm.num_entities * tokens / t_k, tokens / t_1
    print(f"\nSpeed: K={dm.num_entities} entity step {t_k * 1e3:.0f} ms ({k_rate:.0f} tok/s), one model alone (reference) "
          f"{t_1 * 1e3:.0f} ms ({one_rate:.0f} tok/s); per-token throughput ratio {k_rate / one_rate:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--out", default="seeds/figures")
    ap.add_argument("--sequences", type=int, default=512, help="training blocks per entity per generation")
    ap.add_argument("--skip_lm", action="store_true")
    args = ap.parse_args()
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    theory_part(out)
    if not args.skip_lm:
        lm_part(args.seeds, args.generations, args.alphas, out, args.sequences)


if __name__ == "__main__":
    main()
