"""The PyPTO backend (PyPI ``pypto``, pinned to 0.2.0).

On an NPU the kernels run with run_mode NPU. On a CPU they run as a functional reference
through PyPTO's pass-verify evaluator (SIM mode): it evaluates the kernel's tile graph
(views, tails, assembles, casts, operation order) on the CPU, not NPU arithmetic. The
cost model's modelled "AICore End-to-End Time" is recorded per case (``aicore_time_us``).
Each case runs in a subprocess (kernels/pypto/worker.py) with PyPTO's output folders in a
temporary folder; the calculator library is built once and cached (_internals.py).
It is not run by default (a case costs seconds): ``--backend pypto``.
"""
from __future__ import annotations

import importlib.util
import shutil
from importlib import metadata

from verify.specs.registry import Backend, register_backend

from ._internals import PINNED


def _check() -> tuple[bool, str]:
    if importlib.util.find_spec("pypto") is None:
        return False, f"pypto is not installed (pip install pypto=={PINNED})"
    version = metadata.version("pypto")
    if version != PINNED:
        return False, f"pypto {version} is installed; this backend is written for {PINNED}"
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            return False, f"{tool} is needed to build PyPTO's calculator library"
    return True, ""


def _versions() -> dict:
    try:
        return {"pypto": metadata.version("pypto"), "mode": "pass-verify (SIM) on the CPU"}
    except metadata.PackageNotFoundError:
        return {"pypto": "not installed"}


BACKEND = register_backend(Backend(
    "pypto", device="cpu", check=_check, versions=_versions, default=False,
    isolation="subprocess",
    max_elements=1 << 18, note="PyPTO pass-verify functional reference on the CPU, a "
                               "subprocess per case"))
