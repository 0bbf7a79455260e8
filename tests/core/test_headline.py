"""The run summary's headline: method vs each baseline, the difference and who is ahead, from logged values."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from lit_iclr.core.summary import CardValue, Headline, headline_lines, module_headline, summary_lines


def _rows(lines):
    return {r.split("|")[0].strip(): [c.strip() for c in r.split("|")[1:]] for r in lines if "|" in r}


def test_differences_and_direction_are_computed_from_the_logged_values():
    head = Headline(metric="{stage}/tv", higher_is_better=False, method="sampler",
                    baselines={"final model": "{stage}/tv/final", "tempering": "{stage}/tv/tempering"},
                    card={"paper": CardValue(0.30, "seeds/x.md, table 'Headline'")}, extra=("{stage}/steps",))
    metrics = {"val/tv": 0.25, "val/tv/final": 0.40, "val/tv/tempering": 0.20, "val/steps": 7.0}
    lines = headline_lines(metrics, head, "val")
    rows = _rows(lines)
    assert rows["sampler"][0] == "0.25"
    assert rows["final model"][:2] == ["0.4", "-0.15 (method ahead)"]  # lower is better: 0.25 - 0.40 < 0
    assert rows["tempering"][:2] == ["0.2", "+0.05 (method behind)"]
    assert rows["paper (card)"][1] == "-0.05 (method ahead)" and rows["paper (card)"][2].startswith("seeds/x.md")
    assert "  sampler is ahead of final model, paper (card); behind tempering on val/tv" in lines
    assert "  val/steps = 7" in lines


def test_higher_is_better_flips_the_verdict_and_a_missing_baseline_is_named():
    head = Headline(metric="{stage}/return", higher_is_better=True, baselines={"prior": "{stage}/return_prior",
                                                                                "absent": "{stage}/nothing"})
    rows = _rows(headline_lines({"test/return": 2.0, "test/return_prior": 1.5}, head, "test"))
    assert rows["prior"][1] == "+0.5 (method ahead)"
    assert rows["absent"][0] == "not logged" and rows["absent"][2] == "test/nothing"


def test_a_tie_is_level_not_behind():
    head = Headline(metric="{stage}/acc", higher_is_better=True, method="VEA",
                    baselines={"plain": "{stage}/acc/plain", "random": "{stage}/acc/random"})
    lines = headline_lines({"val/acc": 0.125, "val/acc/plain": 0.125, "val/acc/random": 0.1}, head, "val")
    assert _rows(lines)["plain"][1] == "+0 (tie)"
    assert "  VEA is ahead of random; level with plain on val/acc" in lines


def test_a_card_value_of_another_split_is_not_shown():
    head = Headline(metric="{stage}/mse", higher_is_better=False,
                    card={"backbone": CardValue(0.75, "seeds/x.md", stage="test")})
    assert "backbone (card)" not in _rows(headline_lines({"val/mse": 0.7}, head, "val"))
    assert _rows(headline_lines({"test/mse": 0.7}, head, "test"))["backbone (card)"][1] == "-0.05 (method ahead)"


def test_a_metric_not_logged_says_so_instead_of_a_table():
    lines = headline_lines({}, Headline(metric="{stage}/acc", higher_is_better=True), "val")
    assert len(lines) == 2 and "val/acc was not logged" in lines[1]


def test_a_hook_returning_something_else_is_refused():
    with pytest.raises(TypeError, match="must return"):
        module_headline(SimpleNamespace(headline=lambda: {"metric": "x"}))


def test_summary_shows_the_headline_first_and_the_rest_as_other_metrics(tmp_path):
    (tmp_path / "metrics.csv").write_text("epoch,step,val/acc,val/acc_vanilla,val/loss\n0,9,0.9,0.8,0.3\n")

    class Module:
        def headline(self):
            return Headline(metric="{stage}/acc", higher_is_better=True, baselines={"vanilla": "{stage}/acc_vanilla"})

    trainer = SimpleNamespace(default_root_dir=str(tmp_path), callback_metrics={}, checkpoint_callback=None,
                              ckpt_path=None)
    lines = summary_lines(trainer, Module(), "fit")
    text = "\n".join(lines)
    assert text.index("headline: val/acc") < text.index("other metrics")
    assert "+0.1 (method ahead)" in text
    assert "val/loss | 0.3" in text and "val/acc_vanilla |" not in text.split("other metrics")[1]
