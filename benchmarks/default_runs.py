"""Every method's default run, one after another: wall and CPU time, first-time data generation, and the headline.

    python benchmarks/default_runs.py                      # all 19, each into an empty data folder (generation timed)
    python benchmarks/default_runs.py --methods storm,vgf  # some
    python benchmarks/default_runs.py --cached             # reuse data/ (what a second run costs)
    python benchmarks/default_runs.py --report             # the table from the saved results only

Each run is `python cli.py fit --config configs/<method>.yaml` in its own process, writing into
runs/default_runs/<method>; with an empty data folder (the default) the first-time generation of the method's data
(datasets, pretrained towers, base models: whatever the method caches under its data folder) is part of the time.
Results are saved after every method (runs/default_runs/results.json), so a stopped sweep continues where it was.
The table reads the headline from the end of the run's own summary: the method's value, its first in-run baseline and
who is ahead. The load average before each run is recorded: the 5-minute target is for an idle 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lit_iclr.registry import METHODS  # noqa: E402

OUT = ROOT / "runs" / "default_runs"
TARGET_S = 300.0  # "a default run finishes within 5 minutes"


def headline_of(stdout: str) -> dict:
    """The headline block of the last summary in `stdout`: metric, the method's row, each baseline row's value and
    verdict (`summary.headline_lines` writes them)."""
    start = stdout.rfind("lit-iclr: fit done")
    lines = stdout[start:].splitlines() if start >= 0 else []
    out: dict = {"metric": None, "rows": []}
    for i, line in enumerate(lines):
        m = re.match(r"\s+headline: (\S+)", line)
        if m:
            out["metric"] = m.group(1)
            for row in lines[i + 2:]:  # after the "who | value | ..." header
                if " | " not in row:
                    break
                # the columns are joined with " | "; a label may hold a bare "|" (NAMEx's "|beta| 0.9")
                cells = [c.strip() for c in row.split(" | ")]
                out["rows"].append({"who": cells[0], "value": cells[1], "diff": cells[2] if len(cells) > 2 else ""})
            break
        if "was not logged" in line:
            out["not_logged"] = True
    return out


def run_one(method: str, cached: bool, timeout: float) -> dict:
    run_dir = OUT / method
    shutil.rmtree(run_dir, ignore_errors=True)
    data_dir = ROOT / "data" if cached else OUT / "_data" / method
    if not cached:
        shutil.rmtree(data_dir, ignore_errors=True)
    generated_before = data_dir.exists() and any(data_dir.iterdir())
    cmd = [sys.executable, "cli.py", "fit", "--config", f"configs/{method}.yaml",
           "--trainer.default_root_dir", str(run_dir), "--data.init_args.data_dir", str(data_dir),
           "--trainer.enable_progress_bar", "false"]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = "timeout", (e.stdout or b"").decode(errors="replace"), (e.stderr or b"").decode(
            errors="replace")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "default_run.log").write_text(stdout + "\n--- stderr ---\n" + stderr[-20000:])
    return {"method": method, "command": " ".join(cmd[1:5]), "rc": rc, "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "load_before": round(load, 2), "first_time_generation": not cached,
            "data_was_cached": generated_before, "headline": headline_of(stdout)}


def _cell(r: dict) -> tuple[str, str, str]:
    h = r["headline"]
    if not h.get("metric"):
        return "-", "-", "no headline printed" if r["rc"] == 0 else f"failed (rc {r['rc']})"
    rows = h["rows"]
    if not rows:
        return h["metric"], "-", "not logged"
    mine = rows[0]
    inrun = [x for x in rows[1:] if "(card)" not in x["who"] and x["value"] != "not logged"]
    base = inrun[0] if inrun else (rows[1] if len(rows) > 1 else None)
    vs = f"{base['who']} {base['value']}: {base['diff']}" if base else "no baseline"
    return h["metric"], f"{rows[0]['who']} {mine['value']}", vs


def table(results: dict) -> str:
    lines = ["| method | wall s | CPU s | load before | data | within 5 min | headline metric | method | vs first baseline |",
             "|---|---|---|---|---|---|---|---|---|"]
    for method in METHODS:
        r = results.get(method)
        if r is None:
            continue
        metric, mine, vs = _cell(r)
        data = "generated" if r["first_time_generation"] else "cached"
        ok = "yes" if r["rc"] == 0 and r["wall_s"] <= TARGET_S else "no"
        mine, vs = (c.replace("|", "\\|") for c in (mine, vs))  # a "|" in a label would split the markdown cell
        lines.append(f"| {method} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['load_before']:.1f} | {data} | {ok} | "
                     f"{metric} | {mine} | {vs} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated method names")
    ap.add_argument("--cached", action="store_true", help="reuse data/ instead of an empty data folder per method")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds before a run is stopped")
    ap.add_argument("--report", action="store_true", help="print the table of the saved results and exit")
    ap.add_argument("--out", type=Path, default=OUT / "results.json")
    args = ap.parse_args()
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if not args.report:
        unknown = [m for m in args.methods.split(",") if m not in METHODS]
        if unknown:
            sys.exit(f"default_runs.py: unknown methods {unknown}; choose from {', '.join(METHODS)}")
        for method in args.methods.split(","):
            print(f"[{time.strftime('%H:%M:%S')}] {method} ...", flush=True)
            r = run_one(method, args.cached, args.timeout)
            results[method] = r
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(results, indent=1))
            os.replace(tmp, args.out)
            print(f"  rc {r['rc']}, {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU, load {r['load_before']}: "
                  f"{' / '.join(_cell(r))}", flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
