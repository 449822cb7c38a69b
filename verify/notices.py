"""Run-level warnings users must see: a corrupt golden recomputed, the registry
unavailable, the golden store degraded. Logged as they happen, and kept, so the plugin
carries them from xdist workers to the controller, past pytest's log capture, into the
terminal summary and the report (``meta.warnings``)."""
from __future__ import annotations

import contextlib
import contextvars
import logging

log = logging.getLogger("verify")
MAX_KEPT = 200
# the kept warnings of the run this code runs in: a run (verify.run) opens its own with
# ``collecting()``, so two runs in two threads keep theirs apart; outside a run, the
# process's own (insertion-ordered, deduplicated)
_PROCESS: dict[str, None] = {}
_CURRENT: contextvars.ContextVar[dict[str, None] | None] = contextvars.ContextVar(
    "verify_notices", default=None)


def _kept() -> dict[str, None]:
    kept = _CURRENT.get()
    return _PROCESS if kept is None else kept


def warn(text: str) -> None:
    """Log ``text`` and keep it for the run's summary (once per distinct text)."""
    kept = _kept()
    if text in kept:
        return
    log.warning(text)
    if len(kept) < MAX_KEPT:
        kept[text] = None


def drain() -> list[str]:
    """The warnings kept since the last drain."""
    kept = _kept()
    out = list(kept)
    kept.clear()
    return out


@contextlib.contextmanager
def collecting():
    """Keep the warnings of the code inside apart from any other run's."""
    token = _CURRENT.set({})
    try:
        yield
    finally:
        _CURRENT.reset(token)


def progress_text(done: int, total: int, elapsed: float, now: str = "") -> str:
    """A progress line: cases done and left, the rate so far and the time left at that
    rate (the built-in L1 takes minutes: a user wants to know how many)."""
    def clock(seconds: float) -> str:
        s = int(seconds)
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 \
            else f"{s // 60}:{s % 60:02d}"

    rate = done / elapsed if elapsed > 0 else 0.0
    eta = f"ETA {clock((total - done) / rate)}" if rate > 0 else "ETA unknown"
    doing = f", now {now}" if now else ""
    return (f"verify: {done}/{total} cases done, {total - done} left{doing}, "
            f"{rate:.3g} cases/s, {clock(elapsed)} elapsed, {eta}")
