"""The result row: one declaration of its fields, their types, and which are CSV
columns (in the order users rely on) and which only results.json holds. Every producer
(the runner, the Ray driver, the plugin, merge) builds rows through ``make``, and every
reader (results.csv / json, the summary, HTML, JUnit, ``verify report``) takes the
column list from here. A row is a plain dict keyed by these names; ``make`` refuses a
name that is not declared, so a misspelt column is an error, not a silent new one."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verify.comparator.metric_fields import Metrics


@dataclass(frozen=True)
class Field:
    name: str
    type: type
    csv: bool = True  # a results.csv column; False: results.json only


def _f(names, kind, csv=True) -> list[Field]:
    return [Field(n, kind, csv) for n in names]


_METRIC_TYPES = {f: (int if f in ("n", "nan_inf_mismatch", "small_count", "allclose_mismatch",
                                  "argmax_abs", "argmax_rel") else float)
                 for f in Metrics.names()}
FLOOR_METRICS = ("mere", "mare", "max_abs", "max_rel", "rmse", "eb", "ulp_max", "ulp_mean")
MS_METRICS = ("small_value_err_ratio", "rmse", "max_rel_err", "mean_rel_err", "eb")

# CSV order is an interface (README "Results"): new columns are appended, never inserted
FIELDS: tuple[Field, ...] = tuple(
    _f(["op", "case_id", "level", "backend", "kernel", "device", "dtype", "output",
        "out_dtype", "shape"], str)
    + _f(["steps"], int)
    + _f(["verdict", "expected", "standard", "reason", "warning"], str)
    + _f(["margin", "floor_margin"], float)
    + [Field(m, _METRIC_TYPES[m]) for m in Metrics.names()]
    + _f([f"floor_{k}" for k in FLOOR_METRICS], float)
    + _f(["golden_source"], str)
    + _f(["golden_s", "kernel_s", "kernel_median_s", "aicore_time_us"], float)
    + _f(["seed"], int) + _f(["params", "tags", "inputs_sha", "file"], str)
    # backward verification
    + _f(["mode"], str) + _f(["reduction_n"], int) + _f(["tol_scale", "backward_s"], float)
    # legitimate variants: the golden a row passed against
    + _f(["golden_variant"], str)
    # msprobe's benchmark standard: the benchmark kernel, msprobe's metrics of this kernel
    # and of the benchmark, and their ratios
    + _f(["benchmark"], str)
    + _f([f"{p}_{m}" for p in ("ms", "bench", "ratio") for m in MS_METRICS], float)
    # where a row ran (an xdist worker, or ray:<ip>:<node>:<devices>) and, under --ray,
    # how many times its case was submitted
    + _f(["worker"], str) + _f(["attempts"], int)
    # how a row that failed against the exact golden passed: 'variant' or 'cfloor', with
    # that golden's figures; the metric columns stay the exact golden's
    + _f(["passed_by", "compute_dtype"], str)
    + _f([f"cfloor_{k}" for k in ("mere", "mare", "max_abs", "max_rel", "rmse", "ulp_max",
                                  "margin", "ratio")], float)
    + _f([f"variant_{k}" for k in ("mere", "mare", "max_abs", "max_rel", "rmse",
                                   "v2_match_ratio", "margin")], float)
    # a recorded call (verify judge, a replay): its record, where it ran, how many
    # identical calls it stands for
    + _f(["record"], str) + _f(["step", "rank"], int) + _f(["module"], str)
    + _f(["calls"], int) + _f(["recorded_device"], str)
    # verify strategies: the kernel's median time over its timed calls
    + _f(["median_s"], float)
    # results.json only
    + _f(["step_metrics", "diff_table", "histogram", "heatmap"], object, csv=False)
)
TYPES: dict[str, type] = {f.name: f.type for f in FIELDS}
COLUMNS: list[str] = [f.name for f in FIELDS if f.csv]
JSON_ONLY: tuple[str, ...] = tuple(f.name for f in FIELDS if not f.csv)
FLOOR_COLUMNS = [f"floor_{k}" for k in FLOOR_METRICS]
VERDICTS = ("PASS", "FAIL", "ERROR", "SKIP")


def make(base: dict | None = None, **values: Any) -> dict:
    """A row: ``base`` updated with ``values``, whose names must be declared above (a
    base may carry the figures a kernel noted, ``runner.note``: columns of its own)."""
    row = dict(base or {})
    row.update(values)
    unknown = [k for k in values if k not in TYPES]
    if unknown:
        raise KeyError(f"result row fields {unknown} are not declared in "
                       f"verify/report/rows.py FIELDS")
    return row


def undeclared(row: dict) -> list[str]:
    return [k for k in row if k not in TYPES]


def complete_rows(rows: list[dict]) -> list[dict]:
    """Rows with every column present (None where a row kind has no value: an ERROR or
    SKIP row has no metrics, an expect_error row no margin), so no view breaks on one."""
    return [{**dict.fromkeys(COLUMNS), "output": "-", **r} for r in rows]


def counts(rows: list[dict]) -> dict[str, int]:
    return {v: sum(1 for r in rows if r.get("verdict") == v) for v in VERDICTS}


def mutant_summary(rows: list[dict]) -> list[dict]:
    """Per known-bad kernel: caught when at least one of its outputs FAILed."""
    out: dict[tuple, dict] = {}
    for r in rows:
        if r.get("expected") != "FAIL":
            continue
        key = (r["op"], r["backend"], r["kernel"])
        entry = out.setdefault(key, {"op": r["op"], "backend": r["backend"],
                                     "kernel": r["kernel"], "failing": 0, "cases": set(),
                                     "errors": 0, "first": ""})
        entry["cases"].add(r["case_id"])
        if r["verdict"] == "FAIL":
            entry["failing"] += 1
            entry["first"] = entry["first"] or f"{r['case_id']} {r['output']}: {r['reason']}"
        elif r["verdict"] == "ERROR":
            entry["errors"] += 1
    result = []
    for e in out.values():
        e["cases"] = len(e["cases"])
        e["caught"] = e["failing"] > 0
        result.append(e)
    return sorted(result, key=lambda e: (e["op"], e["kernel"]))


def exit_status(rows: list[dict]) -> int:
    """0 all as expected, 1 any FAIL / ERROR of a correct kernel, any ERROR or a missed
    mutant among known-bad kernels."""
    for r in rows:
        if r.get("verdict") == "ERROR":
            return 1
        if r.get("expected", "PASS") == "PASS" and r.get("verdict") == "FAIL":
            return 1
    if any(not m["caught"] for m in mutant_summary(rows)):
        return 1
    return 0


def passed_by_other(row: dict) -> bool:
    """A row that FAILed against the exact golden and PASSed only by a declared variant or
    the compute-precision floor: a group of its own, never mixed with clean passes."""
    return row.get("verdict") == "PASS" and bool(row.get("passed_by"))


def kernel_label(r: dict) -> str:
    """How a row names its kernel: the backend alone when the kernel is the op's own,
    a recorded kernel as it names itself (recorded:npu), else backend:kernel."""
    if r["kernel"] == r["op"]:
        return r["backend"]
    if str(r["kernel"]).startswith(f"{r['backend']}:"):  # recorded:npu names itself
        return r["kernel"]
    return f"{r['backend']}:{r['kernel']}"
