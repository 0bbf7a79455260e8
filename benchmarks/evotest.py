"""J-TTL benchmark: EvoTest against the baselines on tw-make games played through Jericho (same protocol, same actor).

Every method plays each game for K episodes x step_limit steps with the same seeds; the table gives the normalised AUC,
best and final score, episodes to the first win and whether it keeps winning, the paired 95% CI of EvoTest's AUC minus
each baseline's (paired over seeds), environment steps/s and the evolver's time per episode. A learning-curve figure
per game goes to seeds/figures/.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/evotest.py --jobs 2
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ("static", "memory", "reflection", "summary", "rag", "qlearning", "pg", "evotest")


def run_one(game: str, method: str, seed: int, episodes: int, step_limit: int, data_dir: str, actor: str) -> dict:
    """One J-TTL run (same code path as the LightningModule's training_step, without the Trainer)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from lit_iclr.core.data import ensure_generated
    from lit_iclr.evotest.actor import LMActor, play_episode, softmax_sample
    from lit_iclr.evotest.agents import make_agent
    from lit_iclr.evotest.games import ZMachineGame, generate_game

    folder = ensure_generated(Path(data_dir) / "evotest-games-v1" / game, lambda out: generate_game(game, out, 0))
    g = ZMachineGame(folder / f"{game}.z8", seed=seed)
    kw: dict = {}
    if actor == "lm":
        from lit_iclr.core.llm import LocalCausalLM

        kw["lm_actor"] = LMActor(LocalCausalLM())
        kw["temperature"] = 0.5
    if method == "evotest":
        kw["drop_threshold"] = 0.5 * g.max_score
    theta = torch.nn.Parameter(torch.zeros(65536))
    opt = torch.optim.SGD([theta], lr=0.5)
    if method == "pg":
        kw["theta"] = theta
    agent = make_agent(method, **kw)
    curve, wins, steps, env_time, evolve_time, wall = [], [], 0, 0.0, [], time.perf_counter()
    for e in range(episodes):
        chi = agent.begin_episode()
        evolve_time.append(getattr(agent, "evolve_seconds", 0.0))
        rng = np.random.default_rng([seed, e])

        def choose(sit, rng, chi=chi):
            j, _ = softmax_sample(agent.logits(chi, sit), chi.temperature, rng)
            if method == "pg":
                agent.record_choice(j)
            return j

        r = play_episode(g, chi, choose, step_limit, rng)
        if method == "pg":
            opt.zero_grad()
            agent.loss(r).backward()
            opt.step()
        agent.end_episode(r)
        curve.append(int(r["score"]))
        wins.append(bool(r["won"]))
        steps += r["steps"]
        env_time += r["env_time"]
    g.close()
    return {"game": game, "method": method, "seed": seed, "curve": curve, "wins": wins, "max_score": g.max_score,
            "env_steps_per_s": steps / env_time, "agent_steps_per_s": steps / (time.perf_counter() - wall),
            "evolve_s": float(np.mean(evolve_time[1:])) if episodes > 1 else 0.0}


def table(results: list[dict]) -> str:
    from lit_iclr.core.stats import paired_ci
    from lit_iclr.evotest.protocol import summarise

    lines = []
    for game in dict.fromkeys(r["game"] for r in results):
        rows = [r for r in results if r["game"] == game]
        max_score = rows[0]["max_score"]
        lines += [f"\n**{game}** (max score {max_score}, {len(rows[0]['curve'])} episodes)\n",
                  "| method | AUC | best | final | wins/episodes | first win (ep.) | keeps winning | "
                  "EvoTest - method AUC [95% CI] | env steps/s | evolver ms/ep |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        by = {}
        for r in rows:
            by.setdefault(r["method"], []).append(r)
        evo = {r["seed"]: summarise(r["curve"], r["wins"], max_score)["auc"] for r in by.get("evotest", [])}
        for m, rs in by.items():
            rs.sort(key=lambda r: r["seed"])
            s = [summarise(r["curve"], r["wins"], max_score) for r in rs]
            auc = np.array([x["auc"] for x in s])
            fw = [x["first_win"] for x in s]
            kw = [x["keeps_winning"] for x in s]
            won_runs = [f for f in fw if f is not None]
            first = f"{np.mean(won_runs):.1f} ({len(won_runs)}/{len(fw)} seeds)" if won_runs else "never"
            keeps = f"{sum(bool(k) for k in kw if k is not None)}/{len(won_runs)}" if won_runs else "-"
            if m != "evotest" and evo:
                seeds = [r["seed"] for r in rs if r["seed"] in evo]
                ci = str(paired_ci([evo[k] for k in seeds],
                                   [x["auc"] for x, r in zip(s, rs, strict=True) if r["seed"] in evo]))
            else:
                ci = "-"
            lines.append(f"| {m} | {auc.mean():.3f} ± {auc.std():.3f} | {np.mean([x['best'] for x in s]):.2f} | "
                         f"{np.mean([x['final'] for x in s]):.2f} | {sum(x['wins'] for x in s)}/{len(s) * len(rs[0]['curve'])} | "
                         f"{first} | {keeps} | {ci} | {np.mean([r['env_steps_per_s'] for r in rs]):.0f} | "
                         f"{1000 * np.mean([r['evolve_s'] for r in rs]):.0f} |")
    return "\n".join(lines)


def figure(results: list[dict], out_dir: Path) -> list[Path]:
    from lit_iclr.evotest.plots import curve_figure

    paths = []
    for game in dict.fromkeys(r["game"] for r in results):
        rows = [r for r in results if r["game"] == game]
        curves: dict[str, list] = {}
        for r in sorted(rows, key=lambda r: (METHODS.index(r["method"]), r["seed"])):
            curves.setdefault(r["method"], []).append(r["curve"])
        fig = curve_figure(curves, rows[0]["max_score"], game)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"evotest_{game}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", nargs="+", default=["cooking_easy", "cooking_hard"])
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--episodes", type=int, default=12)
    p.add_argument("--step-limit", type=int, default=50)
    p.add_argument("--actor", default="rule", choices=["rule", "lm"])
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--data-dir", default=str(ROOT / "data"))
    p.add_argument("--out", default=str(ROOT / "runs" / "benchmarks" / "evotest.jsonl"))
    p.add_argument("--figures", default=str(ROOT / "seeds" / "figures"))
    p.add_argument("--table-only", action="store_true", help="print the table of the results already in --out")
    a = p.parse_args()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    if not a.table_only:
        have = {(r["game"], r["method"], r["seed"]) for r in done}
        todo = [(g, m, s) for g in a.games for s in range(a.seeds) for m in a.methods if (g, m, s) not in have]
        # generate each game once before the workers start
        from lit_iclr.core.data import ensure_generated
        from lit_iclr.evotest.games import generate_game

        for g in a.games:
            ensure_generated(Path(a.data_dir) / "evotest-games-v1" / g, lambda o, g=g: generate_game(g, o, 0))
        with ProcessPoolExecutor(a.jobs) as ex:
            futs = [ex.submit(run_one, g, m, s, a.episodes, a.step_limit, a.data_dir, a.actor) for g, m, s in todo]
            for f in futs:
                r = f.result()
                done.append(r)
                with open(out, "a") as fh:
                    fh.write(json.dumps(r) + "\n")
                print(f"{r['game']} {r['method']} seed {r['seed']}: {r['curve']}", flush=True)
    results = [r for r in done if r["game"] in a.games and r["method"] in a.methods]
    print(table(results))
    for path in figure(results, Path(a.figures)):
        print(f"figure: {path}")


if __name__ == "__main__":
    main()
