"""Run-level warnings users must see: a corrupt golden recomputed, the registry
unavailable, the golden store degraded. Logged as they happen, and kept, so the plugin
carries them from xdist workers to the controller, past pytest's log capture, into the
terminal summary and the report (``meta.warnings``)."""
from __future__ import annotations

import logging

log = logging.getLogger("verify")
_SEEN: dict[str, None] = {}  # insertion-ordered, deduplicated
MAX_KEPT = 200


def warn(text: str) -> None:
    """Log ``text`` and keep it for the run's summary (once per distinct text)."""
    if text in _SEEN:
        return
    log.warning(text)
    if len(_SEEN) < MAX_KEPT:
        _SEEN[text] = None


def drain() -> list[str]:
    """The warnings kept since the last drain."""
    out = list(_SEEN)
    _SEEN.clear()
    return out


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
