"""Plots of one output, as one inline SVG: self-contained, no network, no plotting library.

One figure per output shown in detail: the error histogram (kernel against error floor,
with the standard's thresholds), the heat map of where the error sits, and the error per
step. Each is a few hundred shapes written as SVG text, ~10 ms a figure here;
matplotlib took ~0.13 s a figure and 0.5 s to import, most of a report's build time.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import os
from html import escape
from pathlib import Path

from verify.comparator.dtype_traits import NAME_ALIASES, TRAITS_BY_NAME
from verify.comparator.histbins import EDGES

H = 250  # px, every panel
WIDTHS = {"hist": 500, "heat": 400, "steps": 400}
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 24, 40
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'
# matplotlib's magma at nine even stops, interpolated linearly between them
MAGMA = ["#000004", "#1c1044", "#4f127b", "#812581", "#b5367a", "#e55064", "#fb8761",
         "#fec287", "#fcfdbf"]


def _plain_label(value: float) -> str:
    """0.1, 1000, 1e4, 1e-3: short labels."""
    if value and (abs(value) >= 1e4 or abs(value) < 1e-2):
        mantissa, exponent = f"{value:.0e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:g}"


def thresholds(row: dict) -> list[tuple[float, str]]:
    """Relative-error lines of the deciding standard, for the histogram."""
    std, dtype = row.get("standard"), row.get("out_dtype")
    tr = TRAITS_BY_NAME.get(NAME_ALIASES.get(dtype, dtype)) if isinstance(dtype, str) else None
    if tr is None:
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


class _Panel:
    """An SVG panel with a plot area and linear mappings into it."""

    def __init__(self, x0: float, width: float, right: float = RIGHT):
        self.x0 = x0
        self.left, self.right = x0 + LEFT, x0 + width - right
        self.top, self.bottom = TOP, H - BOTTOM
        self.parts: list[str] = []

    def sx(self, v, lo, hi) -> float:
        return self.left + (v - lo) / ((hi - lo) or 1.0) * (self.right - self.left)

    def sy(self, v, lo, hi) -> float:
        return self.bottom - (v - lo) / ((hi - lo) or 1.0) * (self.bottom - self.top)

    def add(self, text: str) -> None:
        self.parts.append(text)

    def text(self, x, y, s, size=10, anchor="middle", color="#222", rotate=None):
        rot = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
                 f'fill="{color}"{rot} {FONT}>{escape(str(s))}</text>')

    def frame(self, title: str, xlabel: str, ylabel: str) -> None:
        self.add(f'<rect x="{self.left:.1f}" y="{self.top:.1f}" width="{self.right - self.left:.1f}" '
                 f'height="{self.bottom - self.top:.1f}" fill="none" stroke="#333" stroke-width="0.8"/>')
        self.text((self.left + self.right) / 2, TOP - 8, title, size=10)
        self.text((self.left + self.right) / 2, H - 8, xlabel)
        self.text(self.x0 + 13, (self.top + self.bottom) / 2, ylabel, rotate=-90)

    def xtick(self, x, label) -> None:
        self.add(f'<line x1="{x:.1f}" y1="{self.bottom:.1f}" x2="{x:.1f}" y2="{self.bottom + 4:.1f}" '
                 f'stroke="#333" stroke-width="0.8"/>')
        self.text(x, self.bottom + 15, label, size=9)

    def ytick(self, y, label) -> None:
        self.add(f'<line x1="{self.left - 4:.1f}" y1="{y:.1f}" x2="{self.left:.1f}" y2="{y:.1f}" '
                 f'stroke="#333" stroke-width="0.8"/>')
        self.text(self.left - 6, y + 3, label, size=9, anchor="end")

    def legend(self, entries: list[tuple[str, str, bool]]) -> None:
        y = self.top + 12
        for label, color, filled in entries:
            mark = (f'<rect x="{self.left + 6:.1f}" y="{y - 7:.1f}" width="14" height="8" '
                    f'fill="{color}" fill-opacity="0.6"/>' if filled else
                    f'<line x1="{self.left + 6:.1f}" y1="{y - 3:.1f}" x2="{self.left + 20:.1f}" '
                    f'y2="{y - 3:.1f}" stroke="{color}" stroke-width="1.5"/>')
            self.add(mark)
            self.text(self.left + 24, y, label, size=9, anchor="start")
            y += 12


def _symlog(v: float) -> float:
    """matplotlib's symlog with linthresh 1: linear below 1, a decade per unit above."""
    return v if v < 1 else 1.0 + math.log10(v)


def _histogram(p: _Panel, row: dict, data: dict) -> None:
    lo, hi = EDGES[0], EDGES[-1]
    peak = max([1] + list(data["floor"]["counts"]) + list(data["actual"]["counts"]))
    top = _symlog(peak) * 1.08
    for name, color in (("floor", "#9aa5b1"), ("actual", "#d9480f")):
        pts = [(p.sx(lo, lo, hi), p.sy(0, 0, top))]
        for k, c in enumerate(data[name]["counts"]):
            y = p.sy(_symlog(c), 0, top)
            pts += [(p.sx(EDGES[k], lo, hi), y), (p.sx(EDGES[k + 1], lo, hi), y)]
        pts.append((p.sx(hi, lo, hi), p.sy(0, 0, top)))
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        if name == "floor":
            p.add(f'<polygon points="{path}" fill="{color}" fill-opacity="0.6" stroke="{color}" '
                  f'stroke-width="1.2"/>')
        else:
            p.add(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.2"/>')
    for value, label in thresholds(row):
        if value > 0 and lo <= math.log10(value) <= hi:
            x = p.sx(math.log10(value), lo, hi)
            p.add(f'<line x1="{x:.1f}" y1="{p.top:.1f}" x2="{x:.1f}" y2="{p.bottom:.1f}" '
                  f'stroke="#1c7ed6" stroke-dasharray="4,3" stroke-width="1"/>')
            p.text(x - 3, p.top + 50, label, size=8, anchor="start", color="#1c7ed6", rotate=-90)
    for d in range(int(lo), int(hi) + 1, 2):
        p.xtick(p.sx(d, lo, hi), str(d))
    p.ytick(p.sy(0, 0, top), "0")
    decade = 1
    while decade <= peak * 1.08:
        p.ytick(p.sy(_symlog(decade), 0, top), _plain_label(decade))
        decade *= 10 if peak < 1e6 else 100
    a = data["actual"]
    p.frame(f"relative error d/(|g|+1e-7): {a['zero']} exact, {a['under']} below "
            f"1e{lo:.0f}, {a['over']} above 1e{hi:.0f}", "log10 relative error", "elements")
    p.legend([("error floor (golden rounded)", "#9aa5b1", True), ("kernel", "#d9480f", False)])


def _magma(t: float) -> str:
    t = min(max(t, 0.0), 1.0) * (len(MAGMA) - 1)
    i = min(int(t), len(MAGMA) - 2)
    f = t - i
    a, b = MAGMA[i], MAGMA[i + 1]
    rgb = [round(int(a[k:k + 2], 16) * (1 - f) + int(b[k:k + 2], 16) * f) for k in (1, 3, 5)]
    return "#" + "".join(f"{v:02x}" for v in rgb)


def _heatmap(p: _Panel, data: dict) -> None:
    grid = [[max(float(v), 1e-30) if v == v else 1e-30 for v in row] for row in data["grid"]]
    hi = max(max(row) for row in grid)
    lo = min(max(min(min(row) for row in grid), hi * 1e-12, 1e-30), hi / 10)
    span = math.log10(hi / lo) if hi > lo else 1.0
    gr, gc = len(grid), len(grid[0])
    cw, ch = (p.right - p.left) / gc, (p.bottom - p.top) / gr
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            t = math.log10(min(max(v, lo), hi) / lo) / span
            p.add(f'<rect x="{p.left + j * cw:.2f}" y="{p.top + i * ch:.2f}" width="{cw + 0.3:.2f}" '
                  f'height="{ch + 0.3:.2f}" fill="{_magma(t)}"/>')
    bar_x, bar_w = p.right + 10, 10
    steps = 32
    for k in range(steps):
        y = p.bottom - (k + 1) * (p.bottom - p.top) / steps
        p.add(f'<rect x="{bar_x:.1f}" y="{y:.2f}" width="{bar_w}" '
              f'height="{(p.bottom - p.top) / steps + 0.3:.2f}" fill="{_magma((k + 0.5) / steps)}"/>')
    for e in range(math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9) + 1):
        y = p.bottom - (e - math.log10(lo)) / span * (p.bottom - p.top)
        p.text(bar_x + bar_w + 3, y + 3, _plain_label(10.0 ** e), size=8, anchor="start")
    p.text(bar_x + bar_w + 38, (p.top + p.bottom) / 2, f"max {data['measure']}", size=9,
           rotate=-90)
    p.xtick(p.left, "0")
    p.xtick(p.right, str(data["cols"]))
    p.ytick(p.top, "0")
    p.ytick(p.bottom, str(data["rows"]))
    p.frame("where the error sits", "last dim", "rows (leading dims flattened)")


def _steps(p: _Panel, steps: list[dict]) -> None:
    xs = [s["step"] for s in steps]
    series = []
    for key, color in (("max_abs", "#d9480f"), ("rmse", "#1c7ed6"), ("mare", "#2b8a3e")):
        pts = [(s["step"], s[key]) for s in steps
               if isinstance(s.get(key), (int, float)) and s[key] > 0 and math.isfinite(s[key])]
        if pts:
            series.append((key, color, pts))
    values = [math.log10(v) for _, _, pts in series for _, v in pts] or [0.0]
    ylo, yhi = math.floor(min(values)), math.ceil(max(values))
    yhi = yhi if yhi > ylo else ylo + 1
    xlo, xhi = min(xs), max(xs)
    xlo, xhi = (xlo - 0.5, xhi + 0.5) if xhi == xlo else (xlo, xhi)
    for key, color, pts in series:
        line = " ".join(f"{p.sx(x, xlo, xhi):.1f},{p.sy(math.log10(v), ylo, yhi):.1f}"
                        for x, v in pts)
        p.add(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.3"/>')
        for x, v in pts:
            p.add(f'<circle cx="{p.sx(x, xlo, xhi):.1f}" cy="{p.sy(math.log10(v), ylo, yhi):.1f}" '
                  f'r="2.5" fill="{color}"/>')
    for x in xs if len(xs) <= 12 else xs[:: math.ceil(len(xs) / 12)]:
        p.xtick(p.sx(x, xlo, xhi), str(x))
    for e in range(ylo, yhi + 1):
        p.ytick(p.sy(e, ylo, yhi), _plain_label(10.0 ** e))
    p.frame("error per step", "step", "")
    if series:
        p.legend([(key, color, False) for key, color, _ in series])


FIGURE_FIELDS = ("histogram", "heatmap", "step_metrics", "standard", "out_dtype", "rtol")


def figure(row: dict, cache: Path | None = None) -> str | None:
    """The plots of one output as a data: URI of an SVG; None when there is nothing to plot.
    ``cache``: a folder of figures by the hash of what they show, so rebuilding a report
    (``verify report``) renders only what changed."""
    if cache is None:
        return _render(row)
    blob = json.dumps(["svg"] + [row.get(k) for k in FIGURE_FIELDS], sort_keys=True, default=str)
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
    width = sum(WIDTHS[p] for p in panels)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H}" '
             f'viewBox="0 0 {width} {H}"><rect width="{width}" height="{H}" fill="#fff"/>']
    x0 = 0
    for name in panels:
        panel = _Panel(x0, WIDTHS[name], right=70 if name == "heat" else RIGHT)
        if name == "hist":
            _histogram(panel, row, hist)
        elif name == "heat":
            _heatmap(panel, heat)
        else:
            _steps(panel, steps)
        parts += panel.parts
        x0 += WIDTHS[name]
    parts.append("</svg>")
    svg = "".join(parts)
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
