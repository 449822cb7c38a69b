"""What a run covers: cases (folder, levels, ops, dtypes) x kernels (backends, modules).

Shared by ``verify run``, the pytest plugin and ``verify.run()``, so every entry point
rejects the same mistakes with the same message (exit 2).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from verify.comparator import dtypes as dt
from verify.specs import registry
from verify.cases import recorded
from verify.cases.case import Case, load_dir, load_file
from verify.errors import ConfigError, unknown_name

def builtin_cases_dir() -> str:
    """The built-in op pack's case files: verify/test_cases in an installed wheel, the
    repo's test_cases/ in a checkout (or an editable install)."""
    here = Path(__file__).resolve().parent.parent  # the verify package
    for folder in (here / "test_cases", here.parent / "test_cases"):
        if folder.is_dir():
            return str(folder)
    raise ConfigError(f"the built-in case files are missing (looked in {here / 'test_cases'})")


def default_case_sources() -> list[str]:
    """Without --cases: VERIFY_CASES, or the built-in cases plus the case file or folder
    each declared op names (``declare_op(..., cases=...)``: user and installed op packs)."""
    if os.environ.get("VERIFY_CASES"):
        return [os.environ["VERIFY_CASES"]]
    sources = [builtin_cases_dir()]
    for name in registry.ops():
        path = registry.op(name).cases
        if path and path not in sources:
            if not Path(path).exists():
                raise ConfigError(f"op '{name}' ({registry.op(name).where}) names case file "
                                  f"or folder '{path}', which does not exist")
            sources.append(path)
    return sources


def load_sources(sources: Sequence[str], ops=None, summary=None) -> list[Case]:
    """Cases of several folders or single files; ``summary`` (recorded.Summary) gathers
    what recorded sources did not judge."""
    cases: list[Case] = []
    for src in sources:
        if recorded.is_recorded_source(src):  # an msprobe dump or a capture folder
            cases.extend(recorded.load(src, ops, summary))
        elif Path(src).is_file():
            found = load_file(src)
            cases.extend(c for c in found if ops is None or c.op in ops)
        else:
            cases.extend(load_dir(src, ops))
    return cases


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
    recorded: recorded.Summary = field(default_factory=recorded.Summary)


def expand_op_names(names: Sequence[str]) -> list[str]:
    known = registry.ops()
    out = []
    for name in names:
        if name in known:
            out.append(name)
            continue
        alias = [o for o in known if name in registry.op(o).aliases]
        if not alias:
            raise ConfigError(unknown_name("op", name, known, "--op"))
        out.extend(alias)
    return out


def select_cases(sel: Selection, summary=None) -> list[Case]:
    """The cases of the selection (folder, levels, ops, dtypes); ConfigError if none.
    ``summary`` (recorded.Summary) gathers what recorded sources did not judge."""
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
    sources = [sel.cases_dir] if sel.cases_dir else default_case_sources()
    cases_dir = ", ".join(sources)
    cases = load_sources(sources, ops, summary)
    levels = sel.levels()
    if levels is not None:
        known_levels = sorted({c.level for c in cases})
        missing = [lv for lv in levels if lv not in known_levels]
        if missing and len(missing) == len(levels) and not any(c.source for c in cases):
            raise ConfigError(f"no cases at level {', '.join(missing)} in {cases_dir} "
                              f"(levels there: {', '.join(known_levels) or 'none'})")
        # recorded calls have one level of their own ("recorded"): any level keeps them
        cases = [c for c in cases if c.level in levels or c.source is not None]
    if dtypes is not None:
        cases = [c for c in cases if c.dtype in dtypes]
    if not cases:
        hint = ""
        if ops and not sel.cases_dir:
            bare = [o for o in ops if not registry.op(o).cases and not any(
                Path(src, f"{o}.json").is_file() for src in sources)]
            if bare:
                hint = (f"; op(s) {', '.join(bare)} have no case file here: pass --cases DIR "
                        f"or declare the op with cases='my_op.json'")
        raise ConfigError(f"no cases selected in {cases_dir} (level {sel.level}, ops "
                          f"{list(sel.ops or []) or 'all'}, dtypes "
                          f"{sorted(dtypes or []) or 'all'}){hint}")
    return cases


def build(sel: Selection) -> Plan:
    summary = recorded.Summary()
    cases = select_cases(sel, summary)
    if any(c.source is not None for c in cases) or "recorded" in (sel.backends or ()):
        recorded.register_backend(cases)
    registry.load_backends(sel.backends or
                           [b for b, spec in registry.backends().items() if spec.default])
    all_backends = registry.backends()
    if sel.backends:
        for b in sel.backends:
            registry.backend(b)  # unknown -> ConfigError
            ok, why = all_backends[b].available()
            if not ok:
                raise ConfigError(f"backend '{b}' was asked for but is not available here: {why}")
        backends = list(dict.fromkeys(sel.backends))
    else:  # every default backend that can run here (the others are named in the summary)
        backends = [b for b, spec in all_backends.items()
                    if spec.default and (not registry.optional_backend(b)
                                         or spec.available()[0])]
    # the recorded backend judges recorded calls only: it has no outputs for other cases
    items = [(c, k) for c in cases for k in registry.kernels(c.op, backends)
             if recorded.runs(c, k)]
    if not items:
        raise ConfigError(f"no kernel of backend(s) {', '.join(backends)} for the selected "
                          f"ops ({', '.join(sorted({c.op for c in cases}))})")
    return Plan(items=items, cases=cases, backends=backends, recorded=summary)


def check_count(value, option: str, most: int = 1_000_000) -> int:
    """A whole number of repetitions for ``option`` (0 .. most)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ConfigError(f"--{option} must be a whole number from 0 to {most}, not {value!r}")
    return value


def check_benchmark_backend(name: str | None) -> str | None:
    """--benchmark-backend: a known backend that can run here (exit 2 otherwise)."""
    if not name:
        return None
    b = registry.backend(name)  # unknown -> ConfigError
    registry.load_backends([name])
    ok, why = registry.backend(name).available()
    if not ok:
        raise ConfigError(f"--benchmark-backend {b.name} is not available here: {why}")
    return name


def unavailable_backends() -> list[str]:
    """'name: why' for each default backend that cannot run here (its rows are not made;
    the summary says so once)."""
    return [f"{name}: {spec.available()[1]}" for name, spec in registry.backends().items()
            if spec.default and registry.optional_backend(name) and not spec.available()[0]]


def check_keyword(expr: str | None) -> None:
    """A -k expression pytest can parse, checked before any report folder or worker
    exists (a bad one broke xdist's controller with an INTERNALERROR)."""
    if not expr:
        return
    try:
        from _pytest.mark.expression import Expression
        Expression.compile(expr)
    except ImportError:  # another pytest's internals: pytest itself will say
        return
    except SyntaxError as exc:
        raise ConfigError(f"-k {expr!r}: wrong expression passed to '-k': {exc}") from None


def check_environment() -> None:
    """Settings from the environment that would otherwise fail every case, checked once
    as a usage error (exit 2): VERIFY_TORCH_DEVICE must be a device torch knows and this
    machine has; VERIFY_REGISTRY must be a URL."""
    import torch
    wanted = os.environ.get("VERIFY_TORCH_DEVICE")
    if wanted:
        try:
            dev = torch.device(wanted)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"VERIFY_TORCH_DEVICE={wanted!r} is not a torch device: "
                              f"{exc}") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"VERIFY_TORCH_DEVICE={wanted!r}: this machine has no CUDA "
                              f"device (torch {torch.__version__}); unset it to run on the CPU")
        if dev.type == "cuda" and dev.index is not None \
                and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"VERIFY_TORCH_DEVICE={wanted!r}: only "
                              f"{torch.cuda.device_count()} CUDA device(s) here")
        if dev.type not in ("cpu", "cuda", "meta") and not hasattr(torch, dev.type):
            raise ConfigError(f"VERIFY_TORCH_DEVICE={wanted!r}: torch has no {dev.type} "
                              f"backend here (torch_npu for npu)")
    check_registry_url(os.environ.get("VERIFY_REGISTRY"), "VERIFY_REGISTRY")


def check_registry_url(url: str | None, where: str = "--registry") -> None:
    if not url:
        return
    from urllib.parse import urlsplit
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise ConfigError(f"{where}={url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}={url!r} is not an http(s) URL with a host")
