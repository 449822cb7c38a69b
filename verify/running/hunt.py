"""``verify hunt``: search an op's input space for the inputs where a kernel is least
precise, within a budget of kernel calls, deterministic for a seed.

The space is the op's own declaration: main shapes within its rank range, with extents
from lengths kernels get wrong (1, 2^k - 1, 2^k, 2^k + 1, primes, long rows up to a
152k vocabulary, bounded by ``max_elements``), and, for every floating input whose
declared distribution is normal or uniform, its scale across the dtype's exponent range
and an offset of its mean (ill-conditioning: a large mean over a small spread). Inputs
with other declared distributions (states, indices, tables) keep theirs: the op's
contract. Params stay at the op's defaults.

Guided, not a grid: half of the budget samples the space at random, the rest mutates
the worst candidates found so far (one length, one scale or one offset at a time), so
calls go where the error grows. The score of a candidate is its worst ``margin`` (the
deciding metric over its threshold, >= 1 fails) over its outputs; a FAIL, or a kernel
that raises, is a finding. Chosen over Hypothesis: its ``target()`` guides one test's
examples but not a search over case files, and it would be a runtime dependency; this
search is ~100 lines and writes the found inputs as a case file directly.

Each candidate is a case-file entry, loaded through the case loader like any other, so
``found_cases.json`` in the run folder fails again, bit for bit, under ``verify run
--cases``.
"""
from __future__ import annotations

import json
import math
import tempfile
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
from verify.running import context, runner
from verify.specs import registry

LENGTHS = (1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 31, 32, 33, 61, 63, 64, 65, 97, 127, 128,
           129, 251, 255, 256, 257, 509, 511, 512, 513, 1021, 1023, 1024, 1025, 2047,
           2048, 2049, 4093, 4095, 4096, 4097, 8191, 8192, 8193, 16384, 32000, 32768,
           65536, 131072, 152064)
SCALES = tuple(range(-6, 7))  # log10 of the factor on a searchable input's spread
OFFSETS = (0.0, 1.0, 10.0, 100.0, 1000.0, 1e4)  # the mean, in units of the spread
MAX_ELEMENTS = 1 << 21
DEFAULT_BUDGET = 100
FOUND = "found_cases.json"
KEPT = 5  # found inputs written to found_cases.json
FINDING_RATIO = 16.0  # a FAIL this many times the compute-precision floor's error is a bug


@dataclass(frozen=True)
class Candidate:
    dtype: str
    shape: tuple[int, ...]
    scale: tuple[tuple[str, int], ...] = ()    # (input, log10 factor)
    offset: tuple[tuple[str, float], ...] = ()  # (input, mean in units of the spread)

    def entry(self, spec, case_id: str, seed: int) -> dict:
        """This candidate as a case-file entry (test_cases/ schema)."""
        inputs = {}
        scales, offsets = dict(self.scale), dict(self.offset)
        for i in spec.inputs:
            if i.name in scales or i.name in offsets:
                dtype = self.dtype if i.dtype == registry.WORKING else i.dtype
                inputs[i.name] = _moved(i.dist, 10.0 ** scales.get(i.name, 0),
                                        offsets.get(i.name, 0.0),
                                        float(torch.finfo(dt.to_torch(dtype)).max))
        out = {"id": case_id, "shape": list(self.shape), "dtype": self.dtype, "seed": seed}
        if inputs:
            out["inputs"] = inputs
        return out


def _moved(dist: dict, factor: float, offset: float, largest: float) -> dict:
    """A normal or uniform distribution scaled by ``factor`` and its mean moved by
    ``offset`` spreads, inside the dtype's range: its values (8 spreads out) stay below
    1/16 of the largest finite value, so an input never overflows before the kernel
    sees it (the factor is divided by 10 until they do)."""
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
            return out
        factor /= 10.0
    return dict(dist)


def searchable(spec) -> list[str]:
    """Inputs whose values the hunt moves: floating ones declared normal or uniform
    (scaling a uniform keeps its sign, and offsets only move means up: a non-negative
    state stays non-negative)."""
    return [i.name for i in spec.inputs
            if i.dist.get("dist") in ("normal", "uniform")
            and (i.dtype == registry.WORKING or i.dtype in ("fp32", "fp16", "bf16", "fp64"))]


@dataclass
class Space:
    spec: object
    dtypes: list[str]
    max_elements: int = MAX_ELEMENTS
    inputs: list[str] = field(default_factory=list)

    def ranks(self) -> list[int]:
        lo, hi = self.spec.ranks
        return [r for r in range(max(1, lo), min(hi, 4) + 1)] or [max(1, lo)]

    def _fits(self, shape) -> bool:
        return math.prod(shape) * max(1, len(self.spec.inputs)) <= self.max_elements

    def random(self, rng, i: int = 0) -> Candidate:
        """A random point: the last (reduced) extent first, the i-th of a seeded
        permutation of the lengths (so the exploring half of a budget tries each length
        once), then leading extents that fit in what is left of the element budget."""
        rank = int(rng.choice(self.ranks()))
        room = self.max_elements // max(1, len(self.spec.inputs))
        fitting = [n for n in LENGTHS if n <= room] or [1]
        if not hasattr(self, "_order"):
            self._order = [fitting[k] for k in rng.permutation(len(fitting))]
        last = int(self._order[i % len(self._order)])
        shape = [last]
        for _ in range(rank - 1):
            left = room // math.prod(shape)
            shape.insert(0, int(rng.choice([n for n in LENGTHS[:24] if n <= left] or [1])))
        scale = tuple((n, int(rng.choice(SCALES))) for n in self.inputs if rng.random() < 0.6)
        offset = tuple((n, float(rng.choice(OFFSETS))) for n in self.inputs
                       if rng.random() < 0.4)
        return Candidate(str(rng.choice(self.dtypes)), tuple(shape), scale, offset)

    def mutate(self, c: Candidate, rng) -> Candidate:
        """One step from ``c``: a neighbouring length, scale or offset, or the dtype."""
        what = rng.integers(0, 4)
        if what == 0 and c.shape:
            shape = list(c.shape)
            d = int(rng.integers(0, len(shape)))
            k = LENGTHS.index(shape[d]) if shape[d] in LENGTHS else 0
            k = int(np.clip(k + rng.choice([-3, -1, 1, 3]), 0, len(LENGTHS) - 1))
            shape[d] = LENGTHS[k]
            if self._fits(shape):
                return Candidate(c.dtype, tuple(shape), c.scale, c.offset)
        if what == 1 and self.inputs:
            n = str(rng.choice(self.inputs))
            scale = dict(c.scale)
            scale[n] = int(np.clip(scale.get(n, 0) + rng.choice([-2, -1, 1, 2]), SCALES[0],
                                   SCALES[-1]))
            return Candidate(c.dtype, c.shape, tuple(sorted(scale.items())), c.offset)
        if what == 2 and self.inputs:
            n = str(rng.choice(self.inputs))
            offset = dict(c.offset)
            k = OFFSETS.index(offset.get(n, 0.0)) if offset.get(n, 0.0) in OFFSETS else 0
            offset[n] = OFFSETS[int(np.clip(k + rng.choice([-1, 1]), 0, len(OFFSETS) - 1))]
            return Candidate(c.dtype, c.shape, c.scale, tuple(sorted(offset.items())))
        return Candidate(str(rng.choice(self.dtypes)), c.shape, c.scale, c.offset)


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
    golden has none, or with no floor to go by), or a kernel that raised: a FAIL within
    that ratio is the dtype's limit on those inputs, which a correct kernel has too, and
    an output the correctly rounded golden fails as well (overflow) is no finding."""
    worst, found = 0.0, False
    for r in rows:
        if r.get("verdict") == "ERROR" and "kernel raised" in str(r.get("reason", "")):
            return math.inf, True
        if r.get("verdict") not in ("PASS", "FAIL"):
            continue
        floor_margin = _num(r.get("floor_margin"))
        if floor_margin is not None and floor_margin >= 1.0:
            continue  # even the correctly rounded golden fails: the dtype's range, not a bug
        ratio = _num(r.get("cfloor_ratio"))
        bad_places = bool(r.get("nan_inf_mismatch"))
        score = math.inf if bad_places else (ratio if ratio is not None
                                             else _num(r.get("margin")) or 0.0)
        worst = max(worst, score)
        if r["verdict"] == "FAIL" and (bad_places or ratio is None or ratio >= FINDING_RATIO):
            found = True
    return worst, found


@dataclass
class HuntResult:
    rows: list[dict]
    found: list[Tried]
    tried: int
    run_dir: Path | None
    best: Tried | None = None

    @property
    def exit_status(self) -> int:
        return 1 if self.found else 0


def _evaluate(spec, entry: dict, kern, ctx, folder: Path) -> list[dict] | None:
    """The rows of one entry, or None when it is outside the op's contract (the case
    file does not load, or the golden refuses the inputs)."""
    path = folder / f"{spec.name}.json"
    path.write_text(json.dumps({"op": spec.name, "levels": {"L0": [entry]}}))
    try:
        cases = load_file(path)
    except ConfigError:
        return None
    rows = []
    for case in cases:
        got = runner.run_case(case, kern, ctx)
        if any(r.get("verdict") == "ERROR" and "golden raised" in str(r.get("reason", ""))
               for r in got):
            return None
        rows += got
    return rows


def hunt(op: str, backend: str, *, kernels=(), dtypes=None, budget: int = DEFAULT_BUDGET,
         seed: int = 0, kernel: str | None = None, max_elements: int = MAX_ELEMENTS,
         reports=None, run_id: str | None = None, store: str | None = None,
         case_timeout: float | None = None, progress=None) -> HuntResult:
    """Hunt ``op``'s kernels of ``backend`` (or the one named ``kernel``) for their least
    precise inputs; writes a run (the failing tries' rows) and found_cases.json."""
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
    space = Space(spec, wanted, max_elements, searchable(spec))
    ctx = context.RunContext(resolver=golden_source.configure(store), case_timeout=case_timeout)
    rng = np.random.Generator(np.random.PCG64(seed))
    tried: list[Tried] = []
    seen: set = set()
    explore = max(4, budget // 2)
    with tempfile.TemporaryDirectory(prefix="verify-hunt-") as tmp:
        for kern in kerns:
            pool: list[tuple[float, Candidate]] = []
            for i in range(budget):
                for _ in range(20):  # a candidate not tried yet
                    if i < explore or not pool:
                        cand = space.random(rng, i)
                    else:
                        top = sorted(pool, key=lambda p: -p[0])[:5]
                        cand = space.mutate(top[int(rng.integers(0, len(top)))][1], rng)
                    if (kern.name, cand) not in seen:
                        break
                seen.add((kern.name, cand))
                entry = cand.entry(spec, f"hunt-{kern.name}-{i}", seed * 100003 + i)
                rows = _evaluate(spec, entry, kern, ctx, Path(tmp))
                if progress is not None:
                    progress(i + 1, budget, kern.name)
                if rows is None:
                    continue
                score, failed = _score(rows)
                pool.append((score, cand))
                tried.append(Tried(entry, rows, score, failed))
    found = sorted((t for t in tried if t.failed), key=lambda t: -t.score)
    best = max(tried, key=lambda t: t.score, default=None)
    fail_rows = [r for t in found for r in t.rows]
    run_dir = None
    if reports is not False:
        run_dir = results.reserve_run_dir(reports or None, run_id)
        results.write(fail_rows, run_dir, {
            "run_id": run_dir.name, "level": "hunt", "warnings": [],
            "environment": results.environment(),
            "hunt": {"op": spec.name, "backend": backend, "kernels": [k.name for k in kerns],
                     "budget": budget, "seed": seed, "tried": len(tried),
                     "found": len(found), "modules": list(kernels),
                     "worst_margin": None if best is None else (
                         best.score if math.isfinite(best.score) else "inf")}})
        write_found(run_dir / FOUND, spec.name, [t.entry for t in found[:KEPT]], seed)
    return HuntResult(fail_rows, found, len(tried), run_dir, best)


def write_found(path: Path, op: str, entries: list[dict], seed: int) -> None:
    """The worst failing inputs as a case file: ``verify run --cases FILE`` fails again."""
    doc = {"op": op, "description": f"inputs verify hunt found (seed {seed}): each failed; "
                                    f"add them to a level to keep them failing until fixed",
           "levels": {"L0": entries}}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def summary(result: HuntResult) -> str:
    """What ``verify hunt`` prints: tries, findings, the worst input, where it went."""
    lines = [f"verify hunt: {result.tried} cases tried, {len(result.found)} failed"]
    for t in result.found[:KEPT]:
        fails = [r for r in t.rows if r.get("verdict") in ("FAIL", "ERROR")]
        why = f"{fails[0].get('output')}: {fails[0].get('reason')}" if fails else ""
        lines.append(f"  {t.entry['id']} {t.entry['dtype']} {t.entry['shape']} "
                     f"{json.dumps(t.entry.get('inputs') or {})} (score {t.score:.3g}) {why}")
    if result.best is not None and not result.found:
        lines.append(f"  worst: {result.best.entry['id']} {result.best.entry['shape']} "
                     f"(error over the compute-precision floor {result.best.score:.3g})")
    if result.run_dir is not None:
        lines.append(f"reports in {result.run_dir}; found cases: {result.run_dir / FOUND}")
    return "\n".join(lines) + "\n"
