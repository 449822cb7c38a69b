"""Plots of one output, as one inline PNG (matplotlib, Agg): self-contained, no network.

One figure per output (error histogram with the standard's thresholds, heat map of where
the error sits, error per step) costs one layout and one render, which is what keeps a
report with dozens of failing outputs fast to build.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
from pathlib import Path

from ..histbins import EDGES

DPI = 96
_PLT = []  # matplotlib's pyplot, imported on the first figure not found in the cache


def _pyplot():
    """matplotlib (Agg) on first use: a rebuild whose figures are all cached, and a run
    with nothing to plot, never pay its ~0.5 s import."""
    if not _PLT:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plt.rcParams.update({"font.size": 8})
        _PLT.append(plt)
    return _PLT[0]


# plain-text tick labels ("1e3", not mathtext's 10^3): parsing mathtext was a third of a
# figure's time; no minor ticks on log axes (each tick is a set of artists to lay out)
def _plain_label(value: float, _pos=None) -> str:
    """0.1, 1000, 1e4, 1e-3: short, no mathtext."""
    if value and (abs(value) >= 1e4 or abs(value) < 1e-2):
        mantissa, exponent = f"{value:.0e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:g}"


def _plain_log(axis) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator
    axis.set_major_formatter(FuncFormatter(_plain_label))
    axis.set_minor_locator(NullLocator())


def thresholds(row: dict) -> list[tuple[float, str]]:
    """Relative-error lines of the deciding standard, for the histogram."""
    from .. import dtypes as dt
    std, dtype = row.get("standard"), row.get("out_dtype")
    try:
        tr = dt.traits(dt.to_torch(dtype))
    except (KeyError, TypeError):
        return []
    if std == "cann_v1":
        return [(tr.cann_v1_threshold, "T (MERE)"), (10 * tr.cann_v1_threshold, "10T (MARE)")]
    if std == "allclose" and row.get("rtol"):
        return [(float(row["rtol"]), "rtol")]
    if std == "cann_v2":
        return [(tr.v2_rtol, "v2 rtol")]
    if std in ("hundredth", "thousandth", "ten_thousandth"):
        return [({"hundredth": 1e-2, "thousandth": 1e-3, "ten_thousandth": 1e-4}[std], std)]
    if std == "abs_threshold":
        return [(tr.abs_threshold_rtol, "rtol")]
    return []


def _histogram(ax, row: dict, data: dict) -> None:
    import numpy as np
    edges = np.asarray(EDGES)
    for name, color, label in (("floor", "#9aa5b1", "error floor (golden rounded)"),
                               ("actual", "#d9480f", "kernel")):
        ax.stairs(data[name]["counts"], edges, fill=name == "floor", color=color,
                  alpha=0.6 if name == "floor" else 1.0, label=label, lw=1.2)
    ax.set_yscale("symlog", linthresh=1)
    _plain_log(ax.yaxis)
    for value, label in thresholds(row):
        if value > 0:
            ax.axvline(math.log10(value), color="#1c7ed6", ls="--", lw=1)
            ax.annotate(label, (math.log10(value), 1), xycoords=("data", "axes fraction"),
                        rotation=90, va="top", ha="right", fontsize=7, color="#1c7ed6")
    a = data["actual"]
    ax.set_title(f"relative error d/(|g|+1e-7): {a['zero']} exact, {a['under']} below "
                 f"1e{EDGES[0]:.0f}, {a['over']} above 1e{EDGES[-1]:.0f}", fontsize=8)
    ax.set_xlabel("log10 relative error")
    ax.set_ylabel("elements")
    ax.legend(fontsize=7, loc="upper left")


def _heatmap(fig, ax, data: dict) -> None:
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import LogLocator
    grid = np.maximum(np.asarray(data["grid"], dtype=float), 1e-30)
    hi = float(grid.max())
    lo = min(max(float(grid.min()), hi * 1e-12, 1e-30), hi / 10)  # uniform grids stay bright
    im = ax.imshow(grid, aspect="auto", cmap="magma", interpolation="nearest",
                   norm=LogNorm(vmin=lo, vmax=hi),
                   extent=(0, data["cols"], data["rows"], 0))
    bar = fig.colorbar(im, ax=ax, label=f"max {data['measure']}")
    _plain_log(bar.ax.yaxis)
    bar.ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # narrow ranges too
    ax.set_xlabel("last dim")
    ax.set_ylabel("rows (leading dims flattened)")
    ax.set_title("where the error sits", fontsize=8)


def _steps(ax, steps: list[dict]) -> None:
    import numpy as np
    x = [s["step"] for s in steps]
    for key, color in (("max_abs", "#d9480f"), ("rmse", "#1c7ed6"), ("mare", "#2b8a3e")):
        ys = [s[key] if isinstance(s.get(key), (int, float)) and s[key] > 0 else np.nan
              for s in steps]
        if not all(np.isnan(ys)):
            ax.plot(x, ys, marker="o", ms=3, color=color, label=key)
    ax.set_yscale("log")
    _plain_log(ax.yaxis)
    ax.set_xlabel("step")
    ax.set_title("error per step", fontsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


FIGURE_FIELDS = ("histogram", "heatmap", "step_metrics", "standard", "out_dtype", "rtol")


def figure(row: dict, cache: Path | None = None) -> str | None:
    """The plots of one output as a data: URI of a PNG; None when there is nothing to plot.
    ``cache``: a folder of figures by the hash of what they show, so rebuilding a report
    (``verify report``) renders only what changed."""
    if cache is None:
        return _render(row)
    blob = json.dumps([row.get(k) for k in FIGURE_FIELDS], sort_keys=True, default=str)
    path = cache / f"{hashlib.sha256(blob.encode()).hexdigest()[:32]}.txt"
    try:
        return path.read_text() or None
    except OSError:
        pass
    uri = _render(row)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(uri or "")
        os.replace(tmp, path)
    except OSError:  # a read-only report folder: render, do not cache
        pass
    return uri


def _render(row: dict) -> str | None:
    hist, heat = row.get("histogram"), row.get("heatmap")
    steps = row.get("step_metrics") if len(row.get("step_metrics") or []) > 1 else None
    panels = [p for p, present in (("hist", hist), ("heat", heat), ("steps", steps)) if present]
    if not panels:
        return None
    widths = {"hist": 5.2, "heat": 4.2, "steps": 4.2}
    width = sum(widths[p] for p in panels)
    # fixed margins, not a layout engine: the engine's text measuring was ~60% of a figure
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(width, 2.6),
                             width_ratios=[widths[p] for p in panels])
    fig.subplots_adjust(left=0.55 / width, right=1 - 0.15 / width, bottom=0.17, top=0.88,
                        wspace=0.3)
    for ax, panel in zip(axes[0], panels):
        if panel == "hist":
            _histogram(ax, row, hist)
        elif panel == "heat":
            _heatmap(fig, ax, heat)
        else:
            _steps(ax, steps)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
