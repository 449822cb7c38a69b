"""Results of a run: rows -> results.csv, results.json, diff tables, terminal summary.

One row per case x backend x kernel x output. The CSV columns are an interface (README);
results.json holds the same rows plus per-step metrics and diff tables.
"""
from __future__ import annotations

import io
import json
import math
import os
import re
import platform
import secrets
import sys
import time
from pathlib import Path

# the row's declaration; results.COLUMNS, results.counts, ... are read from here too
from verify.report.rows import (COLUMNS, FLOOR_COLUMNS, JSON_ONLY, VERDICTS,  # noqa: F401
                                complete_rows, counts, exit_status, mutant_summary,
                                passed_by_other)
from verify.report.rows import kernel_label

def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


RUN_CLAIM = ".verify-run"  # in a run's folder: the run that claimed it (pid, time)


def reserve_run_dir(reports: str | Path | None, run_id: str | None) -> Path:
    """The run's report folder ``<reports>/<run_id>``, made now, before anything runs:
    a run id is a plain folder name (no path, no ``..``); a folder that already holds a
    run is refused (two runs never overwrite each other); ``reports`` must be a folder."""
    from verify.errors import ConfigError
    base = Path(reports if reports else os.environ.get("VERIFY_REPORTS", "reports"))
    if run_id is None:
        run_id = new_run_id()
    elif not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise ConfigError(f"--run-id {run_id!r}: a run id is a folder name of letters, "
                          f"digits and . _ + - (no / and no ..), at most 128 characters")
    if base.exists() and not base.is_dir():
        raise ConfigError(f"--reports {base}: not a folder")
    run_dir = base / run_id
    used = ConfigError(f"{run_dir} already holds a run: choose another --run-id, or delete "
                       f"the folder to replace it")
    try:
        base.mkdir(parents=True, exist_ok=True)
        run_dir.mkdir(exist_ok=True)  # an empty folder (made for the run, say) may be used
        if not run_dir.is_dir():
            raise used
        # The claim: whoever creates the marker (O_EXCL, atomic on every local file system)
        # owns the folder; a second run with the same id, however close in time, does not.
        fd = os.open(run_dir / RUN_CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise used from None
    except OSError as exc:
        raise ConfigError(f"--reports {base}: cannot make the run's folder: {exc}") from None
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} {time.time():.3f}\n")
    if any(p.name != RUN_CLAIM for p in run_dir.iterdir()):  # files of an older run
        (run_dir / RUN_CLAIM).unlink(missing_ok=True)
        raise used
    return run_dir


# pandas and rich are imported where they are used: the xdist workers import this module
# for the run folder's helpers only and should not pay for either at start-up.


def frame(rows: list[dict]):
    import pandas as pd
    df = pd.DataFrame(rows)
    extra = [c for c in df.columns if c not in COLUMNS]
    missing = [c for c in COLUMNS if c not in df.columns]
    # the missing columns (None) in one step: one insert per column fragments the frame,
    # and pandas warned about it on runs with few columns filled
    empty = pd.DataFrame({c: pd.Series([None] * len(df), index=df.index, dtype=object)
                          for c in missing})
    return pd.concat([df, empty], axis=1)[COLUMNS + extra]


def _finite_numbers(v) -> bool:
    """True for a list of finite numbers only (heat-map rows, histogram counts): taken as
    they are, not element by element. A NaN or inf makes the sum non-finite, and anything
    not a number makes it fail."""
    try:
        return math.isfinite(sum(v))
    except (TypeError, OverflowError):
        return False


def _clean(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return list(v) if _finite_numbers(v) else [_clean(x) for x in v]
    return v


def _version(dist: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _device() -> str:
    import torch
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)} (x{torch.cuda.device_count()})"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        model = platform.processor()
    return f"cpu: {model or platform.machine()} ({os.cpu_count()} cores)"


_DISTRIBUTIONS = {"torch_npu": "torch-npu"}  # report name -> package name, where they differ


def versions(names) -> dict[str, str]:
    """Installed versions by report name ('python' is the interpreter's)."""
    return {n: platform.python_version() if n == "python"
            else _version(_DISTRIBUTIONS.get(n, n)) for n in names}


def command_line(argv: list[str] | None = None) -> str:
    """The command as the user typed it: ``verify run ...`` (set by the CLI for itself
    and the processes it starts), ``pytest ...`` or ``python prog.py ...``; never the
    entry point's installed path."""
    import shlex
    if argv is None and os.environ.get("VERIFY_COMMAND"):
        return os.environ["VERIFY_COMMAND"]
    args = list(argv if argv is not None else sys.argv)
    if not args:
        return ""
    first = os.path.basename(args[0])
    if first in ("__main__.py", "pytest", "py.test") or args[0].endswith("pytest/__main__.py"):
        first = "pytest"
    elif first.endswith(".py") and first != "cli.py":
        first = f"python {args[0]}"
    elif first in ("cli.py", "verify"):
        first = "verify"
    return " ".join([first, *map(shlex.quote, args[1:])])


def environment(argv: list[str] | None = None) -> dict:
    """What the report's environment section shows (versions without importing extras)."""
    import subprocess
    env = {"command": command_line(argv),
           "python": platform.python_version(), "platform": platform.platform(),
           **versions(("torch", "triton", "torch_npu", "numpy", "numba", "kernel-verify")),
           "device": _device()}
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                           text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = ""
    env["time"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    from verify.specs import registry
    for name, b in registry.backends().items():
        ok, why = b.available()
        info = {**b.versions(), "device": b.device, "cases run": b.isolation}
        env[f"backend {name}"] = ", ".join(f"{k} {v}" for k, v in info.items()) + (
            f"; {b.note}" if b.note else "") + ("" if ok else f"; unavailable: {why}")
    return env


def write(rows: list[dict], run_dir: str | Path, meta: dict | None = None) -> Path:
    """Write results.json, then every view of it (``write_views``), into ``run_dir``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = {"meta": {**(meta or {}), "counts": counts(rows)},
           "mutants": mutant_summary(rows), "rows": _clean(rows)}
    tmp = run_dir / "results.json.tmp"
    tmp.write_text(json.dumps(doc, separators=(",", ":"), allow_nan=False))
    os.replace(tmp, run_dir / "results.json")
    write_views(rows, run_dir, doc["meta"])
    return run_dir


def load(run_dir: str | Path) -> tuple[list[dict], dict]:
    """Rows and meta of a run's results.json (NaN and inf, written as strings, restored)."""
    path = Path(run_dir) / "results.json"
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        from verify.errors import ConfigError
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except ValueError as exc:
        from verify.errors import ConfigError
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    return [_restore(r) for r in doc.get("rows", [])], doc.get("meta", {})


def _restore(v):
    if v == "nan":
        return math.nan
    if v == "inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    if isinstance(v, dict):
        return {k: _restore(x) for k, x in v.items()}
    if isinstance(v, list):
        return v if _finite_numbers(v) else [_restore(x) for x in v]
    return v


def write_views(rows: list[dict], run_dir: str | Path, meta: dict) -> None:
    """results.csv, diff_tables.txt, junit.xml and report.html, all from the rows."""
    from verify.report import html, junit

    run_dir = Path(run_dir)
    rows = complete_rows(rows)
    df = frame(rows)
    csv_cols = [c for c in df.columns if c not in JSON_ONLY]
    df[csv_cols].to_csv(run_dir / "results.csv", index=False)
    (run_dir / "diff_tables.txt").write_text(diff_tables_text(rows))
    junit.write(rows, run_dir / "junit.xml")
    html.write(rows, meta, run_dir)


def _fmt(v, digits=3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}e}"
    return str(v)


def diff_tables_text(rows: list[dict], limit: int | None = None) -> str:
    parts = []
    for r in rows:
        table = r.get("diff_table")
        if not table:
            continue
        if limit is not None and len(parts) >= limit:
            break
        head = (f"{r['op']} [{r['level']}-{r['case_id']}] {kernel_label(r)} "
                f"output {r['output']} ({r['out_dtype']}): {r['verdict']} - {r['reason']}")
        names = list(table[0]["inputs"]) if table else []
        header = ["index"] + names + ["golden", "actual", "abs_diff", "rel_diff"]
        lines = [head, " | ".join(header)]
        for e in table:
            cells = [str(tuple(e["index"]))]
            cells += [_fmt(e["inputs"].get(n), 6) for n in names]
            cells += [_fmt(e[k], 8) for k in ("golden", "actual")]
            cells += [_fmt(e[k]) for k in ("abs_diff", "rel_diff")]
            lines.append(" | ".join(cells))
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + ("\n" if parts else "")


_STYLE = {"PASS": "green", "FAIL": "bold red", "ERROR": "bold magenta", "SKIP": "dim"}
MAX_LISTED = 60  # non-PASS rows listed in the terminal (all of them are in the reports)


def _cut(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def _aligned(head: list[str], cells: list[list[str]], reasons: list[str], caps: list[int],
             width: int, shrinkable: range) -> list[str]:
    """Columns padded to their widest cell (up to ``caps``), the last column (a reason)
    taking what is left of ``width``; the name columns give way first."""
    widths = [min(cap, max([len(h)] + [len(c[k]) for c in cells]))
              for k, (h, cap) in enumerate(zip(head, caps))]
    used = sum(widths) + 2 * len(widths)
    while used + 40 > width and max(widths[k] for k in shrinkable) > 8:
        k = max(shrinkable, key=lambda j: widths[j])
        widths[k] -= 1
        used -= 1
    rest = max(10, width - used)

    def line(values, reason):  # never wider than the terminal, however narrow
        return _cut(("  ".join(_cut(x, w).ljust(w) for x, w in zip(values, widths)) + "  "
                     + _cut(reason, rest)).rstrip(), width)

    return [line(head[:len(widths)], head[-1])] + [line(c, r) for c, r in zip(cells, reasons)]


def one_line_rows(rows: list[dict], width: int) -> list[str]:
    """Each row on one line of at most ``width`` characters: verdict, op, case, kernel,
    output, MARE, max abs and its floor, then as much of the reason as fits (cut with an
    ellipsis; the full reasons follow the table)."""
    cells = []
    for i, r in enumerate(rows, 1):
        v = r.get("verdict", "")
        cells.append([f"{i}.", v if r.get("expected", "PASS") == "PASS" else f"{v}(exp. FAIL)",
                      r["op"], f"{r['level']}-{r['case_id']}", kernel_label(r),
                      r.get("output") or "-", _fmt(r.get("mare"), 2), _fmt(r.get("max_abs"), 2),
                      _fmt(r.get("floor_max_abs"), 2)])
    head = ["#", "verdict", "op", "case", "kernel", "output", "MARE", "max abs", "floor",
            "why (non-PASS)"]
    return _aligned(head, cells, [r.get("reason") or "" for r in rows],
                    [4, 16, 28, 36, 28, 24, 9, 9, 9], width, range(2, 6))


def _per_kernel_table(rows: list[dict]):
    """One line per op and kernel: how many cases and rows, and their verdicts."""
    from rich.table import Table
    groups: dict[tuple, dict] = {}
    for r in rows:
        g = groups.setdefault((r["op"], kernel_label(r)), {
            "cases": set(), "expected": r.get("expected", "PASS"),
            **{v: 0 for v in VERDICTS}})
        g["cases"].add((r["level"], r["case_id"]))
        g[r.get("verdict", "ERROR")] = g.get(r.get("verdict", "ERROR"), 0) + 1
    table = Table(title="verdicts per op and kernel", header_style="bold")
    for col in ("op", "kernel", "cases", "PASS", "FAIL", "ERROR", "SKIP", "verdict"):
        table.add_column(col, justify="right" if col in VERDICTS or col == "cases" else "left")
    for (op, kern), g in sorted(groups.items()):
        if g["expected"] == "FAIL":
            verdict = "[green]caught[/]" if g["FAIL"] else "[bold red]MISSED[/]"
        elif g["ERROR"]:
            verdict = "[bold magenta]ERROR[/]"
        elif g["FAIL"]:
            verdict = "[bold red]FAIL[/]"
        elif g["PASS"]:
            verdict = "[green]PASS[/]"
        else:
            verdict = "[dim]SKIP[/]"
        table.add_row(op, kern, str(len(g["cases"])),
                      *(str(g[v]) if g[v] else "" for v in VERDICTS), verdict)
    return table


def _details(rows: list[dict]) -> list[str]:
    """The full reason of each listed row, numbered like the table's lines."""
    return [f"  {i}. {r['op']} {r['level']}-{r['case_id']} {kernel_label(r)} "
            f"{r.get('output') or '-'}: {r.get('verdict')} - {r.get('reason') or ''}"
            for i, r in enumerate(rows, 1)]


def passed_by_lines(rows: list[dict], width: int) -> list[str]:
    """One line per row that passed only by a variant or the compute-precision floor:
    the exact golden's max abs beside the other golden's, and the exact golden's verdict."""
    cells, reasons = [], []
    for r in rows:
        by = r["passed_by"]
        other = r.get("variant_max_abs") if by == "variant" else r.get("cfloor_max_abs")
        exact = (r.get("reason") or "").split("exact golden: ", 1)[-1] if by == "cfloor" \
            else (r.get("warning") or "").split("against the exact golden ", 1)[-1]
        cells.append([r["op"], f"{r['level']}-{r['case_id']}", kernel_label(r),
                      r.get("output") or "-", "variant" if by == "variant" else "cfloor",
                      _fmt(r.get("max_abs"), 2), _fmt(other, 2)])
        reasons.append(exact.split(" | ")[0])
    head = ["op", "case", "kernel", "output", "by", "max abs", "its max abs",
            "exact golden's verdict: FAIL, because"]
    return _aligned(head, cells, reasons, [28, 36, 28, 24, 7, 9, 11], width, range(0, 4))


def _warning_kind(text: str) -> str:
    return text.split(":", 1)[0].strip()


def _grouped_warnings(rows: list[dict]) -> list[str]:
    """Each kind of warning once per kernel: how many outputs, where, and one in full."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        for w in filter(None, (r.get("warning") or "").split(" | ")):
            groups.setdefault((kernel_label(r), _warning_kind(w)), []).append({**r, "_w": w})
    lines = []
    for (kern, kind), items in sorted(groups.items()):
        where = ", ".join(f"{i['op']} {i['case_id']} {i['output']}" for i in items[:3])
        more = f" and {len(items) - 3} more" if len(items) > 3 else ""
        lines.append(f"[yellow]warning[/] kernel {kern}: {kind} on {len(items)} output(s) "
                     f"({where}{more}); e.g. {items[0]['_w']}")
    return lines


def _skip_lines(rows: list[dict]) -> list[str]:
    groups: dict[tuple, int] = {}
    for r in rows:
        if r.get("verdict") == "SKIP":
            key = (r["backend"], r.get("reason") or "")
            groups[key] = groups.get(key, 0) + 1
    return [f"[dim]SKIP[/] {n} row(s) of backend {b}: {why}" for (b, why), n in sorted(groups.items())]


def recorded_lines(meta: dict | None) -> list[str]:
    """What a judged dump held: records read, cases judged, and every record not judged,
    by call name with its count and why (results.json "recorded")."""
    if not meta:
        return []
    calls = meta.get("calls", 0)
    lines = [f"recorded calls: {meta.get('records', 0)} records read; {meta.get('cases', 0)} "
             f"cases judged ({calls} calls: identical inputs are judged once)"]
    missed = meta.get("not_judged") or []
    if missed:
        lines.append(f"not judged ({sum(e['count'] for e in missed)} records):")
        lines += [f"  {e['api']} x{e['count']} ({e['reason']})" for e in missed]
    return lines


def summary_text(rows: list[dict], run_dir: str | Path | None = None, width: int = 160,
                 color: bool = False, verbose: bool = False,
                 recorded: dict | None = None) -> str:
    """The terminal summary, verdict first: a line per op and kernel, the rows that did
    not go as expected (SKIPs grouped by reason), warnings grouped per kernel, mutants,
    what a judged dump did not judge (``recorded``), totals. ``verbose``: every row too."""
    from rich.console import Console
    from rich.table import Table
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, no_color=not color,
                      highlight=False)
    console.print(_per_kernel_table(rows))
    if verbose:  # every row, one line each, then the full reasons of those not passing
        console.print("precision verdicts (every row):", soft_wrap=True, markup=False)
        for text in one_line_rows(rows, width):
            console.print(text, soft_wrap=True, markup=False, highlight=False)
        bad = [r for r in rows if r.get("verdict") in ("FAIL", "ERROR")]
        if bad:
            console.print("why, in full (rows not passing):", soft_wrap=True)
            for line in _details(bad):
                console.print(line, soft_wrap=True, markup=False)
    else:
        bad = [r for r in rows if r.get("verdict") == "ERROR" or (
            r.get("verdict") == "FAIL" and r.get("expected", "PASS") == "PASS")]
        if bad:
            shown = bad[:MAX_LISTED]
            more = f" (first {MAX_LISTED} of {len(bad)}; all in results.csv)" \
                if len(bad) > MAX_LISTED else ""
            console.print(f"rows that did not pass{more}:", soft_wrap=True, markup=False)
            for text in one_line_rows(shown, width):
                console.print(text, soft_wrap=True, markup=False, highlight=False)
            console.print("why, in full:", soft_wrap=True)
            for line in _details(shown):
                console.print(line, soft_wrap=True, markup=False)
    other = [r for r in rows if passed_by_other(r)]
    if other:
        console.print(f"passed only by a variant or the compute-precision floor "
                      f"({len(other)} rows; the metric columns are the exact golden's):",
                      soft_wrap=True, markup=False)
        for text in passed_by_lines(other[:MAX_LISTED], width):
            console.print(text, soft_wrap=True, markup=False, highlight=False)
    for line in _skip_lines(rows) + _grouped_warnings(rows):
        console.print(line)
    for line in recorded_lines(recorded):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    mutants = mutant_summary(rows)
    if mutants:
        mt = Table(title="known-bad kernels (mutants)", header_style="bold")
        for col in ("op", "mutant", "caught", "failing outputs", "first failure"):
            mt.add_column(col, overflow="fold")
        for m in mutants:
            mt.add_row(m["op"], m["kernel"],
                       "[green]caught[/]" if m["caught"] else "[bold red]MISSED[/]",
                       str(m["failing"]), m["first"])
        console.print(mt)
    c = counts(rows)
    line = ", ".join(f"{k} {c[k]}" for k in VERDICTS)
    if mutants:
        caught = sum(m["caught"] for m in mutants)
        line += f"; mutants caught {caught}/{len(mutants)}"
    sources: dict[str, set] = {}
    for r in rows:
        if r.get("golden_source"):
            sources.setdefault(r["golden_source"], set()).add((r["op"], r["case_id"]))
    if sources:
        line += "; goldens " + ", ".join(f"{len(v)} {k}" for k, v in sorted(sources.items()))
    if run_dir is not None:
        line += f"; reports in {run_dir}"
    console.print(line)
    return buf.getvalue()
