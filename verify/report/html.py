"""The HTML report: one self-contained file (inline CSS, JS and SVG; no network).

Summary counts and an op x level x dtype matrix; a sortable, filterable table of every
row with its metrics and their error floors; details (diff table, error histogram with
the standard's thresholds, heat map, error per step) for the failing outputs and the
worst-ranked passing ones, capped so large runs stay small; the run's environment.
"""
from __future__ import annotations

import math
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from verify.report.rows import (VERDICTS, complete_rows, counts, kernel_label,  # noqa: F401
                                mutant_summary, passed_by_other)
from verify.report import plots

MAX_FAILING_DETAILS = 24
MAX_WORST_PASSING = 8
METRICS = (("margin", "margin"), ("mere", "MERE"), ("mare", "MARE"), ("max_abs", "max abs"),
           ("max_rel", "max rel"), ("rmse", "RMSE"), ("eb", "EB"), ("ulp_max", "ULP max"))
_ENV = Environment(loader=PackageLoader("verify.report", "templates"),
                   autoescape=select_autoescape(["html", "j2"]), trim_blocks=True,
                   lstrip_blocks=True)


def num(v) -> float | None:
    """A metric as a float (results.json writes inf as 'inf' and NaN as null)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return None if isinstance(v, float) and math.isnan(v) else float(v)
    if v in ("inf", "-inf", "nan"):
        return None if v == "nan" else float(v)
    try:
        return float(v)
    except Exception:  # anything that is not a number (a missing field, text) shows as "-"
        return None


def fmt(v) -> str:
    if v == "nan" or (isinstance(v, float) and math.isnan(v)):
        return "nan"
    x = num(v)
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.3e}"


_ENV.filters["fmt"] = fmt


def _worst(verdicts: set[str]) -> str:
    """A cell's colour: the worst verdict that was reached; SKIP (nothing ran) only when
    nothing else is there, and it is never a failure colour."""
    for v in ("ERROR", "FAIL", "PASS", "SKIP"):
        if v in verdicts:
            return v
    return "SKIP"


def matrix(rows: list[dict]) -> dict:
    """op x (level, dtype) of the correct kernels' rows: worst verdict and pass counts."""
    own = [r for r in rows if r.get("expected", "PASS") == "PASS"]
    cols = sorted({(r["level"], r["dtype"]) for r in own})
    ops = sorted({r["op"] for r in own})
    cells = {}
    for r in own:
        c = cells.setdefault((r["op"], r["level"], r["dtype"]), {"verdicts": set(), "pass": 0, "n": 0})
        c["verdicts"].add(r["verdict"])
        c["n"] += 1
        c["pass"] += r["verdict"] == "PASS"
    table = []
    for op in ops:
        line = []
        for level, dtype in cols:
            c = cells.get((op, level, dtype))
            line.append(None if c is None else {"verdict": _worst(c["verdicts"]),
                                                "text": f"{c['pass']}/{c['n']}"})
        table.append({"op": op, "cells": line})
    return {"cols": cols, "rows": table}


def _margin_key(r: dict) -> float:
    m = num(r.get("margin"))
    return -1.0 if m is None else m


def pick_details(rows: list[dict]) -> list[int]:
    """Indexes of the rows shown in detail: failing first (worst margin first), then the
    worst-ranked passing ones; capped."""
    idx = list(range(len(rows)))
    failing = [i for i in idx if rows[i]["verdict"] == "FAIL"]
    failing.sort(key=lambda i: (rows[i].get("expected") != "PASS", -_margin_key(rows[i])))
    passing = [i for i in idx if rows[i]["verdict"] == "PASS" and num(rows[i].get("margin")) is not None]
    passing.sort(key=lambda i: -_margin_key(rows[i]))
    return failing[:MAX_FAILING_DETAILS] + passing[:MAX_WORST_PASSING]


def _table_rows(rows: list[dict], detail_ids: dict[int, str]) -> list[dict]:
    out = []
    for i, r in enumerate(rows):
        metrics = []
        for key, _ in METRICS:
            floor_key = "floor_margin" if key == "margin" else f"floor_{key}"
            metrics.append({"v": num(r.get(key)), "text": fmt(r.get(key)),
                            "floor": fmt(r.get(floor_key)) if floor_key in r else ""})
        out.append({"i": i, "r": r, "kernel": kernel_label(r), "metrics": metrics,
                    "detail": detail_ids.get(i)})
    return out


FIGURE_CACHE = ".figures"  # in the run's folder: figures by the hash of their data


def _detail(i: int, r: dict, cache: Path | None = None) -> dict:
    table = r.get("diff_table") or []
    names = list(table[0]["inputs"]) if table else []
    return {"id": f"detail-{i}", "r": r, "kernel": kernel_label(r), "input_names": names,
            "diff": [{"index": "(" + ", ".join(str(x) for x in e["index"]) + ")",
                      "inputs": [fmt(e["inputs"].get(n)) for n in names],
                      "golden": fmt(e.get("golden")), "actual": fmt(e.get("actual")),
                      "abs": fmt(e.get("abs_diff")), "rel": fmt(e.get("rel_diff"))}
                     for e in table],
            "figure": plots.figure(r, cache)}


_ORDER = {"ERROR": 0, "FAIL": 1, "PASS": 2, "SKIP": 3}


def failing_first(rows: list[dict]) -> list[dict]:
    """The correct kernels' ERROR and FAIL rows first, worst margin first; then the
    mutants' rows, then the passes; the run's order within each group."""
    def key(ir):
        i, r = ir
        bad = r["verdict"] in ("ERROR", "FAIL")
        return (r.get("expected", "PASS") != "PASS", _ORDER.get(r["verdict"], 4),
                -_margin_key(r) if bad else 0.0, i)
    return [r for _, r in sorted(enumerate(rows), key=key)]


def per_kernel(rows: list[dict]) -> list[dict]:
    """One line per op and kernel: cases, verdict counts, the worst margin, and the
    index of its first failing row in the (failing-first) table."""
    out: dict[tuple, dict] = {}
    for i, r in enumerate(rows):
        e = out.setdefault((r["op"], kernel_label(r)), {
            "op": r["op"], "kernel": kernel_label(r), "cases": set(), "first_bad": None,
            "worst": None, "mutant": r.get("expected") == "FAIL", **dict.fromkeys(VERDICTS, 0)})
        e["cases"].add((r["level"], r["case_id"]))
        e[r["verdict"]] = e.get(r["verdict"], 0) + 1
        m = num(r.get("margin"))
        if m is not None and r["verdict"] in ("PASS", "FAIL"):
            e["worst"] = m if e["worst"] is None else max(e["worst"], m)
        if r["verdict"] in ("FAIL", "ERROR") and e["first_bad"] is None:
            e["first_bad"] = i
    lines = []
    for e in out.values():
        e["cases"] = len(e["cases"])
        if e["mutant"]:
            e["verdict"] = "caught" if e["FAIL"] else "MISSED"
        else:
            e["verdict"] = next((v for v in ("ERROR", "FAIL", "PASS") if e[v]), "SKIP")
        lines.append(e)
    return sorted(lines, key=lambda e: (e["mutant"], e["verdict"] not in ("ERROR", "FAIL"),
                                        e["op"], e["kernel"]))


def render(rows: list[dict], meta: dict, cache: Path | None = None) -> str:
    rows = failing_first(complete_rows(rows))
    picked = pick_details(rows)
    detail_ids = {i: f"detail-{i}" for i in picked}
    mutants = mutant_summary(rows)
    return _ENV.get_template("report.html.j2").render(
        meta=meta, counts=counts(rows), verdicts=VERDICTS, matrix=matrix(rows),
        metrics=METRICS, rows=_table_rows(rows, detail_ids),
        details=[_detail(i, rows[i], cache) for i in picked], mutants=mutants,
        n_failing=sum(1 for r in rows if r["verdict"] == "FAIL"),
        kernels=per_kernel(rows),
        passed_by=[{"i": i, "r": r, "kernel": kernel_label(r)} for i, r in enumerate(rows)
                   if passed_by_other(r)],
        caps=(MAX_FAILING_DETAILS, MAX_WORST_PASSING),
        environment=meta.get("environment", {}))


def write(rows: list[dict], meta: dict, run_dir: str | Path) -> Path:
    path = Path(run_dir) / "report.html"
    path.write_text(render(rows, meta, Path(run_dir) / FIGURE_CACHE), encoding="utf-8")
    return path
