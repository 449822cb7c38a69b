"""The ``verify`` command.

``verify run`` checks the selection first (a usage error exits 2 before anything runs),
then runs the case items through pytest (so ``-n N`` spreads them over xdist workers)
and maps pytest's exit codes onto ours: 0 all PASS, 1 any FAIL or ERROR, 2 usage.
``verify serve`` starts the golden registry service; ``verify golden ...`` manages a store.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import os
import shlex
import sys

from verify.errors import FINISHED_ENV, ConfigError, mark_finished

# Heavy modules (torch, pandas, the op pack) are imported by the commands that need them,
# so `verify --help` answers at once.


def _add_store(p, registry_too=False):
    p.add_argument("--store", default=None,
                   help="local golden store folder (default VERIFY_STORE, else the user's "
                        "cache folder: `verify golden ls` prints it)")
    if registry_too:
        p.add_argument("--registry", default=None,
                       help="golden registry URL (default VERIFY_REGISTRY); goldens are read "
                            "from it and pushed to it when VERIFY_REGISTRY_TOKEN is set")
        p.add_argument("--registry-required", action="store_true",
                       help="fail (exit 2) instead of computing when the registry is away")
        p.add_argument("--verify-fetched", type=_share, default=None, metavar="F",
                       help="recompute the first golden fetched for each op and dtype and a "
                            "share F of the rest, bit for bit (default 0.1; 0: off, 1: all): "
                            "a mismatch is an ERROR row and is disputed at the registry")


def _add_selection(p):
    p.add_argument("--level", default="L0", help="L0, L1, 'L0,L1' or 'all' (default L0)")
    p.add_argument("--cases", default=None,
                   help="folder of case files (default VERIFY_CASES, else the built-in cases "
                        "and those of every declared op pack)")
    p.add_argument("--op", action="append", default=[], help="only this op; repeatable")
    p.add_argument("--dtype", action="append", default=[],
                   help="only this working dtype; repeatable")


def _workers(text: str) -> str:
    if text in ("auto", "logical") or (text.isdigit() and int(text) <= 4096):
        return text
    raise argparse.ArgumentTypeError(f"a number of workers from 0 to 4096, or 'auto', "
                                     f"not {text!r}")


def _count(text: str) -> int:
    if text.isdigit() and 1 <= int(text) <= 1_000_000:
        return int(text)
    raise argparse.ArgumentTypeError(f"a whole number from 1 to 1000000, not {text!r}")


def _elements(text: str) -> int:
    """A number of elements: digits, or a power of two written 2^N (up to 2^40)."""
    text = text.strip()
    power = text[2:] if text.startswith("2^") else None
    if power is not None and power.isdigit() and int(power) <= 40:
        return 1 << int(power)
    if text.isdigit() and 1 <= int(text) <= 1 << 40:
        return int(text)
    raise argparse.ArgumentTypeError(f"a number of elements from 1 to 2^40 (digits or 2^N), "
                                     f"not {text!r}")


def _retries(text: str) -> int:
    if text.isdigit() and int(text) <= 100:
        return int(text)
    raise argparse.ArgumentTypeError(f"a whole number from 0 to 100, not {text!r}")


def _shard(text: str) -> str:
    from verify.cases.shards import parse
    try:
        i, n = parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"{i}/{n}"


def _seconds(text: str) -> float:
    from verify.running.deadline import check_seconds
    try:
        return check_seconds(text, "seconds")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fraction(text: str, allow_zero: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if allow_zero and value == 0:
        return 0.0
    if not 0 < value <= 1:
        kind = "a share 0 <= F <= 1 (0: off)" if allow_zero else "a fraction 0 < F <= 1"
        raise argparse.ArgumentTypeError(f"{kind}, not {text!r}")
    return value


def _share(text: str) -> float:
    """A share 0 <= F <= 1 (0: off)."""
    return _fraction(text, allow_zero=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="verify", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="verify kernels against their float64 goldens")
    _add_selection(run)
    run.add_argument("--kernels", action="append", default=[],
                     help="your module of kernels and/or op declarations: dotted name or "
                          ".py path; repeatable")
    run.add_argument("--backend", action="append", default=[],
                     help="run only this backend (e.g. torch, mutants, yours); repeatable")
    run.add_argument("-n", "--workers", default=None, type=_workers,
                     help="pytest-xdist workers (a number or 'auto'); default one worker, "
                          "so a kernel that crashes or hangs costs one ERROR row; 0: run "
                          "kernels in this process (a crash ends the run)")
    run.add_argument("--case-timeout", default=None, type=_seconds, metavar="S",
                     help="seconds a case may run before it is an ERROR row (default 300 "
                          "for L0, 1800 for L1, 7200 for other levels; 0: no limit)")
    run.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    run.add_argument("--shard", default=None, type=_shard, metavar="I/N",
                     help="run shard I of N of the selection: deterministic and balanced "
                          "by expected cost, for a CI matrix; join them with verify merge")
    run.add_argument("--ray", default=None, metavar="WHERE",
                     help="run on a Ray cluster instead of pytest-xdist: auto (RAY_ADDRESS or "
                          "the running head), HOST:PORT, local (a cluster in this process), "
                          "or 'local:NPU=4,golden=1' (declared resources); needs "
                          "kernel-verify[ray]")
    run.add_argument("--retries", default=1, type=_retries, metavar="N",
                     help="with --ray: resubmit the cases of a lost node up to N times "
                          "(column attempts), then an ERROR row 'node lost' (default 1)")
    run.add_argument("--reports", default=None, help="report folder (default reports/)")
    run.add_argument("--run-id", default=None, help="name of this run's report folder")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="one line per item and every row in the summary (default: a line "
                          "per op and kernel, then the rows that did not pass)")
    run.add_argument("--time", type=_count, nargs="?", const=5, default=0, metavar="N",
                     help="also record each kernel's median wall time over N calls (5)")
    run.add_argument("--benchmark-backend", default=None, metavar="B",
                     help="also judge each kernel against backend B's kernel of the op on the "
                          "same inputs (msprobe's benchmark standard), in rows of their own")
    run.add_argument("--progress-every", type=_seconds, default=10.0,
                     help="seconds between progress lines (cases done and left, op, elapsed)")
    run.add_argument("--shrink", action="store_true",
                     help="then shrink each case that FAILed to the smallest input that "
                          "still fails, with a case file and a standalone reproducer (as "
                          "verify shrink RUN_DIR)")
    _add_store(run, registry_too=True)

    judge = sub.add_parser(
        "judge", help="judge the calls recorded in an msprobe dump or a verify.capture folder "
                      "against their float64 goldens",
        description="Every recorded forward call of an API an op binds (verify ops OP lists "
                    "them) is judged against the op's float64 golden with both floors, and "
                    "written as a run (results.csv / json, report.html, junit.xml); records "
                    "no op binds are listed by API with counts. Exit 0 / 1 / 2 as verify run.")
    judge.add_argument("path", help="an msprobe dump (its root, a step / rank / proc folder, "
                                    "or a dump.json) or a verify.capture folder")
    for action in run._actions:
        if action.dest in ("help", "cases", "backend", "level", "benchmark_backend", "time",
                           "workers", "shrink"):
            continue
        judge._add_action(action)
    judge.add_argument("-n", "--workers", default=None, type=_workers,
                       help="processes judging the records (a number or 'auto'); default "
                            "one, this process: a recorded output runs no kernel code, so "
                            "there is nothing to isolate; 2 or more: pytest-xdist workers")
    judge.set_defaults(cases=None, backend=[], level="all", benchmark_backend=None, time=0,
                       shrink=False)  # a recorded output has no input to shrink

    ls = sub.add_parser("ops", help="list the registered ops; with OP, its call signature")
    ls.add_argument("op", nargs="*", help="show these ops in full: inputs, params, outputs, "
                                          "gradients, standard, kernels")
    ls.add_argument("--kernels", action="append", default=[],
                    help="your module of kernels and/or op declarations; repeatable")

    srv = sub.add_parser("serve", help="serve a golden store over HTTP")
    _add_store(srv)
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8470)
    srv.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused: see below
    srv.add_argument("--token-file", default=None,
                     help="file holding the write token (default VERIFY_REGISTRY_TOKEN; "
                          "none: the service is read-only)")
    srv.add_argument("--read-token-file", default=None,
                     help="file holding the token reads need (default "
                          "VERIFY_REGISTRY_READ_TOKEN; none: reads are open)")
    srv.add_argument("--admin-token-file", default=None,
                     help="file holding the token that may replace a golden with "
                          "PUT ?replace=true (default VERIFY_REGISTRY_ADMIN_TOKEN)")
    srv.add_argument("--tls-cert", default=None,
                     help="certificate (PEM) to serve HTTPS with; needs --tls-key")
    srv.add_argument("--tls-key", default=None, help="the certificate's private key (PEM)")
    srv.add_argument("--max-body-mb", type=int, default=8192,
                     help="largest upload accepted, in MiB (default 8192)")

    st = sub.add_parser("strategies", help="compare an op's implementation routes")
    st.add_argument("op", help="op name or alias (gelu, attention, mean, ...)")
    st.add_argument("--level", default="L0", help="level(s) of cases (default L0)")
    st.add_argument("--cases", default=None, help="folder of case files (default test_cases/)")
    st.add_argument("--dtype", action="append", default=[], help="only this dtype; repeatable")
    st.add_argument("--repeats", type=int, default=5, help="timed calls per case (median)")
    st.add_argument("--kernels", action="append", default=[],
                    help="a module adding strategies (backend 'strategies'); repeatable")
    st.add_argument("--reports", default=None, help="report folder (default reports/)")
    st.add_argument("--run-id", default=None)
    _add_store(st)

    hn = sub.add_parser(
        "hunt", help="search an op's input space for the inputs where a kernel is least "
                     "precise; writes a run and found_cases.json",
        description="Guided search over the op's declared space (shapes in its rank range "
                    "with lengths at 1, 2^k - 1, 2^k, 2^k + 1, primes and long rows; each "
                    "normal / uniform input's scale and mean offset) for inputs where the "
                    "kernel FAILs by more than the compute-precision floor allows. Exit 1 "
                    "when it found any, 0 when not, 2 on a usage error.")
    hn.add_argument("--op", required=True, help="op name or alias")
    hn.add_argument("--backend", required=True, help="the backend whose kernels are hunted")
    hn.add_argument("--kernel", default=None, help="only this kernel of the backend")
    hn.add_argument("--kernels", action="append", default=[],
                    help="your module of kernels and/or op declarations; repeatable")
    hn.add_argument("--dtype", action="append", default=[], help="only this dtype; repeatable")
    hn.add_argument("--budget", type=_count, default=None,
                    help="cases tried per kernel (default 100)")
    hn.add_argument("--seed", type=int, default=0, help="the search's seed (default 0)")
    hn.add_argument("--max-elements", type=_elements, default=None,
                    help="largest inputs tried, in elements over all inputs (default 2^21)")
    hn.add_argument("--case-timeout", default=None, type=_seconds, metavar="S",
                    help="seconds a tried case may run before it is an ERROR row")
    hn.add_argument("--shrink", action="store_true",
                    help="then shrink what was found (as verify shrink RUN_DIR)")
    hn.add_argument("-n", "--workers", type=int, default=0, metavar="N",
                    help="evaluate each round of candidates in N processes (a kernel that "
                         "crashes one is a finding); the same found cases as without")
    hn.add_argument("--ray", default=None, metavar="WHERE",
                    help="evaluate each round of candidates as Ray tasks (auto, HOST:PORT, "
                         "local, 'local:NPU=4'; as verify run --ray); the same found cases")
    hn.add_argument("--reports", default=None, help="report folder (default reports/)")
    hn.add_argument("--run-id", default=None, help="name of this run's report folder")
    _add_store(hn)

    sh = sub.add_parser(
        "shrink", help="shrink each input a hunt found to the smallest that still fails, "
                       "with a standalone reproducer")
    sh.add_argument("run_dir", help="a verify hunt run folder (its found_cases.json), or "
                                    "any run folder (its cases that FAILed)")
    sh.add_argument("--case", default=None, help="only this found (or failed) case id")
    sh.add_argument("--kernels", action="append", default=[],
                    help="the run's kernel modules, where its results.json does not name "
                         "them; repeatable")
    sh.add_argument("--out", default=None, help="where to write (default RUN_DIR/shrunk)")
    _add_store(sh)

    mrg = sub.add_parser("merge", help="join the shard runs of one selection into one report")
    mrg.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                     help="the shard runs' report folders (reports/<run-id>)")
    mrg.add_argument("--out", required=True, metavar="DIR",
                     help="folder for the merged results.csv / json, report.html, junit.xml")

    rep = sub.add_parser("report", help="rebuild a run's HTML, CSV and JUnit from results.json")
    rep.add_argument("run_dir", help="a run's report folder (reports/<run-id>)")

    dif = sub.add_parser("diff", help="compare two runs; exit 1 when anything regressed")
    dif.add_argument("run_a", help="the earlier run's folder")
    dif.add_argument("run_b", help="the later run's folder")
    dif.add_argument("--factor", type=float, default=2.0,
                     help="a metric worse by more than this factor is a regression (2)")
    dif.add_argument("--html", default=None,
                     help="where to write the HTML page (default RUN_B/diff-<run_a>.html)")

    golden = sub.add_parser("golden", help="manage the golden store")
    gsub = golden.add_subparsers(dest="golden_command", required=True)
    g_ls = gsub.add_parser("ls", help="list stored goldens")
    _add_store(g_ls)
    warm = gsub.add_parser("warm", help="compute (or fetch) a level's goldens ahead of time")
    _add_selection(warm)
    _add_store(warm, registry_too=True)
    check = gsub.add_parser("check", help="re-hash every blob and report corrupt ones")
    _add_store(check)
    audit = gsub.add_parser("audit", help="recompute a sample (or all) of a store's or a "
                                          "registry's goldens; exit 1 if any differ")
    _add_store(audit)
    audit.add_argument("--registry", default=None,
                       help="audit this registry's goldens instead of a local store")
    audit.add_argument("--sample", type=_fraction, default=1.0, metavar="F",
                       help="fraction of the goldens to recompute, 0 < F <= 1 (default all)")
    audit.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    audit.add_argument("--kernels", action="append", default=[],
                       help="module declaring ops whose goldens the store holds; repeatable")
    audit.add_argument("--writer", default=None, metavar="ID",
                       help="with --registry: every golden this writer's token wrote (its id "
                            "as the registry lists it), all of them recomputed")
    resolve = gsub.add_parser("resolve", help="the admin's decision on a disputed golden of "
                                              "a registry (VERIFY_REGISTRY_ADMIN_TOKEN)")
    resolve.add_argument("key", help="the golden's key (64 hex digits)")
    resolve.add_argument("--registry", default=None, help="the registry (default "
                                                          "VERIFY_REGISTRY)")
    resolve.add_argument("--drop", action="store_true",
                         help="remove the golden (an honest writer may put the key again); "
                              "default: keep it and clear the dispute")
    gc = gsub.add_parser("gc", help="remove goldens no case or golden version refers to")
    _add_store(gc)
    gc.add_argument("--cases", action="append", default=[],
                    help="case folders whose goldens stay (default: the built-in cases and "
                         "those of declared op packs); repeatable")
    return p


def _pytest_args(a) -> list[str]:
    # --opt=value forms and an explicit rootdir: pytest must not take option values (such
    # as --reports /tmp/x) for paths when it picks its rootdir
    # Only the plugins a run needs (PYTEST_DISABLE_PLUGIN_AUTOLOAD is set by cmd_run): other
    # installed plugins (hypothesis, anyio, ...) cost start-up and per-test hooks in every
    # worker. Assertion rewriting, log capture and the unraisable-exception plugin (two
    # full garbage collections at exit) serve test suites, not a verify run.
    args = ["-p", "verify.running.pytest_plugin", "-p", "xdist", "-p", "no:cacheprovider",
            "-p", "no:logging", "-p", "no:unraisableexception", "-p", "no:threadexception",
            "--assert=plain", f"--rootdir={os.getcwd()}", "--cases-only",
            f"--level={a.level}"]
    for flag, values in (("--kernels", a.kernels), ("--backend", a.backend), ("--op", a.op),
                         ("--dtype", a.dtype)):
        args += [f"{flag}={v}" for v in values]
    for flag, value in (("--cases", a.cases), ("--reports", a.reports),
                        ("--run-id", a.run_id), ("--store", a.store),
                        ("--registry", a.registry),
                        ("--benchmark-backend", a.benchmark_backend)):
        if value:
            args.append(f"{flag}={value}")
    if a.keyword:
        args += ["-k", a.keyword]
    args.append(f"--progress-every={a.progress_every}")
    if a.time:
        args.append(f"--time={a.time}")
    if a.registry_required:
        args.append("--registry-required")
    if getattr(a, "verify_fetched", None) is not None:
        args.append(f"--verify-fetched={a.verify_fetched}")
    if a.workers is not None:
        args += ["-n", str(a.workers)]
    if a.case_timeout is not None:
        args.append(f"--case-timeout={a.case_timeout:g}")
    if a.shard:
        args.append(f"--shard={a.shard}")
    args += ["-v"] if a.verbose else ["-q"]
    return args


def cmd_run(a) -> int:
    from verify.cases import selection
    selection.check_keyword(a.keyword)  # exit 2 before any folder or worker exists
    if a.ray is not None:
        return _run_on_ray(a)
    import pytest

    from verify.cases import selection

    sel = selection.Selection(level=a.level, cases_dir=a.cases, ops=a.op or None,
                              dtypes=a.dtype or None, backends=a.backend or None,
                              kernel_modules=a.kernels)
    selection.build(sel)  # usage errors surface here with exit 2
    selection.check_benchmark_backend(a.benchmark_backend)
    if a.shrink and a.run_id is None:  # --shrink reads the run's folder afterwards
        from verify.report import results
        a.run_id = results.new_run_id()
    # the plugin sets up the golden store and registry; its usage errors map to 2 below
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # inherited by the xdist workers
    code = int(pytest.main(_pytest_args(a)))
    if code == 1 and a.shrink:
        _shrink_run(_run_folder(a), a)
    if code in (0, 1):
        return code
    if code == 5:
        print("verify: no case matched the selection", file=sys.stderr)
    return 2


def _run_folder(a):
    from pathlib import Path
    return Path(a.reports or os.environ.get("VERIFY_REPORTS", "reports")) / a.run_id


def _shrink_run(run_dir, a) -> None:
    """verify run --shrink: each failing case shrunk, in RUN_DIR/shrunk."""
    print(f"verify: shrinking the cases that failed in {run_dir}", file=sys.stderr)
    _print_shrunk(run_dir, None, None, a.store, a.kernels)


def _run_on_ray(a) -> int:
    """``verify run --ray``: the selection as Ray tasks; the same reports and exit codes."""
    from verify.running import ray_run
    if a.workers is not None:
        raise ConfigError("-n and --ray do not go together: under --ray, Ray places each "
                          "case on a device of the cluster (use -n without --ray on one "
                          "machine)")
    if a.keyword:
        raise ConfigError("-k is pytest's item filter and does not apply under --ray; "
                          "select with --op, --dtype, --backend and --level")
    from verify import api
    from verify.report import results
    try:
        result = api.run(level=a.level, ops=a.op or None, backends=a.backend or None,
                         dtypes=a.dtype or None, cases=a.cases, kernels=a.kernels,
                         reports=a.reports, run_id=a.run_id, store=a.store,
                         registry=a.registry, registry_required=a.registry_required,
                         verify_fetched=a.verify_fetched,
                         time=a.time, benchmark_backend=a.benchmark_backend,
                         case_timeout=a.case_timeout, ray=a.ray, retries=a.retries,
                         shard=a.shard, progress_every=a.progress_every)
    except ray_run.RegistryAway as exc:
        print(f"verify: error: {exc}", file=sys.stderr)
        return 2
    print(results.summary_text(result.rows, result.run_dir, width=_width(),
                               verbose=a.verbose, recorded=result.recorded), end="")
    for line in result.warnings:
        print(f"warning: {line}")
    if a.shrink and result.exit_status == 1 and result.run_dir is not None:
        _shrink_run(result.run_dir, a)
    return result.exit_status


def cmd_judge(a) -> int:
    """``verify judge PATH``: verify run on the recorded calls, their outputs the kernel."""
    from verify.cases import recorded
    if not recorded.is_recorded_source(a.path):
        if not os.path.exists(a.path):
            raise ConfigError(f"{a.path}: no such file or folder")
        raise ConfigError(f"{a.path}: neither an msprobe dump (no dump.json below it) nor a "
                          f"verify.capture folder (no {recorded.CAPTURE_INDEX})")
    a.cases, a.backend, a.level = a.path, [recorded.BACKEND], "all"
    if a.workers in (None, 1) and a.ray is None:  # one worker is this process: no worker start, one index
        a.workers = 0
    return cmd_run(a)


def cmd_ops(a) -> int:
    from verify.specs import oplist
    from verify.specs import registry

    for module in a.kernels:
        registry.load_user_module(module)
    registry.load_backends()  # show the kernels of every backend that can run here
    if a.op:
        from verify.cases import selection
        names = selection.expand_op_names(a.op)
        print("\n\n".join(oplist.describe(registry.op(n)) for n in names))
        return 0
    for name in registry.ops():
        print(oplist.one_line(registry.op(name)))
    return 0


def cmd_serve(a) -> int:
    try:
        from verify.golden.service import serve
    except ImportError as exc:
        raise ConfigError(f"verify serve needs the registry extra ({exc.name} is missing): "
                          f"pip install 'kernel-verify[registry]'") from None
    from verify.golden.service import Tokens, read_token
    from verify.golden.store import default_store_dir

    if a.token is not None:
        raise ConfigError("--token is not taken: a token on the command line is visible in "
                          "the process list. Set VERIFY_REGISTRY_TOKEN, or --token-file FILE")
    if bool(a.tls_cert) != bool(a.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    for path in (a.tls_cert, a.tls_key):
        if path and not os.path.isfile(path):
            raise ConfigError(f"TLS file {path} does not exist")
    tokens = Tokens(write=read_token("VERIFY_REGISTRY_TOKEN", a.token_file, "write"),
                    read=read_token("VERIFY_REGISTRY_READ_TOKEN", a.read_token_file, "read"),
                    admin=read_token("VERIFY_REGISTRY_ADMIN_TOKEN", a.admin_token_file,
                                     "admin"))
    serve(a.store or default_store_dir(), host=a.host, port=a.port, tokens=tokens,
          max_body=a.max_body_mb << 20, tls_cert=a.tls_cert, tls_key=a.tls_key)
    return 0


def cmd_merge(a) -> int:
    from verify.report import merge, results

    rows, meta = merge.merge(a.run_dirs, a.out)
    run_dir = results.write(rows, a.out, meta)
    print(results.summary_text(rows, run_dir, width=_width(), recorded=meta.get("recorded")),
          end="")
    print(f"merged {len(a.run_dirs)} run(s), {len(rows)} rows, into {run_dir}")
    return results.exit_status(rows)


def cmd_report(a) -> int:
    from verify.report import results

    rows, meta = results.load(a.run_dir)
    results.write_views(rows, a.run_dir, meta)
    print(results.summary_text(rows, a.run_dir, width=_width()), end="")
    print(f"rebuilt {a.run_dir}/report.html, results.csv, junit.xml, diff_tables.txt")
    return 0


def cmd_diff(a) -> int:
    from pathlib import Path

    from verify.report import rundiff

    d = rundiff.compare_runs(a.run_a, a.run_b, a.factor)
    print(rundiff.terminal(d, width=_width()), end="")
    html = Path(a.html or Path(a.run_b) / f"diff-{Path(a.run_a).name}.html")
    rundiff.write_html(d, html)
    print(f"HTML: {html}")
    return 1 if d.regressed else 0


def cmd_hunt(a) -> int:
    """``verify hunt``: exit 1 when it found failing inputs, 0 when not."""
    import time

    from verify import notices
    from verify.running import hunt
    started = time.time()

    def progress(done, total, kernel):  # cases done and left, rate, ETA: every round
        print(notices.progress_text(done, total, time.time() - started, now=kernel),
              file=sys.stderr)

    result = hunt.hunt(a.op, a.backend, kernels=a.kernels, dtypes=a.dtype or None,
                       budget=a.budget or hunt.DEFAULT_BUDGET, seed=a.seed, kernel=a.kernel,
                       max_elements=a.max_elements or hunt.MAX_ELEMENTS, reports=a.reports,
                       run_id=a.run_id, store=a.store, case_timeout=a.case_timeout,
                       progress=progress, workers=a.workers, ray=a.ray)
    print(hunt.summary(result), end="")
    if a.shrink and result.found:
        _print_shrunk(result.run_dir, None, None, a.store)
    return result.exit_status


def _print_shrunk(run_dir, case, out, store, kernels=()) -> None:
    from verify.running import shrink
    for s in shrink.shrink(run_dir, case=case, out=out, store=store, kernels=kernels):
        before, after = s["elements"]
        print(f"{s['id']}: shape {s['entry']['shape']} ({after} elements, was {before}; "
              f"{s['tries']} cases tried): {s['case_file']}, {s['repro']}")


def cmd_shrink(a) -> int:
    _print_shrunk(a.run_dir, a.case, a.out, a.store, a.kernels)
    return 0


def cmd_strategies(a) -> int:
    from pathlib import Path

    import pandas as pd

    from verify.specs import registry
    from verify.report import results
    from verify.cases import selection
    from verify.running import strategies

    for module in a.kernels:
        registry.load_user_module(module)
    op_name = selection.expand_op_names([a.op])[0]
    rows, comparison = strategies.run(op_name, a.level, a.cases, a.dtype or None, a.repeats,
                                      a.store)
    out = strategies.text(comparison, width=_width())
    print(out, end="")
    run_dir = Path(a.reports or os.environ.get("VERIFY_REPORTS", "reports")) / (
        a.run_id or results.new_run_id())
    meta = {"run_id": run_dir.name, "level": a.level, "strategies": comparison,
            "environment": results.environment()}
    results.write(rows, run_dir, meta)
    pd.DataFrame(comparison["table"]).to_csv(run_dir / "strategies.csv", index=False)
    (run_dir / "strategies.txt").write_text(out)
    print(f"reports in {run_dir} (report.html, strategies.csv, strategies.txt)")
    return 1 if any(r["verdict"] == "ERROR" for r in rows) else 0


def _width() -> int:
    import shutil
    return max(100, shutil.get_terminal_size((160, 40)).columns)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_golden(a) -> int:
    from rich.console import Console
    from rich.table import Table

    from verify.cases import selection
    from verify.golden import compute_floor
    from verify.golden.store import GoldenStore, default_store_dir, existing_store_dir

    console = Console(highlight=False)
    if a.golden_command == "warm":
        return _warm(a, a.store or default_store_dir(), console)
    if a.golden_command == "audit":
        return _audit(a, console)
    if a.golden_command == "resolve":
        return _resolve(a, console)
    # commands that read a store refuse a folder that is not there (never create one)
    store_dir = existing_store_dir(a.store)
    if a.golden_command == "ls":
        store = GoldenStore(store_dir)
        table = Table(title=f"goldens in {store_dir}", header_style="bold")
        for col in ("key", "op", "case", "golden version", "size", "created"):
            table.add_column(col)
        entries = store.entries()
        for e in entries:
            created = datetime.datetime.fromtimestamp(e.created).isoformat(timespec="seconds")
            table.add_row(e.key[:16], e.op, e.case_id, e.golden_version, _human(e.size), created)
        console.print(table)
        stats = store.stats()
        console.print(f"{stats['goldens']} goldens, {_human(stats['bytes'])}")
        return 0
    if a.golden_command == "check":
        store = GoldenStore(store_dir)
        bad = store.check()
        for e, problem in bad:
            console.print(f"[red]corrupt[/] {e.key[:16]} {e.op} {e.case_id}: {problem}")
        console.print(f"checked {store.stats()['goldens']} goldens: {len(bad)} corrupt")
        return 1 if bad else 0
    if a.golden_command == "gc":
        store = GoldenStore(store_dir)
        live = compute_floor.live_golden_keys(a.cases or selection.default_case_sources())
        result = store.gc(live)
        console.print(f"removed {result['entries_removed']} goldens no case refers to, "
                      f"freed {_human(result['bytes_freed'])}; {store.stats()['goldens']} kept")
        return 0
    return 2


def _audit(a, console) -> int:
    from rich.table import Table

    from verify.golden import audit
    from verify.specs import registry
    from verify.golden.store import GoldenStore, existing_store_dir

    for module in a.kernels:
        registry.load_user_module(module)
    if a.writer and not a.registry:
        raise ConfigError("--writer ID audits a registry's goldens: give --registry URL")
    if a.registry:
        where = a.registry + (f" written by {a.writer}" if a.writer else "")
        findings, total = audit.audit_registry(a.registry, 1.0 if a.writer else a.sample,
                                               a.seed, writer=a.writer)
    else:
        where = existing_store_dir(a.store)
        findings, total = audit.audit_store(GoldenStore(where), a.sample, a.seed)
    shown = [f for f in findings if f.status != audit.OK]
    if shown:
        table = Table(title=f"goldens of {where} that are not ok", header_style="bold")
        for col in ("key", "op", "case", "status", "detail"):
            table.add_column(col)
        for f in shown:
            style = "red" if f.status == audit.DIFFERS else ""
            table.add_row(f.key[:16], f.op, f.case_id, f"[{style}]{f.status}[/]" if style
                          else f.status, f.detail)
        console.print(table)
    counts = {s: sum(f.status == s for f in findings)
              for s in (audit.OK, audit.DIFFERS, audit.STALE, audit.SKIPPED)}
    console.print(f"audited {len(findings)} of {total} goldens in {where}: "
                  f"{counts[audit.OK]} ok, {counts[audit.DIFFERS]} differ, "
                  f"{counts[audit.STALE]} stale, {counts[audit.SKIPPED]} skipped")
    return 1 if counts[audit.DIFFERS] else 0


def _resolve(a, console) -> int:
    from verify.golden.registry_client import RegistryClient, RegistryUnavailable
    from verify.golden.store import valid_key
    url = a.registry or os.environ.get("VERIFY_REGISTRY")
    if not url:
        raise ConfigError("verify golden resolve needs --registry URL (or VERIFY_REGISTRY)")
    if not valid_key(a.key):
        raise ConfigError(f"{a.key!r} is not a golden key (64 lowercase hex digits)")
    admin = os.environ.get("VERIFY_REGISTRY_ADMIN_TOKEN")
    if not admin:
        raise ConfigError("verify golden resolve needs the registry's admin token in "
                          "VERIFY_REGISTRY_ADMIN_TOKEN")
    try:
        status, text = RegistryClient(url).resolve(a.key, "drop" if a.drop else "keep", admin)
    except RegistryUnavailable as exc:
        raise ConfigError(f"registry {url}: {exc}") from None
    if status != 200:
        console.print(f"[red]refused[/] HTTP {status}: {text}")
        return 1
    console.print(f"golden {a.key[:16]}: {'dropped' if a.drop else 'kept, dispute cleared'}")
    return 0


def _warm(a, store_dir: str, console) -> int:
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    from verify.golden import source as golden_source
    from verify.specs import registry
    from verify.cases import selection

    cases = selection.select_cases(selection.Selection(
        level=a.level, cases_dir=a.cases, ops=a.op or None, dtypes=a.dtype or None))
    resolver = golden_source.configure(store_dir, a.registry, a.registry_required,
                                       a.verify_fetched)
    todo, seen = [], set()
    for case in cases:
        spec = registry.op(case.op)
        key = case.golden_key(spec.golden_version)
        if case.expect_error or key in seen:
            continue
        seen.add(key)
        todo.append((spec, case))
    counts = {"computed": 0, "local": 0, "registry": 0}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("warming goldens", total=len(todo))
        for spec, case in todo:
            progress.update(task, description=f"{case.op} {case.level}-{case.id}")
            counts[resolver.get(spec, case).source] += 1
            progress.advance(task)
    console.print(f"{len(todo)} goldens ready in {store_dir}: {counts['computed']} computed, "
                  f"{counts['registry']} fetched, {counts['local']} already stored")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="verify: %(message)s", force=True)
    # the command line as the user typed it, for the report (sys.argv[0] is the entry
    # point's path, .../bin/verify or .../verify/cli.py, and workers see their own argv)
    os.environ.setdefault("VERIFY_COMMAND", shlex.join(
        ["verify", *(sys.argv[1:] if argv is None else list(argv))]))
    args = _parser().parse_args(argv)
    if args.command in ("run", "judge") and args.kernels and not os.environ.get(FINISHED_ENV):
        return _guarded(sys.argv[1:] if argv is None else list(argv))
    commands = {"run": cmd_run, "judge": cmd_judge, "hunt": cmd_hunt, "shrink": cmd_shrink, "ops": cmd_ops, "serve": cmd_serve, "golden": cmd_golden,
                "report": cmd_report, "merge": cmd_merge, "diff": cmd_diff,
                "strategies": cmd_strategies}
    try:
        code = commands[args.command](args)
    except ConfigError as exc:
        print(f"verify: error: {exc}", file=sys.stderr)
        code = 2
    mark_finished(code)
    if argv is None and args.command in ("run", "judge", "merge", "report"):
        # the `verify` command itself (not a caller of main(argv)): everything is written;
        # skip the interpreter's teardown of torch, numba and pytest (~0.5 s a run)
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        from verify.golden.store import close_all
        close_all()
        os._exit(code)
    return code


def _guarded(argv: list[str]) -> int:
    """``verify run --kernels ...`` in a child process: user code imported here can end
    the process with ``os._exit(0)`` (at import, say), which nothing in-process can catch
    and which would read as a green run. The child says when it finished; an exit without
    that is exit 2. The parent imports nothing heavy, so this costs one interpreter start."""
    import signal
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="verify-run-") as tmp:
        marker = os.path.join(tmp, "finished")
        env = {**os.environ, FINISHED_ENV: marker}
        from verify.running.isolation import die_with_parent
        child = subprocess.Popen([sys.executable, "-m", "verify.cli", *argv], env=env,
                                 preexec_fn=die_with_parent)  # SIGKILL here ends it too

        def forward(signum, frame):  # SIGTERM to this process ends the run, not only us
            child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:
                # Ctrl-C at a terminal reaches the child too (same process group): pass it
                # on only if the child did not react, as when the parent alone was signalled
                try:
                    code = child.wait(timeout=10.0)
                    break
                except subprocess.TimeoutExpired:
                    child.send_signal(signal.SIGINT)
        if os.path.exists(marker):
            return code
    if code < 0:
        print(f"verify: error: the run was killed by signal {-code} before it finished",
              file=sys.stderr)
        return 2
    print(f"verify: error: the run ended with status {code} before it finished, without a "
          f"result: code in a --kernels module (or a kernel it ran at import) ended the "
          f"process (os._exit?)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
