"""``verify.run``: the whole flow in-process, without pytest, returning the rows."""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from . import deadline, golden_source, notices, results, runner, selection


@dataclass
class RunResult:
    rows: list[dict]
    run_dir: Path | None
    warnings: list[str] = field(default_factory=list)  # store degraded, registry away, ...

    @property
    def df(self) -> pd.DataFrame:
        return results.frame(self.rows)

    @property
    def exit_status(self) -> int:
        return results.exit_status(self.rows)

    @property
    def counts(self) -> dict[str, int]:
        return results.counts(self.rows)

    @property
    def mutants(self) -> list[dict]:
        """Per known-bad kernel of the run: op, kernel, caught, failing rows, first."""
        return results.mutant_summary(self.rows)

    def summary(self) -> str:
        return results.summary_text(self.rows, self.run_dir)


@contextlib.contextmanager
def _progress(total: int):
    """A rich progress bar on an interactive stderr; nothing otherwise."""
    if not sys.stderr.isatty():
        yield lambda op: None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("verify", total=total)
        first = [True]

        def advance(op: str) -> None:
            if not first[0]:
                bar.advance(task)
            first[0] = False
            bar.update(task, description=f"verify {op}")

        yield advance


def run(level: str | Sequence[str] | None = "L0", ops: Sequence[str] | None = None,
        backends: Sequence[str] | None = None, dtypes: Sequence[str] | None = None,
        cases: str | None = None, kernels: Sequence[str] = (),
        reports: str | Path | None | bool = None, run_id: str | None = None,
        store: str | None = None, registry: str | None = None,
        registry_required: bool = False, time: int = 0,
        benchmark_backend: str | None = None,
        case_timeout: float | None = None) -> RunResult:
    """Run the selection and return its rows; ``reports=False`` writes no files.
    Goldens come from ``store`` (default VERIFY_STORE or .verify-store), then ``registry``,
    then are computed. ``time=N`` records each kernel's median wall time over N calls.
    ``benchmark_backend``: also judge each kernel against that backend's kernel of the
    op on the same inputs (msprobe's benchmark standard), in rows of their own.
    ``case_timeout``: seconds a case may run before it is an ERROR row (None: the level's
    default, 300 s for L0; 0: no limit). Kernels run in this process: one that ends its
    process ends the run (``verify run`` and the pytest plugin isolate them)."""
    seconds = deadline.check_seconds(case_timeout, "case_timeout")
    repeats = selection.check_count(time, "time")
    run_dir = None if reports is False else results.reserve_run_dir(reports or None, run_id)
    notices.drain()  # warnings of an earlier run in this process are not this run's
    plan = selection.build(selection.Selection(
        level=level, cases_dir=cases, ops=ops, dtypes=dtypes, backends=backends,
        kernel_modules=list(kernels)))
    golden_source.configure(store, registry, registry_required)
    runner.TIMING["repeats"] = repeats
    runner.CASE_LIMIT["seconds"] = seconds
    runner.BENCHMARK["backend"] = selection.check_benchmark_backend(benchmark_backend)
    rows: list[dict] = []
    with _progress(len(plan.items)) as advance:
        for case, kern in plan.items:
            advance(case.op)
            rows.extend(runner.run_case(case, kern))
    warnings = notices.drain()
    if run_dir is not None:
        results.write(rows, run_dir, {"run_id": run_dir.name, "level": level,
                                      "environment": results.environment(),
                                      "warnings": warnings})
    return RunResult(rows, run_dir, warnings)
