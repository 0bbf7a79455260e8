"""J-TTL benchmark: EvoTest against the baselines on tw-make games played through Jericho (same protocol, same actor).

Tuning first, with the same budget for every method: one knob per method, 3 values each, 2 seeds, on a development game
(cooking_easy made by tw-make with seed 1, not a test game); the value with the highest mean AUC there (ties: the default)
is used on the test games. Then every method plays each test game for K episodes x step_limit steps with the same
seeds; the table gives the normalised AUC, best and final score, episodes to the first win and whether it keeps
winning, the paired 95% CI of EvoTest's AUC minus each baseline's (paired over seeds), the extractor time-outs (a call
that ran past its limit reads "state unavailable"), environment steps/s and the evolver's time per episode. A
learning-curve figure per game goes to seeds/figures/.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/evotest.py --jobs 2 --seeds 5
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ("static", "memory", "reflection", "summary", "rag", "qlearning", "pg", "evotest")
# the tuning budget: one knob per method, 3 values each (the same number of development runs for every method);
# name, default (kept on a tie), values. EvoTest's: c = fraction x max score; on the max-3 development game 0.33 is the
# unscaled c = 1 and 1.0 an exploration term spanning the whole score range
KNOBS = {"static": ("temperature", 1.0, (0.5, 1.0, 1.5)), "memory": ("memory_weight", 3.0, (1.5, 3.0, 6.0)),
         "reflection": ("avoid_weight", 4.0, (2.0, 4.0, 8.0)), "summary": ("memory_weight", 3.0, (1.5, 3.0, 6.0)),
         "rag": ("memory_weight", 3.0, (1.5, 3.0, 6.0)), "qlearning": ("epsilon", 0.2, (0.1, 0.2, 0.4)),
         "pg": ("lr", 0.5, (0.1, 0.5, 2.0)), "evotest": ("exploration_fraction", 0.03, (0.03, 0.33, 1.0))}
DEV_GAME, DEV_SEEDS = "cooking_easy-dev1", (100, 101)  # tw-make cooking_easy with generator seed 1; own seeds
GAMES = {"cooking_easy": ("cooking_easy", 0), "cooking_hard": ("cooking_hard", 0), DEV_GAME: ("cooking_easy", 1),
         "tiny": ("tiny", 0)}  # tw-make custom, 2 rooms, 2 objects, quest length 2 (the LM-actor runs)


def game_file(data_dir: str, name: str) -> Path:
    from lit_iclr.core.data import ensure_generated
    from lit_iclr.evotest.games import generate_game

    kind, seed = GAMES[name]
    folder = ensure_generated(Path(data_dir) / "evotest-games-v1" / name, lambda out: generate_game(kind, out, seed))
    return folder / f"{kind}.z8"


def run_one(game: str, method: str, seed: int, episodes: int, step_limit: int, data_dir: str, actor: str,
            knob: float | None = None, lm_history: int = 6, lm_obs_chars: int = 600) -> dict:
    """One J-TTL run (same code path as the LightningModule's training_step, without the Trainer); `knob` is the value
    of the method's tuned hyperparameter (KNOBS), None for its default; `lm_history` / `lm_obs_chars`: the LM actor's
    prompt (recent steps, observation characters)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from lit_iclr.evotest.actor import LMActor, Weights, play_episode, softmax_sample
    from lit_iclr.evotest.agents import make_agent
    from lit_iclr.evotest.games import ZMachineGame

    g = ZMachineGame(game_file(data_dir, game), seed=seed)
    name, default, _ = KNOBS[method]
    value = default if knob is None else knob
    hp = {k: d for k, d, _ in KNOBS.values()} | {name: value}
    kw: dict = {"temperature": hp["temperature"],
                "weights": Weights(memory=hp["memory_weight"], avoid=hp["avoid_weight"])}
    if actor == "lm":
        from lit_iclr.core.llm import LocalCausalLM

        kw["lm_actor"] = LMActor(LocalCausalLM(), history_steps=lm_history, max_obs_chars=lm_obs_chars)
        kw["temperature"] = 0.5
    if method == "evotest":  # c on raw scores = fraction x max score (the module's exploration_fraction)
        kw.update(drop_threshold=0.5 * g.max_score, c=hp["exploration_fraction"] * g.max_score)
    if method == "qlearning":
        kw["epsilon"] = hp["epsilon"]
    theta = torch.nn.Parameter(torch.zeros(65536))
    opt = torch.optim.SGD([theta], lr=hp["lr"])
    if method == "pg":
        kw["theta"] = theta
    agent = make_agent(method, **kw)
    curve, wins, steps, env_time, evolve_time, wall, timeouts = [], [], 0, 0.0, [], time.perf_counter(), 0
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
        timeouts += r["extractor_timeouts"]
    g.close()
    return {"game": game, "method": method, "seed": seed, "knob": name, "value": value, "curve": curve, "wins": wins,
            "actor": actor, "wall_s": time.perf_counter() - wall,
            "max_score": g.max_score, "extractor_timeouts": timeouts,
            "env_steps_per_s": steps / env_time, "agent_steps_per_s": steps / (time.perf_counter() - wall),
            "evolve_s": float(np.mean(evolve_time[1:])) if episodes > 1 else 0.0}


def tuned(results: list[dict]) -> tuple[dict, str]:
    """method -> the knob value with the highest mean AUC on the development game (ties: the default), and a table."""
    from lit_iclr.evotest.protocol import normalised_auc

    lines = [f"\n**Tuning on {DEV_GAME}** (seeds {', '.join(map(str, DEV_SEEDS))}; 3 values per method)\n",
             "| method | knob | " + " | ".join(f"value {i + 1}" for i in range(3)) + " | chosen | time-outs |",
             "|---|---|---|---|---|---|---|"]
    best = {}
    for m in METHODS:
        name, default, values = KNOBS[m]
        cells, means, tos = [], {}, 0
        for v in values:
            rs = [r for r in results if r["game"] == DEV_GAME and r["method"] == m and r["value"] == v]
            if len(rs) < len(DEV_SEEDS):
                cells.append(f"{v}: -")
                continue
            a = [normalised_auc(r["curve"], r["max_score"]) for r in rs]
            means[v] = float(np.mean(a))
            tos += sum(r["extractor_timeouts"] for r in rs)
            cells.append(f"{v}: {np.mean(a):.3f}")
        if len(means) == len(values):
            top = max(means.values())
            best[m] = default if means[default] == top else next(v for v in values if means[v] == top)
        lines.append(f"| {m} | {name} | " + " | ".join(cells) + f" | {best.get(m, '-')} | {tos} |")
    return best, "\n".join(lines)


def table(results: list[dict]) -> str:
    from lit_iclr.core.stats import paired_ci
    from lit_iclr.evotest.protocol import summarise

    lines = []
    for game in dict.fromkeys(r["game"] for r in results):
        rows = [r for r in results if r["game"] == game]
        max_score = rows[0]["max_score"]
        lines += [f"\n**{game}** (max score {max_score}, {len(rows[0]['curve'])} episodes)\n",
                  "| method | tuned value | AUC | best | final | wins/episodes | first win (ep.) | keeps winning | "
                  "EvoTest - method AUC [95% CI] | extractor time-outs | env steps/s | evolver ms/ep |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
            lines.append(f"| {m} | {rs[0]['knob']} {rs[0]['value']} | {auc.mean():.3f} ± {auc.std(ddof=1):.3f} | "
                         f"{np.mean([x['best'] for x in s]):.2f} | "
                         f"{np.mean([x['final'] for x in s]):.2f} | {sum(x['wins'] for x in s)}/{len(s) * len(rs[0]['curve'])} | "
                         f"{first} | {keeps} | {ci} | {sum(r['extractor_timeouts'] for r in rs)} | "
                         f"{np.mean([r['env_steps_per_s'] for r in rs]):.0f} | "
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


def execute(todo: list[tuple], a, out: Path, done: list[dict]) -> None:
    """Run (game, method, seed, knob value) jobs not yet in `done`, appending each result to `out` as it finishes."""
    have = {(r["game"], r["method"], r["seed"], r.get("value")) for r in done}
    todo = [j for j in todo if j not in have]
    with ProcessPoolExecutor(a.jobs) as ex:
        futs = [ex.submit(run_one, g, m, s, a.episodes, a.step_limit, a.data_dir, a.actor, v, a.lm_history,
                          a.lm_obs_chars) for g, m, s, v in todo]
        for f in as_completed(futs):
            r = f.result()
            done.append(r)
            with open(out, "a") as fh:
                fh.write(json.dumps(r) + "\n")
            print(f"{r['game']} {r['method']} {r['knob']}={r['value']} seed {r['seed']}: {r['curve']} "
                  f"(time-outs {r['extractor_timeouts']})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", nargs="+", default=["cooking_easy", "cooking_hard"])
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--episodes", type=int, default=12)
    p.add_argument("--step-limit", type=int, default=50)
    p.add_argument("--actor", default="rule", choices=["rule", "lm"])
    p.add_argument("--lm-history", type=int, default=6, help="LM actor: recent steps in the prompt")
    p.add_argument("--lm-obs-chars", type=int, default=600, help="LM actor: characters of the observation in the prompt")
    p.add_argument("--no-tuning", action="store_true", help="every method at its default value (no development runs)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--data-dir", default=str(ROOT / "data"))
    p.add_argument("--out", default=str(ROOT / "runs" / "benchmarks" / "evotest_tuned.jsonl"))
    p.add_argument("--figures", default=str(ROOT / "seeds" / "figures"))
    p.add_argument("--table-only", action="store_true", help="print the table of the results already in --out")
    a = p.parse_args()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    for g in [*a.games, DEV_GAME]:  # generate each game once before the workers start
        game_file(a.data_dir, g)
    if not a.table_only and not a.no_tuning:
        execute([(DEV_GAME, m, s, KNOBS[m][2][i]) for i in range(3) for m in a.methods for s in DEV_SEEDS], a, out, done)
    best, tuning = tuned(done) if not a.no_tuning else ({m: KNOBS[m][1] for m in METHODS}, "")
    if not a.table_only:
        execute([(g, m, s, best[m]) for g in a.games for s in range(a.seeds) for m in a.methods], a, out, done)
    print(tuning)
    results = [r for r in done if r["game"] in a.games and r["method"] in a.methods and r["seed"] < a.seeds
               and r.get("value") == best.get(r["method"])]
    print(table(results))
    for path in figure(results, Path(a.figures)):
        print(f"figure: {path}")


if __name__ == "__main__":
    main()
