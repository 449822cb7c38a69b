"""``verify strategies OP``: every implementation route of an op on the same cases.

For each case x strategy x output: MERE, MARE, max abs error, the error floor, the verdict
under the op's standard and the kernel's median wall time. Then a ranking (cases passed,
then distance to the error floor, then time) and where each strategy passes.
"""
from __future__ import annotations

import math
import statistics

from verify.golden import source as golden_source
from verify.running import context
from verify.specs import registry
from verify.running import runner
from verify.cases import selection
from verify.errors import ConfigError

BACKENDS = ("torch", "strategies")


def label(kern) -> str:
    return f"{kern.name} (default)" if kern.backend == "torch" else kern.name


def run(op: str, level: str = "L0", cases_dir: str | None = None, dtypes=None,
        repeats: int = 5, store: str | None = None) -> tuple[list[dict], dict]:
    """Rows (as a run's) and the comparison (table, ranking, where each passes)."""
    spec = registry.op(op)
    cases = selection.select_cases(selection.Selection(level=level, cases_dir=cases_dir,
                                                       ops=[op], dtypes=dtypes))
    kernels = registry.kernels(spec.name, list(BACKENDS))
    if len(kernels) < 1:
        raise ConfigError(f"op '{spec.name}' has no kernels to compare")
    run_ctx = context.RunContext(resolver=golden_source.configure(store))
    rows, table = [], []
    for case in cases:
        for kern in kernels:
            case_rows = runner.run_case(case, kern, run_ctx)
            seconds = None
            if not case.expect_error and all(r["verdict"] in ("PASS", "FAIL") for r in case_rows):
                seconds = runner.time_kernel(case, kern, repeats)
            for r in case_rows:
                r["median_s"] = seconds
                rows.append(r)
                table.append({"strategy": label(kern), "dtype": case.dtype,
                              "case": f"{case.level}-{case.id}", "output": r.get("output", "-"),
                              "mere": r.get("mere"), "mare": r.get("mare"),
                              "max_abs": r.get("max_abs"), "floor_max_abs": r.get("floor_max_abs"),
                              "verdict": r["verdict"], "standard": r.get("standard", ""),
                              "median_ms": None if seconds is None else seconds * 1e3})
    return rows, {"op": spec.name, "level": level, "table": table,
                  "ranking": ranking(table), "where": where(table)}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def ranking(table: list[dict]) -> list[dict]:
    out = {}
    for t in table:
        e = out.setdefault(t["strategy"], {"strategy": t["strategy"], "pass": 0, "total": 0,
                                           "ratios": [], "times": []})
        e["total"] += 1
        e["pass"] += t["verdict"] == "PASS"
        if _finite(t["max_abs"]) and _finite(t["floor_max_abs"]):
            e["ratios"].append(max(t["max_abs"], 1e-300) / max(t["floor_max_abs"], 1e-300))
        if t["median_ms"] is not None:
            e["times"].append(t["median_ms"])
    ranked = []
    for e in out.values():
        logs = [math.log(max(r, 1.0)) for r in e["ratios"]]
        ranked.append({"strategy": e["strategy"], "passed": f"{e['pass']}/{e['total']}",
                       "pass_share": e["pass"] / e["total"],
                       "max_abs_over_floor": math.exp(sum(logs) / len(logs)) if logs else None,
                       "median_ms": statistics.median(e["times"]) if e["times"] else None})
    ranked.sort(key=lambda e: (-e["pass_share"], e["max_abs_over_floor"] or math.inf,
                               e["median_ms"] or math.inf))
    for i, e in enumerate(ranked, 1):
        e["rank"] = i
    return ranked


def where(table: list[dict]) -> dict:
    """strategy -> dtype -> 'passed/total' (cases x outputs)."""
    out: dict[str, dict[str, list[int]]] = {}
    for t in table:
        cell = out.setdefault(t["strategy"], {}).setdefault(t["dtype"], [0, 0])
        cell[0] += t["verdict"] == "PASS"
        cell[1] += 1
    return {s: {d: f"{p}/{n}" for d, (p, n) in sorted(v.items())} for s, v in out.items()}


def _f(v, ms=False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if ms:
        return f"{v:.3f}"
    return f"{v:.3e}" if isinstance(v, float) else str(v)


def text(comparison: dict, width: int = 180) -> str:
    import io

    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, highlight=False)
    t = Table(title=f"strategies of {comparison['op']} at {comparison['level']}",
              header_style="bold")
    for col in ("strategy", "dtype", "case", "output", "MERE", "MARE", "max abs",
                "floor max abs", "verdict", "median ms"):
        t.add_column(col)
    for r in comparison["table"]:
        t.add_row(r["strategy"], r["dtype"], r["case"], r["output"], _f(r["mere"]),
                  _f(r["mare"]), _f(r["max_abs"]), _f(r["floor_max_abs"]), r["verdict"],
                  _f(r["median_ms"], ms=True))
    console.print(t)
    rk = Table(title="ranking (cases passed, then max abs error over the floor, then time)",
               header_style="bold")
    for col in ("rank", "strategy", "passed", "max abs / floor (geo. mean)", "median ms"):
        rk.add_column(col)
    for e in comparison["ranking"]:
        ratio = e["max_abs_over_floor"]
        rk.add_row(str(e["rank"]), e["strategy"], e["passed"],
                   "-" if ratio is None else f"{ratio:.3g}", _f(e["median_ms"], ms=True))
    console.print(rk)
    dtypes = sorted({d for v in comparison["where"].values() for d in v})
    wt = Table(title="where each strategy passes (outputs passed / run, per dtype)",
               header_style="bold")
    wt.add_column("strategy")
    for d in dtypes:
        wt.add_column(d)
    for s, cells in comparison["where"].items():
        wt.add_row(s, *(cells.get(d, "-") for d in dtypes))
    console.print(wt)
    return buf.getvalue()
