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
