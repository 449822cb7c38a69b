"""Time limits of a case (``--case-timeout``): a hung kernel is one ERROR row, and the
run goes on.

The limit is an interval timer: SIGALRM raises ``CaseTimeout`` in the thread running the
case (a BaseException, so a kernel's own ``except Exception`` cannot swallow it). Code
that never returns to the interpreter (a C loop, a blocked signal) cannot be interrupted
that way, so a watchdog thread calls ``on_stuck`` a grace period later: in an isolated
worker it ends the worker, whose case becomes an ERROR row on the controller.
"""
from __future__ import annotations

import contextlib
import math
import signal
import threading
import time

# Per level when --case-timeout is not given: L0 is quick by contract; wider levels and
# network shapes compute large float64 goldens. 0 (asked for) is no limit.
DEFAULT_SECONDS = {"L0": 300.0, "L1": 1800.0}
OTHER_LEVELS_SECONDS = 7200.0
STUCK_GRACE = 10.0  # seconds past the limit before the watchdog acts


class CaseTimeout(BaseException):
    """The case ran past its time limit."""

    def __init__(self, seconds: float):
        super().__init__(f"timed out after {seconds:g} s")
        self.seconds = seconds


def check_seconds(value, where: str = "--case-timeout") -> float | None:
    """None (the level's default), or a finite number of seconds >= 0 (0: no limit)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        from verify.errors import ConfigError
        raise ConfigError(f"{where} must be a number of seconds >= 0 (0: no limit), "
                          f"not {value!r}")
    return seconds


def seconds_for(level: str, asked: float | None) -> float:
    """The limit of a case of ``level``: the one asked for, else the level's default."""
    if asked is not None:
        return asked
    return DEFAULT_SECONDS.get(level, OTHER_LEVELS_SECONDS)


def _can_alarm() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


class _Watchdog:
    """One daemon thread per process that calls the armed ``on_stuck`` when its deadline
    passes: starting a thread per case cost about a millisecond each."""

    def __init__(self):
        self._cond = threading.Condition()
        self._armed = None  # (deadline on the monotonic clock, on_stuck, seconds)
        self._thread = None

    def arm(self, seconds: float, on_stuck) -> None:
        with self._cond:
            self._armed = (time.monotonic() + seconds + STUCK_GRACE, on_stuck, seconds)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="verify-watchdog",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._armed = None
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._armed is None:
                    self._cond.wait()
                    continue
                deadline, on_stuck, seconds = self._armed
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._armed = None
                self._cond.release()
                try:
                    on_stuck(seconds)
                finally:
                    self._cond.acquire()


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def time_limit(seconds: float, on_stuck=None):
    """Raise CaseTimeout in this thread after ``seconds`` (0: no limit); call
    ``on_stuck(seconds)`` from the watchdog thread if the code is still running
    STUCK_GRACE seconds later."""
    if not seconds or seconds <= 0:
        yield
        return
    if on_stuck is not None:
        _WATCHDOG.arm(seconds, on_stuck)
    alarm = _can_alarm()
    if alarm:
        def on_alarm(signum, frame):
            raise CaseTimeout(seconds)
        previous = signal.signal(signal.SIGALRM, on_alarm)
        # the caller's own alarm (an embedding program's time limit) is put back after
        # the case with the time it had left, and fires at once if that ran out meanwhile
        callers, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
        started = time.monotonic()
    try:
        yield
    finally:
        if on_stuck is not None:
            _WATCHDOG.disarm()
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if callers > 0:
                left = callers - (time.monotonic() - started)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), interval)
