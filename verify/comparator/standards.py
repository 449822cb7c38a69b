"""Precision standards by name: pure functions of Metrics (reference/standards.md).

Each standard returns (passed, reason); the reason names the deciding metric and its
threshold, so a FAIL row says why without opening the data.
"""
from __future__ import annotations

from typing import Callable

import torch

from verify.comparator import dtypes as dt
from verify.comparator.metrics import Metrics

Judge = Callable[[Metrics, torch.dtype, dict], tuple[bool, str]]
STANDARDS: dict[str, Judge] = {}
# parameters a standard accepts in a case file (besides 'name')
PARAMS: dict[str, tuple[str, ...]] = {}


def standard(name: str, params: tuple[str, ...] = ()):
    def wrap(fn: Judge) -> Judge:
        STANDARDS[name] = fn
        PARAMS[name] = params
        return fn
    return wrap


def _g(x: float) -> str:
    return f"{x:.3g}"


def _pair(got: float, need: float) -> tuple[str, str]:
    """A value and the threshold it is compared with, printed with as many digits as it
    takes to tell them apart (a share of 0.98995 against 0.99 is not '0.99 < 0.99')."""
    for digits in range(3, 18):
        a, b = f"{got:.{digits}g}", f"{need:.{digits}g}"
        if a != b or got == need:
            return a, b
    return repr(got), repr(need)


def _v1_threshold(dtype, spec) -> float:
    return (float(spec.get("threshold", dt.traits(dtype).cann_v1_threshold))
            * float(spec.get("scale", 1.0)))


def _v2_limit(dtype, spec) -> float:
    return float(spec.get("limit", dt.traits(dtype).v2_max_abs)) * float(spec.get("scale", 1.0))


@standard("cann_v1", ("threshold", "scale"))
def cann_v1(m: Metrics, dtype, spec):
    """CANN v1: MERE < T and MARE < 10 T, T per output dtype (times ``scale``)."""
    t = _v1_threshold(dtype, spec)
    if m.mere >= t:
        return False, "MERE {} >= {}".format(*_pair(m.mere, t))
    if m.mare >= 10 * t:
        return False, "MARE {} >= 10*T {}".format(*_pair(m.mare, 10 * t))
    return True, f"MERE {_g(m.mere)} < {_g(t)}, MARE {_g(m.mare)} < {_g(10 * t)}"


@standard("cann_v2", ("ratio", "limit", "scale"))
def cann_v2(m: Metrics, dtype, spec):
    """CANN v2 mixed tolerance: share(d <= atol + rtol|g|) >= 0.99 and max abs within the
    limit (the published limit 'X or 32 ULP' passes when either holds)."""
    tr = dt.traits(dtype)
    ratio = float(spec.get("ratio", 0.99))
    limit = _v2_limit(dtype, spec)
    k = float(spec.get("scale", 1.0))
    if m.v2_match_ratio < ratio:
        got, need = _pair(m.v2_match_ratio, float(ratio))
        return False, (f"matched {got} < {need} "
                       f"(atol {_g(tr.v2_atol * k)}, rtol {_g(tr.v2_rtol * k)})")
    if m.max_abs > limit and m.ulp_max > 32:
        return False, f"max abs {_g(m.max_abs)} > {_g(limit)} and max ULP {_g(m.ulp_max)} > 32"
    return True, f"matched {_g(m.v2_match_ratio)} >= {ratio}"


@standard("allclose", ("atol", "rtol", "scale"))
def allclose(m: Metrics, dtype, spec):
    """Every element within atol + rtol*|g| (torch.testing defaults unless the case says)."""
    if m.allclose_mismatch > 0:
        return False, (f"{m.allclose_mismatch}/{m.n} elements outside atol {_g(m.atol)} + "
                       f"rtol {_g(m.rtol)}*|g| (max abs {_g(m.max_abs)})")
    return True, f"all within atol {_g(m.atol)} + rtol {_g(m.rtol)}*|g|"


def _ratio_standard(field: str, t: float):
    def judge(m: Metrics, dtype, spec):
        need = float(spec.get("ratio", 1.0 - t))
        got = getattr(m, field)
        if got < need:
            return False, "{} ratio {} < {} (rel < {})".format(field, *_pair(got, need), t)
        return True, f"{field} ratio {_g(got)} >= {_g(need)}"
    judge.__doc__ = f"msprobe {field} standard: share of elements with rel < {t} >= 1 - {t}."
    return judge


standard("hundredth", ("ratio",))(_ratio_standard("hundredth", 1e-2))
standard("thousandth", ("ratio",))(_ratio_standard("thousandth", 1e-3))
standard("ten_thousandth", ("ratio",))(_ratio_standard("ten_thousandth", 1e-4))


@standard("ulp")
def ulp(m: Metrics, dtype, spec):
    """msprobe ULP: fp32 mean ULP < 64 or share(ULP > 32) < 0.05; fp16 / bf16
    share(ULP > 1) < 0.001."""
    if dtype in (torch.float16, torch.bfloat16):
        if m.ulp_gt1_ratio >= 0.001:
            return False, "share(ULP > 1) {} >= {}".format(*_pair(m.ulp_gt1_ratio, 0.001))
        return True, f"share(ULP > 1) {_g(m.ulp_gt1_ratio)} < 0.001"
    if m.ulp_mean < 64 or m.ulp_gt32_ratio < 0.05:
        return True, f"mean ULP {_g(m.ulp_mean)}, share(ULP > 32) {_g(m.ulp_gt32_ratio)}"
    return False, f"mean ULP {_g(m.ulp_mean)} >= 64 and share(ULP > 32) {_g(m.ulp_gt32_ratio)} >= 0.05"


@standard("abs_threshold")
def abs_threshold(m: Metrics, dtype, spec):
    """msprobe absolute threshold: no normal value with rel > rtol (fp16 2^-10, bf16 2^-8,
    fp32 2^-20) and no small value with abs error > its atol."""
    rtol = dt.traits(dtype).abs_threshold_rtol
    if m.rel_err_ratio > 0:
        return False, f"relative-error ratio {_g(m.rel_err_ratio)} > 0 (rel > {_g(rtol)})"
    if m.small_err_ratio > 0:
        return False, f"small-value error ratio {_g(m.small_err_ratio)} > 0"
    return True, "no element over the absolute thresholds"


@standard("cosine", ("min",))
def cosine(m: Metrics, dtype, spec):
    """Cosine similarity > 0.99 (msprobe; hicann's 1 - cos <= 0.01)."""
    need = float(spec.get("min", 0.99))
    if m.cosine <= need:
        return False, f"cosine {m.cosine:.6f} <= {need}"
    return True, f"cosine {m.cosine:.6f} > {need}"


@standard("exact")
def exact(m: Metrics, dtype, spec):
    """Equal values: integers as integers; floats bitwise up to the sign of zero (NaN
    matches NaN). ``m`` comes from metrics.exact_metrics."""
    if m.allclose_mismatch > 0:
        return False, f"{m.allclose_mismatch}/{m.n} elements differ (max abs {_g(m.max_abs)})"
    return True, "all elements equal"


def _margin(name: str, m: Metrics, dtype: torch.dtype, spec: dict) -> float:
    tr = dt.traits(dtype) if dtype.is_floating_point else None
    if name == "cann_v1":
        t = _v1_threshold(dtype, spec)
        return max(m.mere / t, m.mare / (10 * t))
    if name == "cann_v2":
        ratio = float(spec.get("ratio", 0.99))
        limit = _v2_limit(dtype, spec)
        share = (1.0 - m.v2_match_ratio) / max(1.0 - ratio, 1e-12)
        return max(share, min(m.max_abs / limit, m.ulp_max / 32))
    if name == "allclose":
        return m.tol_ratio
    if name in ("hundredth", "thousandth", "ten_thousandth"):
        t = {"hundredth": 1e-2, "thousandth": 1e-3, "ten_thousandth": 1e-4}[name]
        need = float(spec.get("ratio", 1.0 - t))
        return (1.0 - getattr(m, name)) / max(1.0 - need, 1e-12)
    if name == "ulp":
        if dtype in (torch.float16, torch.bfloat16):
            return m.ulp_gt1_ratio / 0.001
        return min(m.ulp_mean / 64, m.ulp_gt32_ratio / 0.05)
    if name == "abs_threshold":
        bad = max(m.rel_err_ratio, m.small_err_ratio)
        return 1.0 + bad if bad > 0 else m.max_rel / tr.abs_threshold_rtol
    if name == "cosine":
        return (1.0 - m.cosine) / max(1.0 - float(spec.get("min", 0.99)), 1e-12)
    if name == "exact":
        return float(m.allclose_mismatch > 0)
    return float("nan")


def margin(name: str, m: Metrics, dtype: torch.dtype, spec: dict | None = None) -> float:
    """How close to failing: the deciding metric over its threshold (>= 1 fails; for
    abs_threshold an estimate below 1). Ranks the worst outputs of a run."""
    if m.nan_inf_mismatch:
        return float("inf")
    return float(_margin(name, m, dtype, spec or {}))


def judge(name: str, m: Metrics, dtype: torch.dtype, spec: dict | None = None):
    """Apply a standard; NaN / Inf in different places fails every standard."""
    spec = spec or {}
    if m.nan_inf_mismatch:
        return False, f"NaN/Inf placement differs at {m.nan_inf_mismatch} elements"
    return STANDARDS[name](m, dtype, spec)
