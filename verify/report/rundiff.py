"""Compare two runs case by case: new FAILs, fixed cases, metrics that got worse by more
than a factor, mutants no longer caught. Anything regressed makes ``verify diff`` exit 1.

A metric counts as worse when run B's value exceeds ``factor`` times run A's, where A's
value is first raised to B's error floor: a kernel moving from 0 to a rounding-level error
has not regressed, one moving from the floor to 3x the floor has.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from verify.report.results import load
from verify.report.rows import mutant_summary
from verify.report.html import fmt, kernel_label, num

KEY = ("op", "level", "case_id", "backend", "kernel", "output")
WATCHED = ("mere", "mare", "max_abs", "rmse", "ulp_mean")
BAD = ("FAIL", "ERROR")


@dataclass
class RunDiff:
    run_a: str
    run_b: str
    factor: float
    new_failures: list = field(default_factory=list)
    fixed: list = field(default_factory=list)
    still_failing: list = field(default_factory=list)
    worse: list = field(default_factory=list)
    better: list = field(default_factory=list)
    missed_mutants: list = field(default_factory=list)
    only_a: list = field(default_factory=list)
    only_b: list = field(default_factory=list)
    compared: int = 0

    @property
    def regressed(self) -> bool:
        return bool(self.new_failures or self.worse or self.missed_mutants)


def _key(r: dict) -> tuple:
    return tuple(r.get(k) for k in KEY)


def _label(r: dict) -> str:
    return f"{r['op']} {r['level']}-{r['case_id']} {kernel_label(r)} {r.get('output', '-')}"


def compare_rows(rows_a: list[dict], rows_b: list[dict], factor: float = 2.0,
                 run_a: str = "A", run_b: str = "B") -> RunDiff:
    diff = RunDiff(run_a, run_b, factor)
    a_by = {_key(r): r for r in rows_a}
    b_by = {_key(r): r for r in rows_b}
    diff.only_a = [_label(a_by[k]) for k in a_by if k not in b_by]
    diff.only_b = [_label(b_by[k]) for k in b_by if k not in a_by]
    for k, b in b_by.items():
        a = a_by.get(k)
        if a is None:
            continue
        diff.compared += 1
        item = {"label": _label(b), "a": a["verdict"], "b": b["verdict"],
                "reason": b.get("reason", "")}
        if b.get("expected", "PASS") == "PASS":
            if a["verdict"] not in BAD and b["verdict"] in BAD:
                diff.new_failures.append(item)
            elif a["verdict"] in BAD and b["verdict"] not in BAD:
                diff.fixed.append(item)
            elif a["verdict"] in BAD and b["verdict"] in BAD:
                diff.still_failing.append(item)
        for metric in WATCHED:
            va, vb = num(a.get(metric)), num(b.get(metric))
            if va is None or vb is None:
                continue
            base = max(va, num(b.get(f"floor_{metric}")) or 0.0)
            if vb > factor * base and vb > 0:
                ratio = vb / base if base > 0 else math.inf
                diff.worse.append({"label": _label(b), "metric": metric, "a": fmt(va),
                                   "b": fmt(vb), "ratio": fmt(ratio), "verdict": b["verdict"]})
            elif va > factor * max(vb, num(a.get(f"floor_{metric}")) or 0.0) and va > 0:
                diff.better.append({"label": _label(b), "metric": metric, "a": fmt(va),
                                    "b": fmt(vb)})
    caught_a = {(m["op"], m["kernel"]): m["caught"] for m in mutant_summary(rows_a)}
    for m in mutant_summary(rows_b):
        if caught_a.get((m["op"], m["kernel"])) and not m["caught"]:
            diff.missed_mutants.append(f"{m['op']} {m['kernel']}")
    return diff


def compare_runs(dir_a: str | Path, dir_b: str | Path, factor: float = 2.0) -> RunDiff:
    rows_a, _ = load(dir_a)
    rows_b, _ = load(dir_b)
    return compare_rows(rows_a, rows_b, factor, Path(dir_a).name, Path(dir_b).name)


def summary_line(d: RunDiff) -> str:
    return (f"{d.compared} outputs compared: {len(d.new_failures)} new failures, "
            f"{len(d.fixed)} fixed, {len(d.still_failing)} still failing, {len(d.worse)} "
            f"metrics worse by more than {d.factor:g}x, {len(d.better)} better, "
            f"{len(d.missed_mutants)} mutants no longer caught; {len(d.only_a)} only in "
            f"{d.run_a}, {len(d.only_b)} only in {d.run_b}"
            + ("; REGRESSED" if d.regressed else "; no regression"))


def terminal(d: RunDiff, width: int = 160) -> str:
    import io

    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, highlight=False)
    sections = (("new failures", d.new_failures, ("label", "a", "b", "reason")),
                ("fixed", d.fixed, ("label", "a", "b")),
                (f"metrics worse by more than {d.factor:g}x", d.worse,
                 ("label", "metric", "a", "b", "ratio", "verdict")))
    for title, items, cols in sections:
        if not items:
            continue
        table = Table(title=f"{title} ({d.run_a} -> {d.run_b})", header_style="bold")
        for c in cols:
            table.add_column({"a": d.run_a, "b": d.run_b}.get(c, c), overflow="fold")
        for it in items:
            table.add_row(*(str(it[c]) for c in cols))
        console.print(table)
    for name in d.missed_mutants:
        console.print(f"mutant no longer caught: {name}")
    console.print(summary_line(d))
    return buf.getvalue()


_ENV = Environment(loader=PackageLoader("verify.report", "templates"),
                   autoescape=select_autoescape(["html", "j2"]))


def write_html(d: RunDiff, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(_ENV.get_template("diff.html.j2").render(d=d, summary=summary_line(d)),
                    encoding="utf-8")
    return path
