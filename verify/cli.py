"""The ``verify`` command.

``verify run`` checks the selection first (a usage error exits 2 before anything runs),
then runs the case items through pytest (so ``-n N`` spreads them over xdist workers)
and maps pytest's exit codes onto ours: 0 all PASS, 1 any FAIL or ERROR, 2 usage.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import registry, selection
from .errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="verify", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="verify kernels against their float64 goldens")
    run.add_argument("--level", default="L0", help="L0, L1, 'L0,L1' or 'all' (default L0)")
    run.add_argument("--cases", default=None, help="folder of case files (default test_cases/)")
    run.add_argument("--kernels", action="append", default=[],
                     help="your kernel module: dotted name or .py path; repeatable")
    run.add_argument("--backend", action="append", default=[],
                     help="run only this backend (e.g. torch, mutants, yours); repeatable")
    run.add_argument("--op", action="append", default=[], help="only this op; repeatable")
    run.add_argument("--dtype", action="append", default=[],
                     help="only this working dtype; repeatable")
    run.add_argument("-n", "--workers", default=None,
                     help="pytest-xdist workers (a number or 'auto')")
    run.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    run.add_argument("--reports", default=None, help="report folder (default reports/)")
    run.add_argument("--run-id", default=None, help="name of this run's report folder")
    run.add_argument("-v", "--verbose", action="store_true", help="one line per item")

    ls = sub.add_parser("ops", help="list the registered ops, their kernels and standards")
    ls.add_argument("--kernels", action="append", default=[])
    return p


def _pytest_args(a) -> list[str]:
    args = ["-p", "no:cacheprovider", "--level", a.level]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        args = ["-p", "verify"] + args
    for flag, values in (("--kernels", a.kernels), ("--backend", a.backend), ("--op", a.op),
                         ("--dtype", a.dtype)):
        for v in values:
            args += [flag, v]
    for flag, value in (("--cases", a.cases), ("--reports", a.reports),
                        ("--run-id", a.run_id), ("-k", a.keyword)):
        if value:
            args += [flag, value]
    if a.workers and a.workers not in ("0", "1"):
        args += ["-n", str(a.workers)]
    args += ["-v"] if a.verbose else ["-q"]
    return args


def cmd_run(a) -> int:
    import pytest

    sel = selection.Selection(level=a.level, cases_dir=a.cases, ops=a.op or None,
                              dtypes=a.dtype or None, backends=a.backend or None,
                              kernel_modules=a.kernels)
    selection.build(sel)  # usage errors surface here with exit 2
    code = int(pytest.main(_pytest_args(a)))
    if code in (0, 1):
        return code
    if code == 5:
        print("verify: no case matched the selection", file=sys.stderr)
    return 2


def cmd_ops(a) -> int:
    for module in a.kernels:
        registry.load_user_module(module)
    for name in registry.ops():
        spec = registry.op(name)
        kerns = ", ".join(k.id for k in registry.kernels(name))
        print(f"{name}  dtypes={','.join(spec.dtypes)}  standard={spec.standard}  "
              f"kernels=[{kerns}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(args)
        return cmd_ops(args)
    except ConfigError as exc:
        print(f"verify: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
