"""``verify.run``: the whole flow in-process, without pytest, returning the rows."""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import time as clock
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from verify.running import deadline
from verify.running import runner
from verify.golden import source as golden_source
from verify import notices
from verify.cases import recorded
from verify.cases import selection
from verify.cases import shards
from verify.report import results
from verify.golden.store import close_all as close_store_connections
from verify.running.context import RunContext
from verify.running.ray_tasks import NodeContext
from verify.errors import ConfigError


@dataclass
class RunResult:
    rows: list[dict]
    run_dir: Path | None
    warnings: list[str] = field(default_factory=list)  # store degraded, registry away, ...
    recorded: dict | None = None  # a judged dump's records read and those not judged

    @property
    def not_judged(self) -> list[dict]:
        """Records of a judged dump or capture that were not judged: api, count, reason."""
        return list((self.recorded or {}).get("not_judged") or [])

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
        return results.summary_text(self.rows, self.run_dir, recorded=self.recorded)


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


def _own_warnings(fn):
    """The run keeps its warnings apart from any other run in this process (notices)."""
    @functools.wraps(fn)
    def in_its_own(*args, **kwargs):
        with notices.collecting():
            return fn(*args, **kwargs)
    return in_its_own


@_own_warnings
def run(level: str | Sequence[str] | None = "L0", ops: Sequence[str] | None = None,
        backends: Sequence[str] | None = None, dtypes: Sequence[str] | None = None,
        cases: str | None = None, kernels: Sequence[str] = (),
        reports: str | Path | None | bool = None, run_id: str | None = None,
        store: str | None = None, registry: str | None = None,
        registry_required: bool = False, time: int = 0,
        benchmark_backend: str | None = None,
        case_timeout: float | None = None, ray: str | None = None, retries: int = 1,
        shard: str | None = None, progress_every: float = 10.0,
        verify_fetched: float | None = None) -> RunResult:
    """Run the selection and return its rows; ``reports=False`` writes no files.
    Goldens come from ``store`` (default VERIFY_STORE or .verify-store), then ``registry``,
    then are computed. ``time=N`` records each kernel's median wall time over N calls.
    ``benchmark_backend``: also judge each kernel against that backend's kernel of the
    op on the same inputs (msprobe's benchmark standard), in rows of their own.
    ``case_timeout``: seconds a case may run before it is an ERROR row (None: the level's
    default, 300 s for L0; 0: no limit). Kernels run in this process: one that ends its
    process ends the run (``verify run`` and the pytest plugin isolate them).
    ``ray``: run on a Ray cluster instead (``auto``, ``HOST:PORT``, ``local``,
    ``'local:NPU=4'``; needs kernel-verify[ray]): goldens and cases are tasks, each case in
    a process of its own; a lost node's cases are resubmitted up to ``retries`` times.
    ``shard='I/N'``: only shard I of N of the selection (``verify merge`` joins them).
    ``verify_fetched``: the share of goldens fetched from the registry that are recomputed
    and compared (default 0.1, and always the first of each op and dtype; 0: off)."""
    seconds = deadline.check_seconds(case_timeout, "case_timeout")
    repeats = selection.check_count(time, "time")
    retries = selection.check_count(retries, "retries", most=100)
    if ray is not None:
        from verify.running import ray_run
        ray_run.prepare(ray)  # a bad spec or a missing extra: a usage error before anything
    run_dir = None if reports is False else results.reserve_run_dir(reports or None, run_id)
    plan = selection.build(selection.Selection(
        level=level, cases_dir=cases, ops=ops, dtypes=dtypes, backends=backends,
        kernel_modules=list(kernels)))
    plan.items, selection_id, shard = shards.take(plan.items, shard)
    selection.check_environment()
    selection.check_registry_url(registry)
    if verify_fetched is not None and not 0.0 <= float(verify_fetched) <= 1.0:
        raise ConfigError(f"verify_fetched must be a fraction from 0 to 1, not "
                          f"{verify_fetched!r}")
    # the run's settings, passed to every case: nothing of them is left in a module
    run_ctx = RunContext(
        resolver=golden_source.configure(store, registry, registry_required, verify_fetched),
        case_timeout=seconds, time_repeats=repeats,
        benchmark_backend=selection.check_benchmark_backend(benchmark_backend))
    run_ctx.resolver.designate(c for c, _ in plan.items)
    t0 = clock.time()
    meta: dict = {}
    node_lines: dict = {}
    if ray is not None:
        ctx = NodeContext(
            cwd=os.getcwd(), kernel_modules=list(kernels),
            backends=list(dict.fromkeys(plan.backends + ([benchmark_backend]
                                                         if benchmark_backend else []))),
            store=os.path.abspath(store) if store else None,
            registry=registry or os.environ.get("VERIFY_REGISTRY") or None,
            registry_required=registry_required, verify_fetched=verify_fetched,
            case_timeout=seconds,
            time_repeats=repeats, benchmark_backend=benchmark_backend)
        outcome = ray_run.execute(plan.items, ray_run.Options(
            ray, ctx, retries=retries, progress_every=progress_every))
        rows, warnings = outcome.rows, outcome.warnings
        meta["ray"] = outcome.info
        node_lines = ray_run.node_lines(outcome.nodes)
    else:
        rows, warnings = [], []
        with _progress(len(plan.items)) as advance:
            for case, kern in plan.items:
                advance(case.op)
                rows.extend(runner.run_case(case, kern, run_ctx))
    close_store_connections()  # the index's write-ahead log folded in: readers see every golden
    warnings = list(dict.fromkeys(warnings + notices.drain()))
    if run_dir is not None:
        results.write(rows, run_dir, {
            "run_id": run_dir.name, "level": level,
            "environment": {**results.environment(), **node_lines}, "warnings": warnings,
            "timing": {"configured": t0, "reports_start": clock.time()},
            "selection": selection_id, "shard": shard, "harness": shards.harness_id(),
            "modules": [os.path.abspath(m) if str(m).endswith(".py") else str(m)
                        for m in kernels],
            **plan.recorded.meta(), **meta})
    return RunResult(rows, run_dir, warnings, plan.recorded.meta().get("recorded"))


def judge(path: str | os.PathLike, *, ops: Sequence[str] | None = None,
          kernels: Sequence[str] = (), reports=None, run_id: str | None = None,
          store: str | None = None, registry: str | None = None,
          registry_required: bool = False, case_timeout: float | None = None,
          ray: str | None = None, shard: str | None = None,
          verify_fetched: float | None = None) -> RunResult:
    """Judge every recorded call of a bound API in ``path`` (a dump's root, a step / rank
    / proc folder, a dump.json, or a verify.capture folder); the RunResult's
    ``not_judged`` lists the records that were not, by API with counts and reasons.
    ``kernels``: your modules declaring ops with ``calls=`` bindings."""
    if not recorded.is_recorded_source(path):
        if not os.path.exists(path):
            raise ConfigError(f"{path}: no such file or folder")
        raise ConfigError(f"{path}: neither an msprobe dump (no dump.json below it) nor a "
                          f"verify.capture folder (no {recorded.CAPTURE_INDEX})")
    return run(level="all", ops=ops, backends=[recorded.BACKEND], cases=str(path),
                   kernels=kernels, reports=reports, run_id=run_id, store=store,
                   registry=registry, registry_required=registry_required,
                   case_timeout=case_timeout, ray=ray, shard=shard,
                   verify_fetched=verify_fetched)
