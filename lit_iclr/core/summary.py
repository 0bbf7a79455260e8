"""The few lines every `fit` / `validate` / `test` ends with: run folder, checkpoint, headline metrics, figures.

A method chooses its headline metrics with the hook `summary_metrics` on its LightningModule: a sequence of glob
patterns over logged metric names, `{stage}` standing for `val` (after fit/validate) or `test`. Metrics named
`<metric>/<who>` (a model and its baselines, e.g. `val/rmse_norm_6h/persistence`) are shown as one row with a column per
`<who>`. Without the hook the method's default below is used, else every metric of the stage.
"""
from __future__ import annotations

import fnmatch
import re
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
    table = headline_table(metrics, headline_patterns(module, stage))
    if table:
        lines.append(f"  headline metrics ({'last validation' if stage == 'val' else 'test'}):")
        lines += table
    elif subcommand == "fit":
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
