"""pytest plugin: each case x kernel is one test item, e.g.
``apply_adam_w_v2[L0-smoke-bf16-8x8-torch]``.

Switched on explicitly (``pytest -p verify``, or ``pytest_plugins = ["verify"]`` in a
conftest.py); it only adds options until ``--level`` is given, and then only case items
are collected. Items attach their result rows to the test report, so under pytest-xdist
every worker's rows reach the controller, which writes one merged report and the
terminal summary (verdict first; ``-v`` for every row).
"""
from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from pathlib import Path

import pytest

from verify.running import context, deadline
from verify.running import devices
from verify.running import isolation
from verify.running import runner
from verify.golden import source as golden_source
from verify import notices
from verify.cases import selection
from verify.cases import shards
from verify.report import results
from verify.errors import ConfigError

_ROWS_KEY = "verify_rows"
_WARNINGS_KEY = "verify_warnings"


def pytest_addoption(parser):
    g = parser.getgroup("verify", "kernel precision verification")
    g.addoption("--level", default=None,
                help="run the case items of these levels (L0, L1, 'L0,L1' or 'all')")
    g.addoption("--cases", default=None, help="folder of case files (default test_cases/)")
    g.addoption("--kernels", action="append", default=[],
                help="module (dotted name or .py path) registering kernels; repeatable")
    g.addoption("--backend", action="append", default=[], help="backend to run; repeatable")
    g.addoption("--op", action="append", default=[], help="op to run; repeatable")
    g.addoption("--dtype", action="append", default=[], help="working dtype; repeatable")
    g.addoption("--reports", default=None,
                help="folder of run reports (default reports/, or VERIFY_REPORTS)")
    g.addoption("--run-id", default=None, help="name of this run's report folder")
    g.addoption("--store", default=None,
                help="local golden store folder (default VERIFY_STORE, else the user's "
                     "cache folder)")
    g.addoption("--registry", default=None, help="golden registry URL (or VERIFY_REGISTRY)")
    g.addoption("--verify-fetched", type=float, default=None, metavar="F",
                help="recompute the first fetched golden of each op and dtype and a share F "
                     "of the rest (default 0.1; 0: off, 1: all); a mismatch is an ERROR row")
    g.addoption("--registry-required", action="store_true", default=False,
                help="a usage error when the registry cannot be reached")
    g.addoption("--time", dest="verify_time", type=int, nargs="?", const=5, default=0,
                help="also record each kernel's median wall time over N calls (default 5)")
    g.addoption("--benchmark-backend", default=None,
                help="also judge each kernel against this backend's kernel of the op on the "
                     "same inputs (msprobe's benchmark standard), in rows of their own")
    g.addoption("--shard", default=None, metavar="I/N",
                help="run shard I of N of the selection (deterministic, balanced by "
                     "expected cost); join the shard runs with verify merge")
    g.addoption("--case-timeout", default=None, metavar="S",
                help="seconds a case may run before it is an ERROR row (default 300 for L0, "
                     "1800 for L1, 7200 for other levels; 0: no limit)")
    g.addoption("--cases-only", action="store_true", default=False,
                help="collect only the case items, none of the project's own tests (what "
                     "verify run does); by default they run beside the case items")
    g.addoption("--progress-every", type=float, default=10.0,
                help="seconds between progress lines (cases done and left, op, elapsed); "
                     "0: none")


def _active(config) -> bool:
    return config.getoption("--level", default=None) is not None


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config):
    """Kernels run where their death cannot take the run with it: a verification run
    without ``-n`` runs its items in one pytest-xdist worker, and a crashed worker is
    replaced (as often as it takes). ``-n 0`` runs them in this process."""
    if _active(config) and not hasattr(config, "workerinput"):
        isolation.prepare(config)
    return (yield)


@pytest.hookimpl(trylast=True)  # after the terminal reporter exists
def pytest_configure(config):
    config.addinivalue_line("markers", "verify_case: a generated precision case item")
    if not _active(config):
        return
    # the precision summary carries the verdicts and diff tables: pytest's own failure
    # sections would repeat them once per item (unless asked for with --tb / -r)
    if config.option.tbstyle == "auto":
        config.option.tbstyle = "no"
    if config.option.reportchars == "fE":
        config.option.reportchars = ""
        tr = config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.reportchars = "w" if "w" in tr.reportchars else ""
    if hasattr(config, "workerinput"):  # before any kernel touches a device
        isolation.die_with_parent()  # a killed controller leaves no worker running
        isolation.adopt_orphans()    # what its kernels start is ended with it
        devices.pin_worker(config.workerinput.get("workerid"))
        devices.share_cpu(int(config.workerinput.get("workercount") or 1))
    try:
        repeats = selection.check_count(config.getoption("verify_time") or 0, "time")
        case_timeout = deadline.check_seconds(config.getoption("--case-timeout"))
        if not config.getoption("--progress-every") >= 0:
            raise ConfigError("--progress-every must be a number of seconds >= 0")
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    on_stuck = isolation.configure(config)
    config._verify_threads = {t.ident for t in threading.enumerate()}
    sel = selection.Selection(
        level=config.getoption("--level"), cases_dir=config.getoption("--cases"),
        ops=config.getoption("--op") or None, dtypes=config.getoption("--dtype") or None,
        backends=config.getoption("--backend") or None,
        kernel_modules=config.getoption("--kernels"))
    try:
        config._verify_plan = selection.build(sel)
        _take_shard(config)
        bench = selection.check_benchmark_backend(config.getoption("--benchmark-backend"))
        selection.check_environment()
        selection.check_registry_url(config.getoption("--registry"))
        fetched = config.getoption("--verify-fetched")
        if fetched is not None and not 0.0 <= fetched <= 1.0:
            raise ConfigError(f"--verify-fetched must be a fraction from 0 to 1, not {fetched}")
        resolver = golden_source.configure(
            config.getoption("--store"), config.getoption("--registry"),
            config.getoption("--registry-required"), fetched)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not hasattr(config, "workerinput"):  # the controller keeps the run's books
        config._verify_session = RunSession(config)
        config.pluginmanager.register(config._verify_session, "verify-run-session")
        if not getattr(config.option, "numprocesses", 0):
            # -n 0: kernels run in this process; one stuck past its limit ends the run
            # here after its rows are written (there is no worker to end and replace)
            on_stuck = config._verify_session.end_stuck_serial_run
    # the run's settings, passed to every case (verify/running/context.py)
    config._verify_ctx = context.RunContext(resolver=resolver, case_timeout=case_timeout,
                                            on_stuck=on_stuck, time_repeats=repeats,
                                            benchmark_backend=bench)
    config._verify_rows = []
    config._verify_by_name = {item_name(c, k): (c, k) for c, k in config._verify_plan.items}
    resolver.designate(c for c, _ in config._verify_plan.items)
    if not hasattr(config, "workerinput"):
        try:
            selection.check_keyword(config.getoption("keyword"))
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
        config._verify_session.stop_on_sigterm()
        try:
            config._verify_run_dir = results.reserve_run_dir(config.getoption("--reports"),
                                                             config.getoption("--run-id"))
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None


def _take_shard(config) -> None:
    """--shard I/N: keep this shard's items; the whole selection's id goes in the meta so
    verify merge can tell shards of one selection from runs of another."""
    plan = config._verify_plan
    config._verify_selection_size = len(plan.items)
    plan.items, config._verify_selection, config._verify_shard = shards.take(
        plan.items, config.getoption("--shard"))


def _cases_only(config) -> bool:
    return bool(config.getoption("--cases-only", default=False))


def pytest_ignore_collect(collection_path, config):
    if _active(config) and _cases_only(config):
        return True  # verify run (or --cases-only) collects case items only
    return None  # the project's own tests are collected as pytest would


class CaseFile(pytest.File):
    def collect(self):  # items are made by the plugin, not read from the file
        return []


class CaseFailed(Exception):
    pass


class CaseItem(pytest.Item):
    def __init__(self, *, case, kern, **kw):
        super().__init__(**kw)
        self.case = case
        self.kern = kern
        self.add_marker("verify_case")
        from verify.specs import registry
        spec = registry.op(case.op)
        self.extra_keyword_matches.update(
            {case.op, *spec.aliases, case.level, case.dtype, kern.backend, kern.name,
             *case.tags})

    def runtest(self):
        books = getattr(self.config, "_verify_session", None)  # -n 0: this process's
        if books is not None:
            books.current = self
        try:
            rows = runner.run_case(self.case, self.kern, self.config._verify_ctx)
        finally:
            if books is not None:
                books.current = None
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        for r in rows:
            r["worker"] = worker
        # one pickled blob: xdist's wire format walks every dict and list item by item,
        # which cost more than the cases themselves on an L0 run
        self.user_properties.append((_ROWS_KEY, pickle.dumps(rows, protocol=5)))
        warnings = notices.drain()
        if warnings:  # past log capture, across xdist: the controller prints them
            self.user_properties.append((_WARNINGS_KEY, warnings))
        verdicts = {r["verdict"] for r in rows}
        if "ERROR" in verdicts:
            raise CaseFailed(_explain(rows, "ERROR"))
        if rows[0].get("expected") == "PASS" and "FAIL" in verdicts:
            raise CaseFailed(_explain(rows, "FAIL"))
        if verdicts == {"SKIP"}:
            pytest.skip(rows[0]["reason"])

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, self.name


def _explain(rows, verdict) -> str:
    lines = []
    for r in rows:
        if r["verdict"] == verdict:
            lines.append(f"{r['output']}: {verdict} [{r.get('standard') or '-'}] {r['reason']}")
    text = "\n".join(lines)
    diffs = results.diff_tables_text([r for r in rows if r.get("diff_table")], limit=3)
    return text + ("\n\n" + diffs if diffs else "")


item_name = shards.item_name


def pytest_collection_modifyitems(session, config, items):
    if not _active(config):
        return
    files: dict[str, CaseFile] = {}
    new_items = []
    for case, kern in config._verify_plan.items:
        parent = files.get(case.file)
        if parent is None:
            parent = files[case.file] = CaseFile.from_parent(session, path=Path(case.file).resolve())
        new_items.append(CaseItem.from_parent(parent, name=item_name(case, kern),
                                              case=case, kern=kern))
    own = [] if _cases_only(config) else [i for i in items if not isinstance(i, CaseItem)]
    items[:] = own + new_items  # the project's own tests first, then the case items


class _Progress:
    """A line every few seconds through pytest's terminal writer (xdist-safe: the
    controller sees every worker's reports)."""

    def __init__(self, config):
        self.config = config
        self.every = config.getoption("--progress-every")
        self.total = len(config._verify_plan.items)
        self.done = 0
        self.start = self.last = time.monotonic()

    def item_done(self, nodeid: str) -> None:
        self.done += 1
        now = time.monotonic()
        if self.every <= 0 or now - self.last < self.every or self.done == self.total:
            return
        self.last = now
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        op = nodeid.split("::")[-1].split("[")[0]
        line = notices.progress_text(self.done, self.total, now - self.start, op)
        if tr._tw.width_of_current_line:  # after pytest's dots: start a line of our own
            tr.write("\n")
        tr.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call" and isinstance(item, CaseItem):
        # the call report holds the rows; the teardown report would carry them a second time
        item.user_properties[:] = [p for p in item.user_properties
                                   if p[0] not in (_ROWS_KEY, _WARNINGS_KEY)]
    return report


class RunSession:
    """One run's books on the controller: the rows the items sent, the plan they must
    fill, why items failed without rows, the warnings, the timing and the signal that
    stopped it. Registered as a plugin on the run's config (``config._verify_session``),
    so the hooks that are not given a config, the SIGTERM handler and the watchdog reach
    this run's books and no other's: nothing about a run lives in the module."""

    def __init__(self, config):
        self.config = config
        self.rows: list[dict] = []
        self.planned: dict = {}  # nodeid -> (case, kernel) of every selected item
        self.faults: dict[str, str] = {}  # nodeid -> why an item failed without rows
        self.own_failed: set = set()  # the project's own tests that failed
        self.warnings: dict[str, None] = {}  # run-level warnings of every process, in order
        # when the run was configured, got its first and last case's rows and began its
        # reports (epoch seconds, in results.json's meta: where a run's time went)
        self.timing: dict[str, float] = {"configured": time.time()}
        self.interrupted = ""  # the signal that interrupted the run, for its report
        self.current = None  # the case item running in this process (-n 0)
        self.progress = _Progress(config)

    def pytest_runtest_logreport(self, report):
        # every worker's reports (and the reports of a run without xdist)
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.progress.item_done(report.nodeid)
        got_rows = False
        for key, value in getattr(report, "user_properties", ()):
            if key == _ROWS_KEY and report.when == "call":
                self.rows.extend(pickle.loads(value))
                got_rows = True
                self.timing.setdefault("first_result", time.time())
                self.timing["last_result"] = time.time()
            elif key == _WARNINGS_KEY and report.when == "call":
                self.warnings.update(dict.fromkeys(value))
        if report.failed and not got_rows:  # a crash, an exit, a failing setup: the cause
            worker = getattr(getattr(report, "node", None), "gateway", None)
            if report.when == "???" and worker is not None:  # xdist: the worker crashed
                text = isolation.crash_cause(self.config, worker.id)
            else:
                text = str(getattr(report, "longreprtext", "") or report.longrepr or "").strip()
                text = text.splitlines()[-1][:500] if text else ""
            self.faults.setdefault(report.nodeid, text)
        if report.failed and report.nodeid not in self.planned and self.planned:
            self.own_failed.add(report.nodeid)  # a project test beside the case items

    def pytest_collection_finish(self, session):
        """The plan, as selected (after -k and deselection): each item must end as rows."""
        if not session.config.option.collectonly:
            self.planned.update({item.nodeid: (item.case, item.kern) for item in session.items
                                 if isinstance(item, CaseItem)})

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        """Under xdist the controller learns the plan from the workers' collections."""
        if self.config.option.collectonly:
            return
        by_name = self.config._verify_by_name
        for nodeid in ids:
            pair = by_name.get(nodeid.rsplit("::", 1)[-1])
            if pair is not None:
                self.planned[nodeid] = pair

    def vanished(self, rows: list[dict], interrupted: str = "") -> list[dict]:
        """An ERROR row for every planned item that produced no rows: a worker that crashed
        (segfault, os._exit, OOM kill), an item interrupted, a kernel that ended its
        process. Nothing planned disappears from the counts, the exit status or the
        reports."""
        seen = {(r["op"], r["level"], r["case_id"], r["backend"], r["kernel"]) for r in rows}
        out = []
        for nodeid, (case, kern) in sorted(self.planned.items()):
            if (case.op, case.level, case.id, kern.backend, kern.name) in seen:
                continue
            cause = self.faults.get(nodeid) or (f"not run: {interrupted}" if interrupted else
                                                "the item did not report (interrupted?)")
            out.append(runner.vanished_row(case, kern, f"no result: {cause}"))
        return out

    def stop_on_sigterm(self) -> None:
        """SIGTERM (a CI job cancelled, a kill) ends the run as Ctrl-C does: pytest stops,
        the rows so far are written with the run marked interrupted, exit 2. xdist's
        workers are ended with it."""
        import signal
        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum, frame):
            self.interrupted = signal.Signals(signum).name
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

        signal.signal(signal.SIGTERM, on_term)

    def write_report(self, rows: list[dict], interrupted: str = "") -> None:
        """results.json and its views for ``rows``; ``interrupted``: why the run ended
        early (meta.interrupted, shown in the report's warnings)."""
        config = self.config
        timing = dict(self.timing, reports_start=time.time())
        warnings = list(getattr(config, "_verify_warnings", []))
        if interrupted:
            warnings.insert(0, interrupted)
        meta = {"run_id": config._verify_run_dir.name, "level": config.getoption("--level"),
                "environment": results.environment(), "warnings": warnings,
                "timing": timing, "selection": config._verify_selection,
                "shard": config._verify_shard, "harness": shards.harness_id(),
                "modules": [os.path.abspath(m) if m.endswith(".py") else m
                            for m in config.getoption("--kernels")],
                **_recorded_meta(config)}
        if interrupted:
            meta["interrupted"] = interrupted
        results.write(rows, config._verify_run_dir, meta)

    def end_stuck_serial_run(self, seconds: float, phase: str) -> None:
        """The watchdog's action under -n 0: the case never returned to Python past its
        limit plus the grace. Write every row so far and an ERROR row for the stuck case,
        then end the process (exit 1): nothing else can stop code that ignores SIGALRM."""
        try:
            config = self.config
            item = self.current
            reason = (f"timed out after {seconds:g} s while {phase}, and never "
                      f"returned to Python: -n 0 runs kernels in the run's own process, so "
                      f"the run was ended after writing its rows (--case-timeout "
                      f"{seconds:g}, 0: no limit; without -n 0 its worker is ended and a "
                      f"fresh one runs the rest)")
            rows = list(self.rows)
            if item is not None:
                rows.append(runner.vanished_row(item.case, item.kern, reason))
            left = len(self.planned) - len({(r["op"], r["level"], r["case_id"], r["backend"],
                                             r["kernel"]) for r in rows})
            self.write_report(rows, interrupted=f"ended: a case got stuck ({reason}); "
                                                f"{max(0, left)} planned case(s) not run")
            capman = config.pluginmanager.getplugin("capturemanager")
            if capman is not None:  # the item's output capture would swallow the message
                capman.suspend_global_capture(in_=False)
            sys.stderr.write(f"verify: error: {item.nodeid if item else 'a case'} {reason}; "
                             f"reports in {config._verify_run_dir}\n")
            sys.stderr.flush()
            sys.stdout.flush()
            from verify.errors import mark_finished
            mark_finished(1)  # ended by our own code: a guarding `verify run` passes on 1
        except BaseException as exc:  # the process ends regardless; say why no report
            sys.stderr.write(f"verify: error: a case got stuck past its limit and the run "
                             f"was ended; its report could not be written: {exc!r}\n")
            sys.stderr.flush()
        finally:
            os._exit(1)

    def finish(self, session) -> None:
        """The run's end: every planned item as rows, the report written, the exit
        status decided by the rows (and the project's own tests beside them)."""
        config = self.config
        rows = list(self.rows)
        stopped = (f"the run was interrupted ({self.interrupted or 'Ctrl-C'})"
                   if session.exitstatus == pytest.ExitCode.INTERRUPTED else "")
        rows += self.vanished(rows, stopped)
        config._verify_own_failed = sorted(self.own_failed)
        self.warnings.update(dict.fromkeys(notices.drain()))
        config._verify_warnings = list(self.warnings)
        isolation.cleanup(config)
        config._verify_rows = rows
        # a shard with nothing to run (more shards than items, or -k deselected all of its
        # share): an empty report, so that verify merge finds every shard
        empty_shard = (bool(config._verify_shard) and not rows
                       and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED)
        if not rows and not empty_shard:
            return
        judged = sum(1 for r in rows
                     if not str(r.get("reason", "")).startswith("no result: not run"))
        self.write_report(rows, interrupted=(
            f"{stopped}: {judged} rows judged, the cases not run are ERROR rows 'not run'"
            if stopped else ""))
        if empty_shard:
            print(f"verify: shard {config._verify_shard} has no case to run (the selection "
                  f"has {config._verify_selection_size} before -k); wrote an empty report "
                  f"to {config._verify_run_dir}", file=sys.stderr)
            session.exitstatus = 0
        elif session.exitstatus in (0, 1):  # not interrupted or broken: the rows decide,
            # and so do the project's own tests collected beside them
            session.exitstatus = max(results.exit_status(rows), int(bool(self.own_failed)))
        config._verify_exit = int(session.exitstatus)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    isolation.worker_down(node, error)


def _recorded_meta(config) -> dict:
    """results.json's "recorded" entry of this run's plan (its not-judged list)."""
    plan = getattr(config, "_verify_plan", None)
    return plan.recorded.meta() if plan is not None else {}


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    from verify.golden.store import close_all
    close_all()  # every process's index connections: the write-ahead log is folded in
    books = getattr(config, "_verify_session", None)
    if books is not None:
        books.finish(session)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Threads a kernel started and left running (not daemon) would keep this process
    from exiting: in a run that ran kernels in its own process (-n 0), say so and end
    the process with the run's status once pytest is done."""
    before = getattr(config, "_verify_threads", None)
    if before is not None and (hasattr(config, "workerinput")
                               or not getattr(config.option, "numprocesses", 0)):
        isolation.end_children()  # processes the kernels started do not outlive the run
    if before is not None and hasattr(config, "workerinput"):
        # a worker whose results the controller has (workerfinished is sent before this):
        # skip the interpreter's teardown of torch, numba and kernel threads (~0.4 s each)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if before is None or not hasattr(config, "_verify_exit"):
        return
    left = isolation.lingering_threads(before)
    if not left:
        return
    names = ", ".join(sorted({t.name for t in left}))
    sys.stdout.flush()
    print(f"verify: {len(left)} thread(s) started by kernels are still running ({names}); "
          f"the run ends without waiting for them", file=sys.stderr, flush=True)
    from verify.errors import mark_finished
    code = config._verify_exit if config._verify_exit in (0, 1) else 2
    mark_finished(code)
    os._exit(code)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _active(config) or hasattr(config, "workerinput"):
        return
    rows = getattr(config, "_verify_rows", [])
    if not rows:
        return
    tr = terminalreporter
    own = getattr(config, "_verify_own_failed", [])
    if own:
        tr.write_sep("=", "the project's own tests that failed")
        for nodeid in own:
            tr.write_line(f"FAILED {nodeid}", red=True)
        if config.option.tbstyle == "no":
            tr.write_line("(their tracebacks: run again with --tb=short)")
    tr.write_sep("=", "precision summary")
    tr.write(results.summary_text(rows, config._verify_run_dir, color=tr.hasmarkup,
                                  width=max(80, tr._tw.fullwidth),
                                  verbose=config.option.verbose > 0,
                                  recorded=_recorded_meta(config).get("recorded")))
    if not config.getoption("--backend"):
        for line in selection.unavailable_backends():
            tr.write_line(f"not run here: backend {line}")
    for line in getattr(config, "_verify_warnings", []):
        tr.write_line(f"warning: {line}", yellow=True)
    diffs = results.diff_tables_text([r for r in rows if r.get("expected") == "PASS"], limit=5)
    if diffs:
        tr.write_sep("-", "worst elements of failing outputs (all in diff_tables.txt)")
        tr.write(diffs)
