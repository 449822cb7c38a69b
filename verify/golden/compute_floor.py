"""The compute-precision floor: the op's own golden evaluated in the precision a real
kernel computes in (fp32 by default), on the case's inputs, its outputs written in the
output dtypes.

The output floor (the golden rounded once) says what any kernel writing that dtype can
reach. It knows nothing of the rounding a correct kernel does inside: an fp32 softmax
carries fp32's rounding of p into p - 1, a LayerNorm of a row with mean 3 and std 0.001
loses digits to cancellation in fp32 whatever the algorithm, and a chunked kernel that
stores its states in bf16 (as flash-linear-attention does) carries bf16's rounding into an
fp32 output. The compute-precision floor measures that cost on the same inputs. A kernel
that fails its standard but stays within a small factor of this floor (msprobe's
benchmark ratios, L0: RMSE and mean relative error 2x, max relative error 10x), where
the floor itself uses at least half of the standard's budget, PASSes with a warning that
shows both figures; otherwise it FAILs.

``working(t)`` marks, inside a golden (or an op's ``compute_floor`` function), an
intermediate a real kernel stores in the working dtype: identity for the float64 golden,
rounded to the case's dtype in the compute-precision evaluation.
"""
from __future__ import annotations

import contextlib
import math
import threading
from contextlib import contextmanager

import torch

from verify.comparator import dtypes as dt
from verify.golden import floors
from verify.golden import source as golden_source
from verify.cases import selection
from verify.cases.case import Case
from verify.specs import registry
from verify.specs.registry import OpSpec

# msprobe's benchmark standard, L0 api level (verify/benchmark.py): the kernel's error
# over the floor's, per metric
RATIO_LIMITS = {"rmse": 2.0, "mere": 2.0, "mare": 10.0}
# The floor excuses a FAIL only where it takes at least this share of the standard's
# budget itself (its margin): where a correct kernel computing in that precision meets the
# standard with room to spare, the standard is reachable and a failing kernel is worse
# than that (a softmax computed in bf16 fails the ULP standard that fp32 compute meets).
MIN_FLOOR_MARGIN = 0.5
FIELDS = ("mere", "mare", "max_abs", "max_rel", "rmse", "ulp_max")
COLUMNS = [f"cfloor_{k}" for k in FIELDS] + ["cfloor_margin", "cfloor_ratio"]

_STATE = threading.local()


def working(t):
    """An intermediate a real kernel keeps in the working dtype (the case's dtype): the
    float64 golden leaves it as it is; the compute-precision floor rounds it there."""
    dtype = getattr(_STATE, "dtype", None)
    if dtype is None or not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
        return t
    return t.to(dtype).to(t.dtype)


@contextmanager
def _working_dtype(dtype: torch.dtype):
    before = getattr(_STATE, "dtype", None)
    _STATE.dtype = dtype
    try:
        yield
    finally:
        _STATE.dtype = before


def applies(spec: OpSpec, case: Case) -> bool:
    """A floor exists when the op has one and the case computes below float64."""
    if spec.compute_floor is False:
        return False
    compute = dt.to_torch(spec.compute_dtype)
    return compute != torch.float64 and dt.to_torch(case.dtype) != torch.float64


def trajectory(spec: OpSpec, case: Case, first_inputs: dict) -> list[dict]:
    """Per step, every output (and gradient) of the compute-precision evaluation,
    written in its output dtype, by name. Float inputs go in as the compute dtype
    (integers as the golden takes them); each step's fed-back outputs are rounded to
    their dtype first, as a kernel's are."""
    compute = dt.to_torch(spec.compute_dtype)
    working_dtype = dt.to_torch(case.dtype)
    fn = spec.compute_floor if callable(spec.compute_floor) else None
    names = golden_source.golden_names(spec, case)

    def out_dtype(name):
        return spec.output_dtype(name, case.dtype, case.params)

    def cast(v):
        if v is None:
            return None
        return v.to(compute) if v.dtype.is_floating_point else v.to(torch.float64)

    def feed(name, value):
        if not value.dtype.is_floating_point:
            return value
        return value.detach().to(out_dtype(name)).to(compute)

    with _working_dtype(working_dtype), \
            contextlib.nullcontext() if case.backward else torch.no_grad():
        steps = golden_source.golden_trajectory(spec, case, first_inputs, cast=cast, fn=fn,
                                                feed=feed)
    out = []
    for outs in steps:
        step = {}
        for name, value in zip(names, outs):
            value = value.detach()
            want = out_dtype(name)
            step[name] = value.to(want) if value.dtype.is_floating_point else value
        out.append(step)
    return out


# bump when the evaluation itself changes (what is cast, rounded or fed back)
EVALUATION = "1"


def store_key(spec: OpSpec, golden_key: str) -> str:
    """The store key of a case's compute-precision floor: derived from its golden's key
    (the case, the golden version: the golden's code and its verify.working marks), the
    compute dtype and the function evaluated, so it is computed once per golden and kept
    beside it."""
    import hashlib

    fn = ""
    if callable(spec.compute_floor):
        from verify.specs import golden_version as gv
        fn = gv.fingerprint(spec.compute_floor, [])
    blob = f"{golden_key}|compute_floor|{spec.compute_dtype}|{EVALUATION}|{fn}"
    return hashlib.sha256(blob.encode()).hexdigest()


def ratios(kernel, floor) -> dict[str, float]:
    """The kernel's error metrics over the floor's (inf where the floor is exact and the
    kernel is not; 0 where both are exact)."""
    out = {}
    for k in RATIO_LIMITS:
        mine, theirs = float(getattr(kernel, k)), float(getattr(floor, k))
        if not (math.isfinite(mine) and math.isfinite(theirs)):
            out[k] = math.inf
        elif mine == 0.0:
            out[k] = 0.0
        else:
            out[k] = mine / theirs if theirs > 0 else math.inf
    return out


def worst_ratio(r: dict[str, float]) -> float:
    """The largest ratio over its limit: <= 1 is within the floor."""
    return max(r[k] / RATIO_LIMITS[k] for k in RATIO_LIMITS)


def describe(r: dict[str, float]) -> str:
    return ", ".join(f"{name} {r[k]:.3g}x (limit {RATIO_LIMITS[k]:g}x)"
                     for k, name in (("rmse", "RMSE"), ("mere", "mean rel"),
                                     ("mare", "max rel")))


def columns(floor_metrics, floor_margin: float, ratio: float) -> dict:
    cols = {f"cfloor_{k}": getattr(floor_metrics, k) for k in FIELDS}
    cols.update(cfloor_margin=floor_margin, cfloor_ratio=ratio)
    return cols


def live_golden_keys(cases_dirs: list[str]) -> set[str]:
    """Keys of every case (all levels) in these folders or files under today's golden
    versions."""
    keys = set()
    for case in selection.load_sources(cases_dirs):
        if case.expect_error:
            continue
        spec = registry.op(case.op)
        key = case.golden_key(spec.golden_version)
        keys.add(key)
        keys.add(floors.store_key(key))  # both floors' figures, kept beside it
        if applies(spec, case):  # the compute-precision floor kept beside it
            keys.add(store_key(spec, key))
    return keys
