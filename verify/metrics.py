"""All precision metrics of one output in a single streaming pass.

The pass walks (actual, golden) in fixed blocks of 64Ki elements; a compiled block
function (numba) accumulates every counter and sum that the standards need, blocks run in
parallel, and the per-block partial results are combined in block order. Fixed blocks make
the figures independent of thread count and chunking, and nothing of tensor size is
allocated beyond one chunk of the upcast actual.

Definitions follow reference/standards.md (a = actual, g = golden, d = |a - g|):
- mere / mare: mean / max of d / (|g| + 1e-7) (CANN v1)
- max_rel: max of d / |g| over g != 0 (inf when some g == 0 has d > 0)
- rmse, cosine, eb = |#(a>g) - #(a<g)| / n (msprobe), eb_mean = |mean((a-g)/max(1,|g|))| (ATB)
- ULP = d * 2^(mantissa - max(floor(log2|g|), min_exp)) (msprobe)
- small-value domain |g| <= small_value: an element is wrong when d > small_value_atol
- hundredth / thousandth / ten_thousandth: share of elements within d/(|g|+eps) < t
  (small values: within their atol)
- NaN / Inf placement: same NaN, or same signed Inf, is equal; anything else is a mismatch.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch

os.environ.setdefault("NUMBA_CACHE_DIR",
                      os.path.join(os.path.expanduser("~"), ".cache", "kernel-verify-numba"))
import numba  # noqa: E402
from numba import njit, prange  # noqa: E402

from . import dtypes as dt  # noqa: E402

BLOCK = 1 << 16
CHUNK = BLOCK * 64  # elements upcast at a time

# accumulator slots
(N, NONFINITE_BAD, SPECIAL_EQ, SUM_REL, MAX_REL_CANN, ARG_REL, MAX_ABS, ARG_ABS, SUM_SQ,
 DOT, AA, GG, N_GT, N_LT, SUM_EB, MAX_ULP, SUM_ULP, N_ULP1, N_ULP32, N_SMALL, N_SMALL_BAD,
 N_OK_1E2, N_OK_1E3, N_OK_1E4, N_REL_BAD, N_V2, N_CASE, MAX_REL, N_SLOTS) = range(29)

# constants slots
(C_EPS_CANN, C_EPS_MS, C_SMALL, C_SMALL_ATOL, C_MANT, C_MIN_EXP, C_V2_ATOL, C_V2_RTOL,
 C_ATOL, C_RTOL, C_ABS_RTOL, C_OFFSET) = range(12)


@njit(cache=True, nogil=True)
def _block(a, g, lo, hi, c, out):
    for k in range(N_SLOTS):
        out[k] = 0.0
    out[ARG_REL] = -1.0
    out[ARG_ABS] = -1.0
    eps_cann, eps_ms = c[C_EPS_CANN], c[C_EPS_MS]
    small, small_atol = c[C_SMALL], c[C_SMALL_ATOL]
    mant, min_exp = int(c[C_MANT]), int(c[C_MIN_EXP])
    for i in range(lo, hi):
        av = np.float64(a[i])
        gv = g[i]
        if not (math.isfinite(av) and math.isfinite(gv)):
            if math.isnan(av) and math.isnan(gv):
                out[SPECIAL_EQ] += 1.0
            elif (not math.isnan(av)) and (not math.isnan(gv)) and av == gv:
                out[SPECIAL_EQ] += 1.0
            else:
                out[NONFINITE_BAD] += 1.0
            continue
        out[N] += 1.0
        d = abs(av - gv)
        ag = abs(gv)
        out[SUM_SQ] += d * d
        out[DOT] += av * gv
        out[AA] += av * av
        out[GG] += gv * gv
        if av > gv:
            out[N_GT] += 1.0
        elif av < gv:
            out[N_LT] += 1.0
        out[SUM_EB] += (av - gv) / max(1.0, ag)
        if d > out[MAX_ABS] or out[ARG_ABS] < 0:
            out[MAX_ABS] = d
            out[ARG_ABS] = i + c[C_OFFSET]
        rel = d / (ag + eps_cann)
        out[SUM_REL] += rel
        if rel > out[MAX_REL_CANN] or out[ARG_REL] < 0:
            out[MAX_REL_CANN] = rel
            out[ARG_REL] = i + c[C_OFFSET]
        if ag > 0.0:
            pr = d / ag
            if pr > out[MAX_REL]:
                out[MAX_REL] = pr
        elif d > 0.0:
            out[MAX_REL] = np.inf
        if ag == 0.0:
            e = min_exp
        else:
            e = math.frexp(ag)[1] - 1
            if e < min_exp:
                e = min_exp
        ulp = math.ldexp(d, mant - e)
        if ulp > out[MAX_ULP]:
            out[MAX_ULP] = ulp
        out[SUM_ULP] += ulp
        if ulp > 1.0:
            out[N_ULP1] += 1.0
        if ulp > 32.0:
            out[N_ULP32] += 1.0
        if ag <= small:
            out[N_SMALL] += 1.0
            ok = d <= small_atol
            if not ok:
                out[N_SMALL_BAD] += 1.0
            ok2 = ok
            ok3 = ok
            ok4 = ok
        else:
            r = d / (ag + eps_ms)
            ok2 = r < 1e-2
            ok3 = r < 1e-3
            ok4 = r < 1e-4
            if r > c[C_ABS_RTOL]:
                out[N_REL_BAD] += 1.0
        if ok2:
            out[N_OK_1E2] += 1.0
        if ok3:
            out[N_OK_1E3] += 1.0
        if ok4:
            out[N_OK_1E4] += 1.0
        if d <= c[C_V2_ATOL] + c[C_V2_RTOL] * ag:
            out[N_V2] += 1.0
        if d <= c[C_ATOL] + c[C_RTOL] * ag:
            out[N_CASE] += 1.0


@njit(cache=True, parallel=True)
def _blocks(a, g, c, out):
    n = a.shape[0]
    for b in prange(out.shape[0]):
        lo = b * BLOCK
        hi = min(lo + BLOCK, n)
        _block(a, g, lo, hi, c, out[b])


_SUMS = (N, NONFINITE_BAD, SPECIAL_EQ, SUM_REL, SUM_SQ, DOT, AA, GG, N_GT, N_LT, SUM_EB,
         SUM_ULP, N_ULP1, N_ULP32, N_SMALL, N_SMALL_BAD, N_OK_1E2, N_OK_1E3, N_OK_1E4,
         N_REL_BAD, N_V2, N_CASE)


def _combine(parts: np.ndarray) -> np.ndarray:
    acc = np.zeros(N_SLOTS)
    acc[ARG_ABS] = acc[ARG_REL] = -1
    for p in parts:  # block order: deterministic
        for k in _SUMS:
            acc[k] += p[k]
        for val, arg in ((MAX_ABS, ARG_ABS), (MAX_REL_CANN, ARG_REL)):
            if p[arg] >= 0 and (acc[arg] < 0 or p[val] > acc[val]):
                acc[val], acc[arg] = p[val], p[arg]
        acc[MAX_ULP] = max(acc[MAX_ULP], p[MAX_ULP])
        acc[MAX_REL] = max(acc[MAX_REL], p[MAX_REL])
    return acc


@dataclass
class Metrics:
    """Metrics of one output against its golden; every field is a plain number."""

    n: int
    nan_inf_mismatch: int
    mere: float
    mare: float
    max_abs: float
    max_rel: float
    rmse: float
    cosine: float
    eb: float
    eb_mean: float
    ulp_max: float
    ulp_mean: float
    ulp_gt1_ratio: float
    ulp_gt32_ratio: float
    small_count: int
    small_err_ratio: float
    rel_err_ratio: float
    hundredth: float
    thousandth: float
    ten_thousandth: float
    v2_match_ratio: float
    allclose_mismatch: int
    atol: float
    rtol: float
    argmax_abs: int
    argmax_rel: int

    def as_dict(self, prefix: str = "") -> dict:
        return {prefix + k: v for k, v in asdict(self).items()}

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _finish(acc: np.ndarray, atol: float, rtol: float) -> Metrics:
    n = int(acc[N])
    normal = n - int(acc[N_SMALL])
    nn = max(n, 1)
    if acc[AA] == 0 and acc[GG] == 0:
        cosine = 1.0
    elif acc[AA] == 0 or acc[GG] == 0:
        cosine = 0.0
    else:
        cosine = float(acc[DOT] / math.sqrt(acc[AA] * acc[GG]))
    return Metrics(
        n=n,
        nan_inf_mismatch=int(acc[NONFINITE_BAD]),
        mere=float(acc[SUM_REL] / nn),
        mare=float(acc[MAX_REL_CANN]),
        max_abs=float(acc[MAX_ABS]),
        max_rel=float(acc[MAX_REL]),
        rmse=math.sqrt(acc[SUM_SQ] / nn),
        cosine=cosine,
        eb=float(abs(acc[N_GT] - acc[N_LT]) / nn),
        eb_mean=float(abs(acc[SUM_EB]) / nn),
        ulp_max=float(acc[MAX_ULP]),
        ulp_mean=float(acc[SUM_ULP] / nn),
        ulp_gt1_ratio=float(acc[N_ULP1] / nn),
        ulp_gt32_ratio=float(acc[N_ULP32] / nn),
        small_count=int(acc[N_SMALL]),
        small_err_ratio=float(acc[N_SMALL_BAD] / max(int(acc[N_SMALL]), 1)),
        rel_err_ratio=float(acc[N_REL_BAD] / max(normal, 1)),
        hundredth=float(acc[N_OK_1E2] / nn) if n else 1.0,
        thousandth=float(acc[N_OK_1E3] / nn) if n else 1.0,
        ten_thousandth=float(acc[N_OK_1E4] / nn) if n else 1.0,
        v2_match_ratio=float(acc[N_V2] / nn) if n else 1.0,
        allclose_mismatch=int(n - acc[N_CASE] + acc[NONFINITE_BAD]),
        atol=atol,
        rtol=rtol,
        argmax_abs=int(acc[ARG_ABS]),
        argmax_rel=int(acc[ARG_REL]),
    )


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """torch.testing.assert_close defaults: (atol, rtol)."""
    t = dt.traits(dtype)
    return t.torch_atol, t.torch_rtol


def _constants(dtype: torch.dtype, atol: float, rtol: float) -> np.ndarray:
    t = dt.traits(dtype)
    c = np.zeros(12)
    c[C_EPS_CANN] = 1e-7
    c[C_EPS_MS] = t.msprobe_eps
    c[C_SMALL] = t.small_value
    c[C_SMALL_ATOL] = t.small_value_atol
    c[C_MANT] = t.mantissa_bits
    c[C_MIN_EXP] = t.min_exp
    c[C_V2_ATOL] = t.v2_atol
    c[C_V2_RTOL] = t.v2_rtol
    c[C_ATOL] = atol
    c[C_RTOL] = rtol
    c[C_ABS_RTOL] = t.abs_threshold_rtol
    return c


def _host_view(chunk: torch.Tensor) -> np.ndarray:
    """A float32 / float64 NumPy view of a CPU chunk (bf16 / fp16 upcast exactly)."""
    if chunk.dtype not in (torch.float32, torch.float64):
        chunk = chunk.to(torch.float32)
    return chunk.numpy()


def measure_pair(actual: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype | None = None,
                 atol: float | None = None, rtol: float | None = None,
                 floor: bool = True) -> tuple[Metrics, Metrics | None]:
    """Metrics of ``actual`` and (``floor``) of the golden rounded to the output dtype.

    ``dtype`` is the output dtype whose constants apply (default: actual's dtype).
    """
    dtype = dtype or actual.dtype
    d_atol, d_rtol = default_tolerances(dtype)
    atol = d_atol if atol is None else float(atol)
    rtol = d_rtol if rtol is None else float(rtol)
    a = actual.detach().to("cpu").contiguous().reshape(-1)
    g = golden.detach().to("cpu", torch.float64).contiguous().reshape(-1)
    if a.numel() != g.numel():
        raise ValueError(f"actual has {a.numel()} elements, golden {g.numel()}")
    c = _constants(dtype, atol, rtol)
    parts_a, parts_f = [], []
    total = a.numel()
    for start in range(0, total, CHUNK):
        stop = min(start + CHUNK, total)
        c[C_OFFSET] = start
        g_np = g[start:stop].numpy()
        n_blocks = -(-(stop - start) // BLOCK)
        out = np.empty((n_blocks, N_SLOTS))
        _blocks(_host_view(a[start:stop]), g_np, c, out)
        parts_a.append(out)
        if floor:
            rounded = g[start:stop].to(dtype)
            out_f = np.empty((n_blocks, N_SLOTS))
            _blocks(_host_view(rounded), g_np, c, out_f)
            parts_f.append(out_f)
    empty = np.empty((0, N_SLOTS))
    m_a = _finish(_combine(np.concatenate(parts_a) if parts_a else empty), atol, rtol)
    m_f = None
    if floor:
        m_f = _finish(_combine(np.concatenate(parts_f) if parts_f else empty), atol, rtol)
    return m_a, m_f


def measure(actual: torch.Tensor, golden: torch.Tensor, **kw) -> Metrics:
    return measure_pair(actual, golden, floor=False, **kw)[0]


def exact_metrics(actual: torch.Tensor, golden: torch.Tensor) -> Metrics:
    """Integer / bool outputs: exact comparison, reported in the same fields."""
    a = actual.detach().cpu().reshape(-1).to(torch.float64)
    g = golden.detach().cpu().reshape(-1).to(torch.float64)
    d = (a - g).abs()
    n = a.numel()
    wrong = int((d != 0).sum())
    max_abs = float(d.max()) if n else 0.0
    arg = int(d.argmax()) if n else -1
    ratio = 1.0 - wrong / n if n else 1.0
    return Metrics(n=n, nan_inf_mismatch=0, mere=0.0, mare=0.0, max_abs=max_abs,
                   max_rel=0.0, rmse=float(d.pow(2).mean().sqrt()) if n else 0.0,
                   cosine=1.0, eb=0.0, eb_mean=0.0, ulp_max=max_abs, ulp_mean=0.0,
                   ulp_gt1_ratio=0.0, ulp_gt32_ratio=0.0, small_count=0,
                   small_err_ratio=0.0, rel_err_ratio=0.0, hundredth=ratio,
                   thousandth=ratio, ten_thousandth=ratio, v2_match_ratio=ratio,
                   allclose_mismatch=wrong, atol=0.0, rtol=0.0, argmax_abs=arg,
                   argmax_rel=arg)


def numba_threads() -> int:
    return numba.get_num_threads()
