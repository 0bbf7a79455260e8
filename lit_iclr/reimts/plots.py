"""Forecast figure: one patient's observed lookback points, forecast and truth, one panel per variable."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def forecast_figure(batch: dict, pred: torch.Tensor, i: int = 0, names: list[str] | None = None,
                    record_hours: float = 48.0, max_vars: int = 6, title: str = ""):
    """Panels for the `max_vars` variables of sample `i` with the most observations that have forecast targets."""
    x, xm, xt = batch["x"][i].cpu(), batch["x_mask"][i].cpu() > 0, batch["x_time"][i].cpu() * record_hours
    y, ym, yt = batch["y"][i].cpu(), batch["y_mask"][i].cpu() > 0, batch["y_time"][i].cpu() * record_hours
    p = pred[i].float().cpu()
    score = xm.sum(0) + 1000 * ym.any(0)  # variables with forecast targets first, then the most observed
    order = [int(v) for v in torch.argsort(score, descending=True)[:max_vars] if score[v] > 0]
    fig, axes = plt.subplots(len(order), 1, figsize=(7, 1.5 * len(order) + 0.5), sharex=True, squeeze=False)
    for ax, v in zip(axes[:, 0], order, strict=True):
        ax.plot(xt[xm[:, v]], x[xm[:, v], v], "o", ms=3, color="tab:blue", label="observed")
        ax.plot(yt[ym[:, v]], y[ym[:, v], v], "s", ms=5, color="black", label="truth")
        ax.plot(yt[ym[:, v]], p[ym[:, v], v], "x", ms=7, color="tab:red", label="forecast")
        ax.axvline(float(xt[xm.any(1)].max()) if xm.any() else 0.0, color="grey", lw=0.5, ls=":")
        ax.set_ylabel(names[v] if names else f"var {v}", fontsize=8)
    axes[0, 0].legend(fontsize=7, ncol=3, loc="upper left")
    axes[-1, 0].set_xlabel("hours since ICU admission (values standardised)")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
