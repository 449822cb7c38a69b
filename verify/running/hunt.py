"""``verify hunt``: search an op's input space for the inputs where a kernel is least
precise, within a budget of kernel calls, deterministic for a seed.

The space is the op's own declaration (narrowed or extended by its ``hunt=``):
- shapes within its rank range, with extents from lengths kernels get wrong (1,
  2^k - 1, 2^k, 2^k + 1, primes, long rows up to a 152k vocabulary), bounded by
  ``max_elements``;
- for every floating input declared normal or uniform: its scale across the dtype's
  exponent range, an offset of its mean (ill-conditioning: a large mean over a small
  spread), and a value family drawn around it: heavy tails (Student's t), outliers, peaked
  (confident) rows, zeros, subnormals, extremes. A non-negative input stays non-negative.
  Inputs with other declared distributions (indices, tables, states with structure) keep
  theirs: the op's contract;
- params over their natural ranges: bools both ways, the step param up to 1e5, floats a
  decade either side of the default (and 0 -> 0.01, 0.1), every value the op's case
  files use, in combination.

A candidate the op's input checks reject, whose case does not load, or whose golden
refuses it, is outside the contract and costs no verdict.

Guided, not a grid: the first half of the budget samples the space at random, the rest
mutates the worst candidates so far (one length, scale, offset, family, param or the
dtype at a time), so calls go where the error grows. Candidates are chosen in rounds of
``ROUND`` from what the rounds before found, so ``-n`` and ``--ray``, which only spread a
round over processes or nodes, give the same found cases as a serial hunt. The score of
a candidate is its error over what is achievable (``_score``); a FAIL far beyond the
compute-precision floor, or a kernel that raises, is a finding.

Chosen over Hypothesis: its ``target()`` guides one test function's examples but does
not drive a search over case files, cannot spread its examples over processes or Ray
nodes, and it would be a runtime dependency; this search writes the found inputs as a
case file directly, loaded through the case loader like any other, so
``found_cases.json`` in the run folder fails again, bit for bit, under ``verify run
--cases``.
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from verify.cases import selection
from verify.cases.case import load_file
from verify.comparator import dtypes as dt
from verify.errors import ConfigError
from verify.golden import source as golden_source
from verify.report import results
from verify.running import context, ray_run, runner
from verify.specs import inputs as input_values
from verify.specs import registry

LENGTHS = (1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 31, 32, 33, 61, 63, 64, 65, 97, 127, 128,
           129, 251, 255, 256, 257, 509, 511, 512, 513, 1021, 1023, 1024, 1025, 2047,
           2048, 2049, 4093, 4095, 4096, 4097, 8191, 8192, 8193, 16384, 32000, 32768,
           65536, 131072, 152064)
SCALES = tuple(range(-6, 7))  # log10 of the factor on a searchable input's spread
OFFSETS = (0.0, 1.0, 10.0, 100.0, 1000.0, 1e4)  # the mean, in units of the spread
# value families and their variants (README "Hunting"): 'family:variant'
VARIANTS = {"heavy": ("df1.5", "df3"), "outliers": ("x1e2", "x1e4"),
            "peaked": ("m10", "m100"), "zeros": ("half", "all"),
            "subnormal": ("quarter", "all"), "extreme": ("few",)}
STEPS = (1, 10, 100, 1000, 10000, 100000)  # the step param's natural range
MAX_ELEMENTS = 1 << 21
DEFAULT_BUDGET = 100
ROUND = 8  # candidates chosen at a time: -n and --ray spread a round, not the choice
FOUND = "found_cases.json"
KEPT = 5  # found inputs written to found_cases.json
FINDING_RATIO = 16.0  # a FAIL this many times the compute-precision floor's error is a bug
MOST_PARAM_VALUES = 16
# memory a candidate's element takes on this machine: a golden's float64 inputs, outputs and
# temporaries (ray_run.GOLDEN_FACTOR, as Ray's golden tasks ask for), twice for a backward
BYTES_PER_ELEMENT = 8 * ray_run.GOLDEN_FACTOR * 2
MEMORY_SHARE = 0.5  # of the memory available when the hunt starts, over its processes


@dataclass(frozen=True)
class Candidate:
    dtype: str
    shape: tuple[int, ...]
    scale: tuple[tuple[str, int], ...] = ()    # (input, log10 factor)
    offset: tuple[tuple[str, float], ...] = ()  # (input, mean in units of the spread)
    family: tuple[tuple[str, str], ...] = ()   # (input, 'family:variant')
    params: tuple[tuple[str, str], ...] = ()   # (param, its value as JSON text)

    def entry(self, spec, case_id: str, seed: int) -> dict:
        """This candidate as a case-file entry (test_cases/ schema)."""
        inputs = {}
        scales, offsets, families = dict(self.scale), dict(self.offset), dict(self.family)
        for i in spec.inputs:
            if i.name not in scales and i.name not in offsets and i.name not in families:
                continue
            dtype = self.dtype if i.dtype == registry.WORKING else i.dtype
            largest = float(torch.finfo(dt.to_torch(dtype)).max)
            dist = _moved(i.dist, 10.0 ** scales.get(i.name, 0), offsets.get(i.name, 0.0),
                          largest)
            if i.name in families:
                dist = _family(families[i.name], dist, largest)
            inputs[i.name] = dist
        out = {"id": case_id, "shape": list(self.shape), "dtype": self.dtype, "seed": seed}
        if inputs:
            out["inputs"] = inputs
        if self.params:
            out["params"] = {k: json.loads(v) for k, v in self.params}
        return out


def _nonneg(dist: dict) -> bool:
    if dist.get("abs"):
        return True
    return dist.get("dist") == "uniform" and float(dist.get("low", -1.0)) >= 0.0


def _moved(dist: dict, factor: float, offset: float, largest: float) -> dict:
    """A normal or uniform distribution scaled by ``factor`` and its mean moved by
    ``offset`` spreads, inside the dtype's range: its values (8 spreads out) stay below
    1/16 of the largest finite value, so an input never overflows before the kernel
    sees it (the factor is divided by 10 until they do). ``abs`` carries over."""
    keep = {k: dist[k] for k in ("abs",) if k in dist}
    for _ in range(40):
        if dist.get("dist") == "uniform":
            lo, hi = float(dist.get("low", 0.0)), float(dist.get("high", 1.0))
            width = (hi - lo) * factor
            low = lo * factor + offset * width
            out, reach = {"dist": "uniform", "low": low, "high": low + width}, \
                max(abs(low), abs(low + width))
        else:
            std = float(dist.get("std", 1.0)) * factor
            mean = float(dist.get("mean", 0.0)) * factor + offset * std
            out, reach = {"dist": "normal", "mean": mean, "std": std}, abs(mean) + 8 * std
        if reach <= largest / 16:
            return {**out, **keep}
        factor /= 10.0
    return dict(dist)


def _center_spread(dist: dict) -> tuple[float, float]:
    if dist.get("dist") == "uniform":
        lo, hi = float(dist.get("low", 0.0)), float(dist.get("high", 1.0))
        return (lo + hi) / 2, max((hi - lo) / 2, 1e-30)
    return float(dist.get("mean", 0.0)), max(float(dist.get("std", 1.0)), 1e-30)


def _family(label: str, base: dict, largest: float) -> dict:
    """``base`` (a normal or uniform) drawn as the value family ``label``: heavy tails,
    outliers, a peaked entry per row, zeros, subnormals or extremes mixed in. A
    non-negative base stays non-negative."""
    family, _, variant = label.partition(":")
    center, spread = _center_spread(base)
    reach = abs(center) + 8 * spread
    if family == "heavy":
        out = {"dist": "student_t", "df": float(variant[2:]), "mean": center, "std": spread}
    elif family == "outliers":
        factor = min(float(variant[1:]), max(1.0, largest / 16 / reach))
        out = {"dist": "outliers", "base": base, "every": 1000, "factor": factor}
    elif family == "peaked":
        margin = min(float(variant[1:]) * spread, largest / 16)
        out = {"dist": "peaked", "mean": center, "std": spread, "margin": margin}
    elif family == "zeros":
        out = ({"dist": "zeros"} if variant == "all" else
               {"dist": "special", "base": base, "values": [0.0], "fraction": 0.5})
    elif family == "subnormal":
        out = ({"dist": "subnormal"} if variant == "all" else
               {"dist": "special", "base": base, "values": ["subnormal", "-subnormal"],
                "fraction": 0.25})
    elif family == "extreme":
        out = {"dist": "special", "base": base, "values": ["huge", "-huge"], "every": 1000}
    else:
        return base
    if _nonneg(base):
        out["abs"] = True
    return out


def searchable(spec) -> list[str]:
    """Inputs whose values the hunt moves: the op's ``hunt={"inputs": ...}``, else the
    floating ones declared normal or uniform (scaling a uniform keeps its sign, offsets
    only move means up, and a family keeps a non-negative input non-negative)."""
    if "inputs" in spec.hunt:
        return list(spec.hunt["inputs"])
    return [i.name for i in spec.inputs
            if i.dist.get("dist") in ("normal", "uniform")
            and (i.dtype == registry.WORKING or i.dtype in ("fp32", "fp16", "bf16", "fp64"))]


def _key(value) -> str:
    return json.dumps(value, sort_keys=True)


def param_values(spec) -> dict[str, list[str]]:
    """Each param's values to search (JSON texts, the default first): the op's
    ``hunt={"params": ...}`` where it names the param, else its natural range (bools
    both ways, the step param up to 1e5, a float a decade either side of its default (a
    float in (0, 1) stays below 1, and one from 0.5 also goes nearer to 1: 0.9 -> 0.99)
    and 0 -> 0.01, 0.1) with every value the op's case files use. A param with one value is not searched."""
    declared = spec.hunt.get("params", {})
    seen = _case_file_values(spec)
    out = {}
    for name, default in spec.params.items():
        if name in declared:
            values = [default, *declared[name]]
        else:
            values = [default, *_natural(name, default, spec), *seen.get(name, [])]
        texts = list(dict.fromkeys(_key(v) for v in values))[:MOST_PARAM_VALUES]
        if len(texts) > 1:
            out[name] = texts
    return out


def _natural(name: str, default, spec) -> list:
    if isinstance(default, bool):
        return [not default]
    if name == spec.step_param and isinstance(default, int):
        return list(STEPS)
    if isinstance(default, float) and math.isfinite(default):
        if default == 0.0:
            return [0.01, 0.1]
        near = [default / 10, default * 10]
        if 0.0 < default < 1.0:  # a rate, a coefficient: stays below 1
            near = [v for v in near if v < 1.0]
        if 0.5 <= default < 1.0:  # a decay (beta, momentum, rho): nearer to 1 too
            near.append(1.0 - (1.0 - default) / 10)
        return near
    return []


def _case_file_values(spec) -> dict[str, list]:
    """Param values the op's own case files use (every level): its realistic ones."""
    try:
        cases = selection.load_sources(selection.default_case_sources(), ops=[spec.name])
    except (ConfigError, OSError):
        return {}
    out: dict[str, list] = {}
    for case in cases:
        if case.expect_error:
            continue
        for k, v in case.case_params.items():
            if k in spec.params and v not in out.setdefault(k, []):
                out[k].append(v)
    return out


@dataclass
class Space:
    spec: object
    dtypes: list[str]
    max_elements: int = MAX_ELEMENTS
    inputs: list[str] = field(default_factory=list)
    params: dict[str, list[str]] = field(default_factory=dict)
    families: list[str] = field(default_factory=list)  # 'family:variant' labels
    lengths: tuple[int, ...] = LENGTHS
    # the only extents of the last dim, where the op's shape rule fixes it (hunt['last_dim'])
    last_dim: tuple[int, ...] = ()

    @classmethod
    def of(cls, spec, dtypes: list[str], max_elements: int) -> "Space":
        allowed = spec.hunt.get("families") or [f for f in registry.HUNT_FAMILIES
                                                if f != "plain"]
        labels = [f"{f}:{v}" for f in allowed if f in VARIANTS for v in VARIANTS[f]]
        lengths = tuple(sorted(set(LENGTHS) | set(spec.hunt.get("lengths", ()))))
        most = int(spec.hunt.get("max_elements", max_elements))
        return cls(spec, dtypes, min(most, max_elements), searchable(spec),
                   param_values(spec), labels, lengths,
                   tuple(int(n) for n in spec.hunt.get("last_dim", ())))

    def ranks(self) -> list[int]:
        lo, hi = self.spec.ranks
        return [r for r in range(max(1, lo), min(hi, 4) + 1)] or [max(1, lo)]

    def _fits(self, shape) -> bool:
        return math.prod(shape) * max(1, len(self.spec.inputs)) <= self.max_elements

    def random(self, rng, i: int = 0) -> Candidate:
        """A random point: the last (reduced) extent first, the i-th of a seeded
        permutation of the lengths (so the exploring half of a budget tries each length
        once), then leading extents that fit in what is left of the element budget;
        scales, offsets, families and params each drawn for some of the inputs."""
        rank = int(rng.choice(self.ranks()))
        room = self.max_elements // max(1, len(self.spec.inputs))
        fitting = [n for n in self.last_dim or self.lengths if n <= room] or \
            list(self.last_dim[:1]) or [1]
        if not hasattr(self, "_order"):
            self._order = [fitting[k] for k in rng.permutation(len(fitting))]
        last = int(self._order[i % len(self._order)])
        shape = [last]
        for _ in range(rank - 1):
            left = room // math.prod(shape)
            shape.insert(0, int(rng.choice([n for n in self.lengths[:24] if n <= left]
                                           or [1])))
        scale = tuple((n, int(rng.choice(SCALES))) for n in self.inputs if rng.random() < 0.6)
        offset = tuple((n, float(rng.choice(OFFSETS))) for n in self.inputs
                       if rng.random() < 0.4)
        family = tuple((n, str(rng.choice(self.families))) for n in self.inputs
                       if self.families and rng.random() < 0.4)
        params = tuple((k, str(rng.choice(v))) for k, v in self.params.items()
                       if rng.random() < 0.5)
        return Candidate(str(rng.choice(self.dtypes)), tuple(shape), scale, offset, family,
                         params)

    def mutate(self, c: Candidate, rng) -> Candidate:
        """One step from ``c``: a neighbouring length, scale or offset, another value
        family or param value, or the dtype."""
        what = int(rng.integers(0, 6))
        if what == 0 and c.shape:
            shape = list(c.shape)
            d = int(rng.integers(0, len(shape)))
            lengths = self.last_dim if d == len(shape) - 1 and self.last_dim else self.lengths
            k = lengths.index(shape[d]) if shape[d] in lengths else 0
            k = int(np.clip(k + rng.choice([-3, -1, 1, 3]), 0, len(lengths) - 1))
            shape[d] = lengths[k]
            if self._fits(shape):
                return _replace(c, shape=tuple(shape))
        if what == 1 and self.inputs:
            n = str(rng.choice(self.inputs))
            scale = dict(c.scale)
            scale[n] = int(np.clip(scale.get(n, 0) + rng.choice([-2, -1, 1, 2]), SCALES[0],
                                   SCALES[-1]))
            return _replace(c, scale=tuple(sorted(scale.items())))
        if what == 2 and self.inputs:
            n = str(rng.choice(self.inputs))
            offset = dict(c.offset)
            k = OFFSETS.index(offset.get(n, 0.0)) if offset.get(n, 0.0) in OFFSETS else 0
            offset[n] = OFFSETS[int(np.clip(k + rng.choice([-1, 1]), 0, len(OFFSETS) - 1))]
            return _replace(c, offset=tuple(sorted(offset.items())))
        if what == 3 and self.inputs and self.families:
            n = str(rng.choice(self.inputs))
            family = dict(c.family)
            pick = str(rng.choice(["plain", *self.families]))
            if pick == "plain":
                family.pop(n, None)
            else:
                family[n] = pick
            return _replace(c, family=tuple(sorted(family.items())))
        if what == 4 and self.params:
            k = str(rng.choice(sorted(self.params)))
            params = dict(c.params)
            params[k] = str(rng.choice(self.params[k]))
            return _replace(c, params=tuple(sorted(params.items())))
        return _replace(c, dtype=str(rng.choice(self.dtypes)))


_replace = dataclasses.replace


@dataclass
class Tried:
    entry: dict
    rows: list[dict]
    score: float
    failed: bool


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not math.isnan(v) else None


def _score(rows: list[dict]) -> tuple[float, bool]:
    """(score, finding) of one try. The score is the kernel's error over what is
    achievable: its worst ratio to the compute-precision floor (the golden evaluated in
    the op's compute dtype, cfloor_ratio) where there is one, else its margin. A finding
    is a FAIL at least FINDING_RATIO times the floor's error (or with NaN / Inf where the
    golden has none, or with no floor to go by), or a kernel that raised or crashed;
    where the floor fails the standard itself, FINDING_RATIO^2 times. Not findings: a
    FAIL within that ratio (the dtype's limit on those inputs, which a correct kernel
    has too), an output the correctly rounded golden fails as well
    (overflow), and one where the golden evaluated in the compute dtype breaks down too
    (its figures are not finite: fp32 itself overflows on those inputs)."""
    worst, found = 0.0, False
    for r in rows:
        reason = str(r.get("reason", ""))
        if r.get("verdict") == "ERROR" and ("kernel raised" in reason
                                           or "kernel crashed its process" in reason):
            return math.inf, True
        if r.get("verdict") not in ("PASS", "FAIL"):
            continue
        floor_margin = _num(r.get("floor_margin"))
        if floor_margin is not None and floor_margin >= 1.0:
            continue  # even the correctly rounded golden fails: the dtype's range, not a bug
        cfloor_margin = r.get("cfloor_margin")
        if isinstance(cfloor_margin, float) and not math.isfinite(cfloor_margin):
            continue  # the compute dtype's own evaluation breaks down on these inputs
        ratio = _num(r.get("cfloor_ratio"))
        bad_places = bool(r.get("nan_inf_mismatch"))
        score = math.inf if bad_places else (ratio if ratio is not None
                                             else _num(r.get("margin")) or 0.0)
        worst = max(worst, score)
        # where the compute dtype's own evaluation fails the standard too (cancellation,
        # an ill-conditioned backward), correct algorithms differ widely in their error:
        # a finding must then be FINDING_RATIO times further off
        limit = FINDING_RATIO * (FINDING_RATIO if isinstance(cfloor_margin, float)
                                 and cfloor_margin >= 1.0 else 1.0)
        if r["verdict"] == "FAIL" and (bad_places or ratio is None or ratio >= limit):
            found = True
    return worst, found


@dataclass
class HuntResult:
    rows: list[dict]
    found: list[Tried]
    tried: int
    run_dir: Path | None
    best: Tried | None = None
    outside: int = 0  # candidates outside the op's contract (no verdict, no budget spent)
    warnings: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        return 1 if self.found else 0


def _evaluate(spec, entry: dict, kern, ctx, folder: Path) -> list[dict] | None:
    """The rows of one entry, or None when it is outside the op's contract (the case
    file does not load, the op's input checks reject its inputs, or the golden refuses
    them)."""
    path = folder / f"{spec.name}.json"
    path.write_text(json.dumps({"op": spec.name, "levels": {"L0": [entry]}}))
    try:
        cases = load_file(path)
    except ConfigError:
        return None
    rows = []
    for case in cases:
        if spec.validate_fn is not None:
            try:
                spec.validate(**input_values.make_inputs(case), **case.params)
            except (TypeError, ValueError):
                return None
        got = runner.run_case(case, kern, ctx)
        if any(r.get("verdict") == "ERROR" and "golden raised" in str(r.get("reason", ""))
               for r in got):
            return None
        if any(r.get("verdict") == "ERROR" and "kernel raised" in str(r.get("reason", ""))
               for r in got) and _golden_refuses(spec, case):
            return None  # the kernel raised on inputs the op itself refuses
        rows += got
    return rows


def _golden_refuses(spec, case) -> bool:
    """Whether the golden rejects the case's inputs (TypeError / ValueError): the op's
    contract, for an op whose checks live in its golden rather than in ``validate=``."""
    try:
        spec.golden(**input_values.make_inputs(case), **case.params)
    except (TypeError, ValueError):
        return True
    except Exception:
        return False
    return False


def _crash_rows(spec, entry: dict, kern, why: str) -> list[dict]:
    """The row of a candidate whose kernel ended the process evaluating it."""
    with tempfile.TemporaryDirectory(prefix="verify-hunt-") as tmp:
        path = Path(tmp) / f"{spec.name}.json"
        path.write_text(json.dumps({"op": spec.name, "levels": {"L0": [entry]}}))
        rows = [runner.vanished_row(case, kern, f"kernel crashed its process: {why}")
                for case in load_file(path)]
    return rows


# -- where candidates are evaluated: here, in -n processes, or on Ray nodes -------------
@dataclass(frozen=True)
class Setup:
    """What a process evaluating candidates needs to set the harness up as the hunt's
    process did (picklable: it travels to pool workers and Ray nodes)."""
    kernels: tuple[str, ...]
    store: str | None
    case_timeout: float | None
    cwd: str
    threads: int = 0  # torch threads per process (0: torch's default)


_PREPARED: dict = {}  # a pool worker's or Ray process's context, for the hunt it serves


def _prepared(setup: Setup):
    ctx = _PREPARED.get(setup)
    if ctx is None:
        from verify.running.ray_tasks import _module_path
        if setup.cwd not in sys.path:
            sys.path.append(setup.cwd)
        registry.load_builtin()
        for module in setup.kernels:
            registry.load_user_module(_module_path(module, setup.cwd))
        if setup.threads:
            torch.set_num_threads(setup.threads)
        ctx = context.RunContext(resolver=_resolver(setup.store),
                                 case_timeout=setup.case_timeout)
        _PREPARED.clear()
        _PREPARED[setup] = ctx
    return ctx


def _resolver(store: str | None):
    """The hunt's goldens: a candidate is tried once, so its golden is kept in memory, not
    in the user's store (a hunt of every op at 2^21 elements wrote 17 GB there); with
    ``--store`` given, in that store."""
    return golden_source.configure(store) if store else golden_source.GoldenResolver(None)


def evaluate_remote(setup: Setup, op: str, backend: str, kernel: str,
                    entry: dict) -> list[dict] | None:
    """One candidate in a pool worker or a Ray task: its rows, or None (outside the
    contract)."""
    ctx = _prepared(setup)
    spec = registry.op(op)
    kern = next(k for k in registry.kernels(op, [backend]) if k.name == kernel)
    with tempfile.TemporaryDirectory(prefix="verify-hunt-") as tmp:
        return _evaluate(spec, entry, kern, ctx, Path(tmp))


class Serial:
    """Candidates evaluated one after another in this process."""

    def __init__(self, spec, ctx):
        self.spec, self.ctx = spec, ctx

    def map(self, kern, entries: list[dict]) -> list[list[dict] | None]:
        with tempfile.TemporaryDirectory(prefix="verify-hunt-") as tmp:
            return [_evaluate(self.spec, e, kern, self.ctx, Path(tmp)) for e in entries]

    def close(self):
        pass


class Pool:
    """``-n N``: a round's candidates over N worker processes of their own (plain
    ``python -c`` children fed pickles on a pipe: no multiprocessing, so the caller's
    script needs no ``__main__`` guard). A kernel that ends its process ends one
    candidate, not the hunt: it is a finding, and a fresh worker takes its place."""

    def __init__(self, spec, setup: Setup, workers: int):
        self.spec, self.setup, self.workers = spec, setup, workers
        self.procs: list = []

    def _spawn(self):
        import subprocess
        proc = subprocess.Popen([sys.executable, "-c", "from verify.running.hunt import "
                                 "serve; serve()"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, cwd=self.setup.cwd)
        _send(proc.stdin, self.setup)
        ready = _receive(proc, None)
        if ready != "ready":
            proc.kill()
            raise RuntimeError(f"a hunt worker did not start: {ready}")
        return proc

    def map(self, kern, entries: list[dict]) -> list[list[dict] | None]:
        import queue
        import threading
        while len(self.procs) < min(self.workers, len(entries)):
            self.procs.append(self._spawn())
        todo: queue.Queue = queue.Queue()
        for k, e in enumerate(entries):
            todo.put((k, e))
        out: list = [None] * len(entries)
        errors: list[BaseException] = []
        limit = (self.setup.case_timeout or 0) and self.setup.case_timeout * 2 + 60

        def drive(slot: int):
            while not errors:
                try:
                    k, entry = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    proc = self.procs[slot]
                    _send(proc.stdin, (self.spec.name, kern.backend, kern.name, entry))
                    got = _receive(proc, limit or None)
                    if isinstance(got, _Died):  # the kernel ended (or hung) its process
                        out[k] = _crash_rows(self.spec, entry, kern, got.why)
                        proc.kill()
                        proc.wait()
                        self.procs[slot] = self._spawn()
                    elif isinstance(got, _Failed):
                        raise RuntimeError(f"a hunt worker failed: {got.text}")
                    else:
                        out[k] = got
                except BaseException as exc:
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=drive, args=(i,), daemon=True)
                   for i in range(len(self.procs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out

    def close(self):
        for proc in self.procs:
            try:
                proc.stdin.close()
                proc.wait(timeout=30)
            except Exception:
                proc.kill()
        self.procs = []


@dataclass
class _Died:
    why: str


@dataclass
class _Failed:
    text: str


def _send(stream, obj) -> None:
    import pickle
    pickle.dump(obj, stream, protocol=5)
    stream.flush()


def _receive(proc, timeout: float | None):
    """The worker's next reply; _Died when it ended (or sent nothing within
    ``timeout`` seconds: it is killed)."""
    import pickle
    import select
    if timeout is not None:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            proc.kill()
            return _Died(f"no answer within {timeout:g} s (killed)")
    try:
        return pickle.load(proc.stdout)
    except (EOFError, pickle.UnpicklingError, OSError):
        code = proc.wait()
        return _Died(f"the process ended with exit status {code}")


def serve() -> None:
    """A -n worker: set up once, then evaluate each candidate sent on stdin. Replies go
    to the original stdout; the kernels' own prints go to stderr."""
    import pickle
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    try:
        setup = pickle.load(requests)
        _prepared(setup)
    except Exception as exc:
        _send(replies, f"{type(exc).__name__}: {exc}")
        return
    _send(replies, "ready")
    while True:
        try:
            op, backend, kernel, entry = pickle.load(requests)
        except EOFError:
            return
        try:
            got = evaluate_remote(setup, op, backend, kernel, entry)
        except Exception as exc:  # the harness, not the kernel (run_case catches those)
            got = _Failed(f"{type(exc).__name__}: {exc}")
        _send(replies, got)


class RayNodes:
    """``--ray SPEC``: a round's candidates as Ray tasks, each asking for its backend's
    device (verify run --ray's cluster specs: auto, HOST:PORT, local[:RESOURCES])."""

    def __init__(self, spec, setup: Setup, ray_spec: str, backend: str):
        self.spec, self.setup = spec, setup
        self.ray, self.started = ray_run.connect(ray_spec)
        self.fn = self.ray.remote(max_retries=0)(evaluate_remote)
        self.options = ray_run.device_request(registry.backend(backend))

    def map(self, kern, entries: list[dict]) -> list[list[dict] | None]:
        args = (self.setup, self.spec.name, kern.backend, kern.name)
        refs = [self.fn.options(**self.options).remote(*args, e) for e in entries]
        out = []
        for ref, entry in zip(refs, entries):
            try:
                out.append(self.ray.get(ref))
            except self.ray.exceptions.RayTaskError as exc:  # the harness itself failed
                raise RuntimeError(f"a hunt task failed on its node: {exc}") from None
            except self.ray.exceptions.RayError as exc:  # the worker died (a crash)
                out.append(_crash_rows(self.spec, entry, kern, type(exc).__name__))
        return out

    def close(self):
        if self.started:
            self.ray.shutdown()


def _executor(spec, ctx, setup: Setup, workers: int, ray: str | None, backend: str):
    if ray:
        return RayNodes(spec, setup, ray, backend)
    if workers and workers > 1:
        return Pool(spec, setup, workers)
    return Serial(spec, ctx)


def available_memory() -> int | None:
    """Bytes of memory available now (Linux's MemAvailable: free memory plus the page
    cache it can drop), None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_bound(max_elements: int, processes: int) -> tuple[int, str | None]:
    """``max_elements`` lowered to what this machine's memory allows for ``processes``
    candidates at once (MEMORY_SHARE of what is available, BYTES_PER_ELEMENT each), and
    the warning that says so; unchanged where it fits or the memory is unknown."""
    free = available_memory()
    if free is None:
        return max_elements, None
    most = int(free * MEMORY_SHARE / max(1, processes) / BYTES_PER_ELEMENT)
    if max_elements <= most:
        return max_elements, None
    most = max(1, most)
    return most, (f"--max-elements {max_elements} does not fit in memory ({free / 2**30:.1f} "
                  f"GiB available, {processes} process(es), {BYTES_PER_ELEMENT} bytes an "
                  f"element): candidates hold at most {most} elements")


def _kernel_modules(kernels) -> tuple[str, ...]:
    """The user's modules as another process reaches them: .py paths made absolute."""
    out = []
    for m in kernels:
        text = os.fspath(m)
        if (text.endswith(".py") or os.sep in text) and os.path.exists(text):
            text = os.path.abspath(text)
        out.append(text)
    return tuple(out)


def hunt(op: str, backend: str, *, kernels=(), dtypes=None, budget: int = DEFAULT_BUDGET,
         seed: int = 0, kernel: str | None = None, max_elements: int = MAX_ELEMENTS,
         reports=None, run_id: str | None = None, store: str | None = None,
         case_timeout: float | None = None, progress=None, workers: int = 0,
         ray: str | None = None) -> HuntResult:
    """Hunt ``op``'s kernels of ``backend`` (or the one named ``kernel``) for their least
    precise inputs; writes a run (the failing tries' rows) and found_cases.json.
    ``workers`` (-n) spreads each round over that many processes, ``ray`` (--ray) over a
    Ray cluster; neither changes what is found."""
    registry.load_builtin()
    for module in kernels:
        registry.load_user_module(module)
    spec = registry.op(selection.expand_op_names([op])[0])
    kerns = [k for k in registry.kernels(spec.name, [backend])
             if kernel is None or k.name == kernel]
    if not kerns:
        raise ConfigError(f"op '{spec.name}' has no kernel{' ' + kernel if kernel else ''} "
                          f"under backend '{backend}' (verify ops {spec.name} lists them)")
    wanted = [dt.canonical_name(d) for d in (dtypes or [])] or list(spec.dtypes)
    bad = [d for d in wanted if d not in spec.dtypes]
    if bad:
        raise ConfigError(f"op '{spec.name}' covers {', '.join(spec.dtypes)}, not "
                          f"{', '.join(bad)} (--dtype)")
    if budget < 1:
        raise ConfigError(f"--budget must be at least 1, not {budget}")
    if workers < 0:
        raise ConfigError(f"-n must be a number of processes >= 0, not {workers}")
    why = None
    if ray is None:  # a Ray node bounds its own tasks' memory (ray_run.golden_memory)
        max_elements, why = memory_bound(max_elements, max(1, workers))
    warnings = [why] if why else []
    space = Space.of(spec, wanted, max_elements)
    ctx = context.RunContext(resolver=_resolver(store), case_timeout=case_timeout)
    threads = max(1, (os.cpu_count() or 1) // workers) if workers > 1 else 0
    setup = Setup(_kernel_modules(kernels), store, case_timeout, os.getcwd(), threads)
    rng = np.random.Generator(np.random.PCG64(seed))
    tried: list[Tried] = []
    seen: set = set()
    outside = 0
    explore = max(4, budget // 2)
    executor = _executor(spec, ctx, setup, workers, ray, backend)
    try:
        for kern in kerns:
            pool: list[tuple[float, Candidate]] = []
            for start in range(0, budget, ROUND):
                chosen = []
                for i in range(start, min(start + ROUND, budget)):
                    for _ in range(20):  # a candidate not tried yet
                        if i < explore or not pool:
                            cand = space.random(rng, i)
                        else:
                            top = sorted(pool, key=lambda p: -p[0])[:5]
                            cand = space.mutate(top[int(rng.integers(0, len(top)))][1], rng)
                        if (kern.name, cand) not in seen:
                            break
                    seen.add((kern.name, cand))
                    chosen.append((cand, cand.entry(spec, f"hunt-{kern.name}-{i}",
                                                    seed * 100003 + i)))
                got = executor.map(kern, [e for _, e in chosen])
                for (cand, entry), rows in zip(chosen, got):
                    if rows is None:
                        outside += 1
                        continue
                    score, failed = _score(rows)
                    pool.append((score, cand))
                    tried.append(Tried(entry, rows, score, failed))
                if progress is not None:
                    progress(min(start + ROUND, budget), budget, kern.name)
    finally:
        executor.close()
    found = sorted((t for t in tried if t.failed), key=lambda t: -t.score)
    best = max(tried, key=lambda t: t.score, default=None)
    fail_rows = [r for t in found for r in t.rows]
    run_dir = None
    if reports is not False:
        run_dir = results.reserve_run_dir(reports or None, run_id)
        results.write(fail_rows, run_dir, {
            "run_id": run_dir.name, "level": "hunt", "warnings": warnings,
            "environment": results.environment(),
            "hunt": {"op": spec.name, "backend": backend, "kernels": [k.name for k in kerns],
                     "budget": budget, "seed": seed, "tried": len(tried),
                     "outside_contract": outside, "found": len(found),
                     "modules": list(kernels), "workers": workers, "ray": ray,
                     "worst_margin": None if best is None else (
                         best.score if math.isfinite(best.score) else "inf")}})
        write_found(run_dir / FOUND, spec.name, [t.entry for t in found[:KEPT]], seed)
    return HuntResult(fail_rows, found, len(tried), run_dir, best, outside, warnings)


def write_found(path: Path, op: str, entries: list[dict], seed: int) -> None:
    """The worst failing inputs as a case file: ``verify run --cases FILE`` fails again."""
    doc = {"op": op, "description": f"inputs verify hunt found (seed {seed}): each failed; "
                                    f"add them to a level to keep them failing until fixed",
           "levels": {"L0": entries}}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def summary(result: HuntResult) -> str:
    """What ``verify hunt`` prints: tries, findings, the worst input, where it went."""
    lines = [f"verify hunt: {result.tried} cases tried, {len(result.found)} failed"
             + (f" ({result.outside} candidates outside the op's contract skipped)"
                if result.outside else "")]
    for t in result.found[:KEPT]:
        fails = [r for r in t.rows if r.get("verdict") in ("FAIL", "ERROR")]
        why = f"{fails[0].get('output')}: {fails[0].get('reason')}" if fails else ""
        extra = {k: t.entry[k] for k in ("inputs", "params") if t.entry.get(k)}
        lines.append(f"  {t.entry['id']} {t.entry['dtype']} {t.entry['shape']} "
                     f"{json.dumps(extra)} (score {t.score:.3g}) {why}")
    if result.best is not None and not result.found:
        lines.append(f"  worst: {result.best.entry['id']} {result.best.entry['shape']} "
                     f"(error over the compute-precision floor {result.best.score:.3g})")
    lines += [f"warning: {w}" for w in result.warnings]
    if result.run_dir is not None:
        lines.append(f"reports in {result.run_dir}; found cases: {result.run_dir / FOUND}")
    return "\n".join(lines) + "\n"
