"""benchmarks/default_runs.py reads the headline back from the summary a run prints, and tabulates it."""
import sys
from pathlib import Path

from lit_iclr.core.summary import CardValue, Headline, headline_lines

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import default_runs  # noqa: E402


def _stdout(metrics: dict[str, float], head: Headline) -> str:
    return "\n".join(["noise before", "lit-iclr: fit done - run folder runs/x", *headline_lines(metrics, head, "val"),
                      "  other metrics (last validation):", "  val/loss | 0.3"])


def test_the_method_row_and_the_first_in_run_baseline_are_read_back():
    head = Headline(metric="{stage}/acc", higher_is_better=True, method="AIRE at 70%",
                    card={"paper": CardValue(0.9, "seeds/x.md")}, baselines={"LAST at 70%": "{stage}/acc_last"})
    r = {"rc": 0, "wall_s": 12.0, "cpu_s": 20.0, "load_before": 0.1, "first_time_generation": True,
         "headline": default_runs.headline_of(_stdout({"val/acc": 0.75, "val/acc_last": 0.68}, head))}
    assert r["headline"]["metric"] == "val/acc"
    assert [x["who"] for x in r["headline"]["rows"]] == ["AIRE at 70%", "LAST at 70%", "paper (card)"]
    # the in-run baseline is preferred over the card's, whatever the order
    assert default_runs._cell(r) == ("val/acc", "AIRE at 70% 0.75", "LAST at 70% 0.68: +0.07 (method ahead)")
    assert "| aire_prune | 12 | 20 | 0.1 | generated | yes | val/acc |" in default_runs.table({"aire_prune": r})


def test_a_run_without_a_headline_or_that_failed_says_so():
    r = {"rc": 1, "wall_s": 400.0, "cpu_s": 1.0, "load_before": 0.0, "first_time_generation": False,
         "headline": default_runs.headline_of("Traceback ...")}
    assert default_runs._cell(r) == ("-", "-", "failed (rc 1)")
    assert "| no |" in default_runs.table({"vgf": r})


def test_a_label_holding_a_bar_is_read_whole_and_escaped_in_the_markdown_cell():
    head = Headline(metric="{stage}/acc", higher_is_better=True, method="namex (|beta| 0.9)",
                    baselines={"dense": "{stage}/acc_dense"})
    r = {"rc": 0, "wall_s": 12.0, "cpu_s": 20.0, "load_before": 0.1, "first_time_generation": True,
         "headline": default_runs.headline_of(_stdout({"val/acc": 0.5, "val/acc_dense": 0.6}, head))}
    assert [x["who"] for x in r["headline"]["rows"]] == ["namex (|beta| 0.9)", "dense"]
    assert default_runs._cell(r) == ("val/acc", "namex (|beta| 0.9) 0.5", "dense 0.6: -0.1 (method behind)")
    row = default_runs.table({"namex": r}).splitlines()[-1]
    assert "namex (\\|beta\\| 0.9) 0.5" in row
    assert row.replace("\\|", "").count("|") == 10  # nine cells
