"""One run's settings, built once by whoever starts the run (``verify.run``, ``verify
judge``, the pytest plugin, a Ray task) and passed down to every case. It replaces the
module-level settings the runner once read (``runner.TIMING``, ``CASE_LIMIT``,
``BENCHMARK``, the golden source's global resolver): two runs in two threads of one
process each see their own.

What a case is doing right now (its phase, for a time-out's reason, and the figures a
kernel notes) is the running thread's: ``CaseState`` in a thread-local, never shared
between runs."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from verify.golden import source as golden_source


@dataclass(frozen=True)
class RunContext:
    """Settings of one run, immutable once built.

    resolver: where goldens come from (the store, the registry, computed) and where
    computed ones go; case_timeout: seconds a case may run (None: the level's default,
    0: no limit); on_stuck(seconds, phase): what the watchdog does when a case never
    returns to Python past its limit (end the worker, end a serial run, or None: only
    the time-out row); time_repeats: kernel calls timed per case (0: none);
    benchmark_backend: msprobe's benchmark standard against this backend's kernels."""

    resolver: golden_source.GoldenResolver = field(default_factory=golden_source.resolver)
    case_timeout: float | None = None
    on_stuck: Callable[[float, str], None] | None = None
    time_repeats: int = 0
    benchmark_backend: str | None = None


_DEFAULT: list[RunContext] = []
_DEFAULT_LOCK = threading.Lock()


def default() -> RunContext:
    """The context of a case run without one (``runner.run_case(case, kern)`` from a
    user's script): the default store (VERIFY_STORE) and registry, no timing."""
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            _DEFAULT.append(RunContext())
        return _DEFAULT[0]


@dataclass
class CaseState:
    """The running case: what it is doing (for a time-out's reason) and the figures its
    kernel noted (``runner.note``: PyPTO's modelled AICore time, say)."""

    phase: str = "starting"
    notes: dict = field(default_factory=dict)


_LOCAL = threading.local()


def case_state() -> CaseState:
    state = getattr(_LOCAL, "case", None)
    if state is None:
        state = _LOCAL.case = CaseState()
    return state


def new_case_state() -> CaseState:
    _LOCAL.case = CaseState()
    return _LOCAL.case
