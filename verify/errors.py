"""Error types that map to the run's exit status.

ConfigError (exit 2) is a problem with what the user gave us: a case file, an option, an
unknown op. Anything a kernel raises is not an error of the run: it becomes an ERROR row.
"""
from __future__ import annotations

import os


class ConfigError(Exception):
    """A usage or configuration error; the run exits with status 2."""


class CaseFileError(ConfigError):
    """A bad case file: the message names the file, the case id and the JSON path."""

    def __init__(self, file: str, message: str, case_id: str | None = None,
                 json_path: str | None = None):
        self.file = file
        self.case_id = case_id
        self.json_path = json_path
        where = [f"{file}"]
        if case_id:
            where.append(f"case '{case_id}'")
        if json_path:
            where.append(f"at {json_path}")
        super().__init__(": ".join([", ".join(where), message]))


class Unsupported(Exception):
    """Raised by a kernel for inputs or params it does not implement (a GELU without the
    erf form, a backward it does not have): its rows are SKIP with this reason, not ERROR."""


def unknown_name(kind: str, name: str, known, flag: str = "") -> str:
    """'unknown op 'lino' (--op): did you mean 'lion'? ...': the closest known names, or,
    when none is close, the hint that user ops and backends come from --kernels modules;
    the full list last."""
    import difflib
    known = sorted(known)
    where = f" ({flag})" if flag else ""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    else:
        hint = (f"no {kind} of that name is declared here: is it declared in a --kernels "
                f"module (or an op pack) that this run does not load?")
    return f"unknown {kind} '{name}'{where}: {hint} Known {kind}s: {', '.join(known)}"


# -- how a run ends: a guarding parent process reads this (verify/cli.py) ----------
FINISHED_ENV = "VERIFY_FINISHED_FILE"


def mark_finished(code: int) -> None:
    """Tell a guarding parent (verify/cli.py _guarded) that this run ended through
    our own code."""
    path = os.environ.get(FINISHED_ENV)
    if path:
        with open(path, "w") as f:
            f.write(str(code))
