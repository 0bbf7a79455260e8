"""The few lines every `fit` / `validate` / `test` ends with: run folder, checkpoint, headline metrics, figures.

A method chooses its headline metrics with the hook `summary_metrics` on its LightningModule: a sequence of glob
patterns over logged metric names, `{stage}` standing for `val` (after fit/validate) or `test`. Metrics named
`<metric>/<who>` (a model and its baselines, e.g. `val/rmse_norm_6h/persistence`) are shown as one row with a column per
`<who>`. Without the hook the method's default below is used, else every metric of the stage.

A method states its headline with the hook `headline` (returning a `Headline`): the metric, its direction, and the
baselines it is compared with. Baselines computed in the same run on the same data are logged metric keys; expensive ones
are `CardValue`s read from the method card and marked as such. The summary then opens with one table, method vs each
baseline and the difference, and says in words which side is ahead.
"""
from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .hub import final_metrics

# Defaults of the methods that do not define `summary_metrics` (package -> patterns); a method's own hook wins.
DEFAULT_HEADLINES: dict[str, tuple[str, ...]] = {
    "lit_iclr.storm": ("{stage}/rmse_norm_*h/*", "{stage}/acc_*h/*"),
    "lit_iclr.reimts": ("{stage}/mse", "{stage}/mae"),
    "lit_iclr.vgf": ("{stage}/score", "{stage}/score_*", "{stage}/success_*"),
    "lit_iclr.aire_prune": ("{stage}/acc", "{stage}/loss", "{stage}/pruned_fraction"),
    "lit_iclr.namex": ("{stage}/acc", "{stage}/acc_clean", "{stage}/acc_corrupted", "{stage}/ppl", "{stage}/loss"),
    "lit_iclr.heapr": ("{stage}/ppl", "{stage}/topic_acc", "{stage}/achieved_ratio"),
}
MAX_ROWS = 12


@dataclass(frozen=True)
class CardValue:
    """A baseline too expensive for the default job: its value as measured in the card, and where (file and table).
    `stage` ("val" / "test") shows it only after that stage, when the card measured it on that split."""
    value: float
    source: str
    stage: str | None = None


@dataclass(frozen=True)
class Headline:
    """What a method's run is for. Keys may hold `{stage}` (`val` after fit/validate, `test` after test).

    metric: the logged key of the method's number. higher_is_better: its direction. baselines: name -> logged key of
    the same quantity for a baseline computed in this run on the same data. card: name -> `CardValue` for baselines
    read from the card. claim: the paper's claim in one line, as this run tests it. method: the label of the method's
    row. extra: other logged keys worth showing under the table (e.g. a trend the claim is about).
    """
    metric: str
    higher_is_better: bool
    baselines: Mapping[str, str] = field(default_factory=dict)
    card: Mapping[str, CardValue] = field(default_factory=dict)
    claim: str = ""
    method: str = "method"
    extra: tuple[str, ...] = ()

    def keys(self, stage: str) -> list[str]:
        return [k.format(stage=stage) for k in (self.metric, *self.baselines.values(), *self.extra)]


def module_headline(module: Any) -> Headline | None:
    hook = getattr(module, "headline", None)
    value = hook() if callable(hook) else hook
    if value is not None and not isinstance(value, Headline):
        raise TypeError(f"{type(module).__name__}.headline must return a lit_iclr.core.summary.Headline, "
                        f"not {type(value).__name__}")
    return value


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def headline_lines(metrics: Mapping[str, float], head: Headline, stage: str) -> list[str]:
    """The headline table: method vs each baseline, the difference (method - baseline), and who is ahead."""
    key = head.metric.format(stage=stage)
    direction = "higher is better" if head.higher_is_better else "lower is better"
    lines = [f"  headline: {key} ({direction})" + (f" - {head.claim}" if head.claim else "")]
    if key not in metrics:
        lines.append(f"  {key} was not logged in this run (no {stage} pass reached it; see the card for its value)")
        return lines
    mine = float(metrics[key])
    rows: list[tuple[str, str, str, str]] = [(head.method, _fmt(mine), "", "")]
    ahead, behind, level = [], [], []
    others = [(name, k.format(stage=stage), None) for name, k in head.baselines.items()]
    others += [(f"{name} (card)", None, cv) for name, cv in head.card.items() if cv.stage in (None, stage)]
    for name, k, card in others:
        value = card.value if card is not None else metrics.get(k)
        if value is None:
            rows.append((name, "not logged", "", k))
            continue
        diff = mine - float(value)
        better = (diff > 0) == head.higher_is_better and diff != 0
        (level if diff == 0 else ahead if better else behind).append(name)
        verdict = "method ahead" if better else ("tie" if diff == 0 else "method behind")
        rows.append((name, _fmt(float(value)), f"{diff:+.4g} ({verdict})", card.source if card else k))
    widths = [max(len(r[i]) for r in [("who", "value", "method - who", "source"), *rows]) for i in range(4)]
    for r in [("who", "value", "method - who", "source"), *rows]:
        lines.append("  " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    if ahead or behind or level:
        parts = []
        if ahead:
            parts.append("ahead of " + ", ".join(ahead))
        if behind:
            parts.append("behind " + ", ".join(behind))
        if level:
            parts.append("level with " + ", ".join(level))
        lines.append(f"  {head.method} is " + "; ".join(parts) + " on " + key)
    for k in head.extra:
        k = k.format(stage=stage)
        if k in metrics:
            lines.append(f"  {k} = {_fmt(float(metrics[k]))}")
    return lines


def headline_patterns(module: Any, stage: str) -> tuple[str, ...]:
    hook = getattr(module, "summary_metrics", None)
    patterns = hook() if callable(hook) else hook
    if patterns is None:
        package = ".".join(type(module).__module__.split(".")[:2])
        patterns = DEFAULT_HEADLINES.get(package, ("{stage}/*",))
    return tuple(p.format(stage=stage) for p in patterns)


def headline_table(metrics: dict[str, float], patterns: tuple[str, ...]) -> list[str]:
    """Markdown-ish rows: `metric | value` or, for `<metric>/<who>` families, `metric | who1 | who2 ...`."""
    natural = sorted(metrics, key=lambda k: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", k)])
    keys = [k for p in patterns for k in natural if fnmatch.fnmatchcase(k, p)]
    keys = list(dict.fromkeys(keys))
    families: dict[str, dict[str, float]] = {}
    for k in keys:
        head, _, who = k.rpartition("/")
        wildcard_tail = any(p.endswith("/*") and fnmatch.fnmatchcase(k, p) for p in patterns)
        if wildcard_tail and "/" in head:  # `val/rmse/persistence`, not `val/loss`
            families.setdefault(head, {})[who] = metrics[k]
        else:
            families.setdefault(k, {})[""] = metrics[k]
    rows, columns = [], []
    for fam in families.values():
        columns += [c for c in fam if c and c not in columns]
    if columns:
        rows.append("  " + " | ".join(["metric", *columns]))
    for name, fam in list(families.items())[:MAX_ROWS]:
        if "" in fam:
            rows.append(f"  {name} | {fam['']:.4g}")
        else:
            rows.append("  " + " | ".join([name, *(f"{fam[c]:.4g}" if c in fam else "-" for c in columns)]))
    return rows


def summary_lines(trainer, module, subcommand: str) -> list[str]:
    stage = "test" if subcommand == "test" else "val"
    run = Path(trainer.default_root_dir)
    # the last logged value of each metric (a resumed run may not have validated since), updated by this run's
    metrics = final_metrics(run)
    metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1})
    lines = [f"lit-iclr: {subcommand} done - run folder {run}"]
    ckpt = trainer.checkpoint_callback
    if subcommand == "fit" and ckpt is not None and (ckpt.last_model_path or ckpt.best_model_path):
        lines.append(f"  checkpoint: {ckpt.last_model_path or ckpt.best_model_path}")
    elif subcommand != "fit" and trainer.ckpt_path:
        lines.append(f"  checkpoint: {trainer.ckpt_path}")
    head = module_headline(module) if module is not None else None
    if head is not None:
        lines += headline_lines(metrics, head, stage)
        shown = set(head.keys(stage))
        metrics = {k: v for k, v in metrics.items() if k not in shown}
    table = headline_table(metrics, headline_patterns(module, stage))
    if table:
        label = "other metrics" if head is not None else "headline metrics"
        lines.append(f"  {label} ({'last validation' if stage == 'val' else 'test'}):")
        lines += table
    elif subcommand == "fit" and head is None:
        lines.append("  no validation metrics logged yet (limit_val_batches=0, or no validation before the end)")
    figures = sorted((run / "figures").glob("*.png"))
    if figures:
        lines.append(f"  figures: {run / 'figures'} ({len(figures)} png)")
    elif any(run.glob("events.out.tfevents*")):
        lines.append(f"  figures and curves: tensorboard --logdir {run}")
    return lines


def print_summary(trainer, module, subcommand: str) -> None:
    """Print the end-of-run summary on rank 0 (stdout, so it is the last thing in a log)."""
    if trainer is None or not trainer.is_global_zero:
        return
    print("\n".join(summary_lines(trainer, module, subcommand)), flush=True)


SHAPE_ERROR = re.compile(r"shapes? cannot be multiplied|size mismatch|must match the size|Expected .*channels|"
                         r"expected input.*to have|doesn't match the broadcast shape|size of tensor a|"
                         r"shape '\[.*\]' is invalid|Given groups=|index out of range in self", re.IGNORECASE)


def shape_error(error: BaseException, model: Any, datamodule: Any, global_step: int) -> ConfigError | None:
    """A `ConfigError` naming the data and model sizes when `error` is a shape error of the first batch; else None."""
    if global_step > 0 or not SHAPE_ERROR.search(str(error)):
        return None
    data_sizes = {attr: getattr(datamodule, attr, None) for attr in getattr(datamodule, "model_links", {})}
    hparams = dict(getattr(model, "hparams", {}) or {})
    model_sizes = {k: v for k, v in hparams.items() if isinstance(v, int) and not isinstance(v, bool)}
    shown = ", ".join(f"{k}={v}" for k, v in list(model_sizes.items())[:8]) or "no integer arguments"
    data_shown = ", ".join(f"{k}={v}" for k, v in data_sizes.items() if not isinstance(v, (list, tuple))) or "-"
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    return ConfigError(
        f"{type(model).__name__} does not fit the data of {type(datamodule).__name__} at the first batch ({first}). "
        f"Data sizes: {data_shown}; model sizes: {shown}. Fix: use the model and data of one config "
        "(sizes the data decides are linked automatically; do not set them by hand)")
