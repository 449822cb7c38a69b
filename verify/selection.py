"""What a run covers: cases (folder, levels, ops, dtypes) x kernels (backends, modules).

Shared by ``verify run``, the pytest plugin and ``verify.run()``, so every entry point
rejects the same mistakes with the same message (exit 2).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from . import dtypes as dt
from . import registry
from .cases import Case, load_dir
from .errors import ConfigError

DEFAULT_CASES = "test_cases"


def default_cases_dir() -> str:
    """--cases, else VERIFY_CASES, else ./test_cases, else the repo's own test_cases."""
    env = os.environ.get("VERIFY_CASES")
    if env:
        return env
    if Path(DEFAULT_CASES).is_dir():
        return DEFAULT_CASES
    repo = Path(__file__).resolve().parent.parent / DEFAULT_CASES
    return str(repo)


@dataclass
class Selection:
    level: str | Sequence[str] | None = "L0"
    cases_dir: str | None = None
    ops: Sequence[str] | None = None
    dtypes: Sequence[str] | None = None
    backends: Sequence[str] | None = None
    kernel_modules: Sequence[str] = field(default_factory=list)

    def levels(self) -> list[str] | None:
        if self.level is None or self.level == "all":
            return None
        raw = [self.level] if isinstance(self.level, str) else list(self.level)
        return [part.strip() for item in raw for part in item.split(",") if part.strip()]


@dataclass
class Plan:
    items: list[tuple[Case, registry.Kernel]]
    cases: list[Case]
    backends: list[str]


def expand_op_names(names: Sequence[str]) -> list[str]:
    known = registry.ops()
    out = []
    for name in names:
        if name in known:
            out.append(name)
            continue
        alias = [o for o in known if name in registry.op(o).aliases]
        if not alias:
            raise ConfigError(f"unknown op '{name}' (--op); known ops: {', '.join(known)}")
        out.extend(alias)
    return out


def select_cases(sel: Selection) -> list[Case]:
    """The cases of the selection (folder, levels, ops, dtypes); ConfigError if none."""
    registry.load_builtin()
    for module in sel.kernel_modules or ():
        registry.load_user_module(module)
    ops = expand_op_names(sel.ops) if sel.ops else None
    dtypes = None
    if sel.dtypes:
        try:
            dtypes = {dt.canonical_name(d) for d in sel.dtypes}
        except KeyError as exc:
            raise ConfigError(f"unknown dtype {exc} (--dtype); known: "
                              f"{', '.join(dt.DTYPE_NAMES)}") from None
    cases_dir = sel.cases_dir or default_cases_dir()
    cases = load_dir(cases_dir, ops)
    levels = sel.levels()
    if levels is not None:
        known_levels = sorted({c.level for c in cases})
        missing = [lv for lv in levels if lv not in known_levels]
        if missing and len(missing) == len(levels):
            raise ConfigError(f"no cases at level {', '.join(missing)} in {cases_dir} "
                              f"(levels there: {', '.join(known_levels) or 'none'})")
        cases = [c for c in cases if c.level in levels]
    if dtypes is not None:
        cases = [c for c in cases if c.dtype in dtypes]
    if not cases:
        raise ConfigError(f"no cases selected in {cases_dir} (level {sel.level}, ops "
                          f"{list(sel.ops or []) or 'all'}, dtypes {sorted(dtypes or []) or 'all'})")
    return cases


def build(sel: Selection) -> Plan:
    cases = select_cases(sel)
    all_backends = registry.backends()
    if sel.backends:
        for b in sel.backends:
            registry.backend(b)  # unknown -> ConfigError
            ok, why = all_backends[b].available()
            if not ok:
                raise ConfigError(f"backend '{b}' was asked for but is not available here: {why}")
        backends = list(dict.fromkeys(sel.backends))
    else:
        backends = [b for b, spec in all_backends.items() if spec.default]
    items = [(c, k) for c in cases for k in registry.kernels(c.op, backends)]
    if not items:
        raise ConfigError(f"no kernel of backend(s) {', '.join(backends)} for the selected "
                          f"ops ({', '.join(sorted({c.op for c in cases}))})")
    return Plan(items=items, cases=cases, backends=backends)


def live_golden_keys(cases_dirs: list[str]) -> set[str]:
    """Keys of every case (all levels) in these folders under today's golden versions."""
    keys = set()
    for folder in cases_dirs:
        for case in load_dir(folder):
            if not case.expect_error:
                keys.add(case.golden_key(registry.op(case.op).golden_version))
    return keys
