"""Compare one output with its golden under a standard, with the error floor beside it.

The error floor is the same metrics for the golden rounded to the output dtype: the best
any kernel writing that dtype can do. When even that fails the standard, the verdict
carries a warning: the standard cannot be met by the correctly rounded result.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from verify.comparator import dtypes as dt
from verify.comparator import standards
from verify.errors import ConfigError
from verify.comparator import benchmark as bm
from verify.comparator.metrics import (FLOOR_DTYPES, Metrics, exact_metrics, measure_all,
                                      measure_floor, measure_pair, round_once)


@dataclass(frozen=True)
class KnownFloor:
    """An output's error floor, computed once per golden (``output_floor``) and kept with
    it (verify/golden/floors.py): the figures of the golden rounded once to the output
    dtype under a standard's params. ``compare(..., floor=known)`` then reads only the
    kernel's output and the golden."""
    metrics: Metrics
    histogram: dict | None  # the floor's error histogram (plotdata), None without plots


def output_floor(golden: torch.Tensor, dtype, standard=None, output: str | None = None,
                 plots: bool = True) -> KnownFloor | None:
    """The error floor of ``golden`` written as ``dtype`` under ``standard``: the same
    figures, bit for bit, as ``compare``'s own floor (None for an integer output)."""
    spec = resolve_standard(standard, output)
    out_dtype = dt.to_torch(dtype)
    if not out_dtype.is_floating_point or spec["name"] == "benchmark":
        return None
    tolerances = dict(atol=spec.get("atol"), rtol=spec.get("rtol"),
                      scale=float(spec.get("scale", 1.0)))
    if out_dtype in FLOOR_DTYPES:
        m, hist = measure_floor(golden, out_dtype, hist=plots, **tolerances)
    else:  # float64 (the golden itself), fp8: the rounded golden measured as an output
        rounded = round_once(golden.detach().to("cpu", torch.float64), out_dtype)
        m, _, both, _ = measure_all(rounded, golden, out_dtype, floor=False, hist=plots,
                                    **tolerances)
        hist = both["actual"] if both else None
    # the pass's own floor locates no worst element: neither does this one
    return KnownFloor(replace(m, argmax_abs=-1, argmax_rel=-1), hist)


@dataclass
class Verdict:
    verdict: str  # PASS | FAIL
    standard: str
    reason: str
    warning: str
    dtype: str
    metrics: Metrics
    floor: Metrics | None
    margin: float = float("nan")        # deciding metric / threshold (>= 1 fails)
    floor_margin: float = float("nan")  # the same for the correctly rounded golden
    spec: dict | None = None            # the standard with its params
    extra: dict = field(default_factory=dict)  # the benchmark standard's figures
    histogram: dict | None = None  # the report's error histogram, from the metrics pass
    heatmap: dict | None = None    # the report's heat map (2+ dims), from the same pass

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"


def resolve_standard(spec, output: str | None = None) -> dict:
    """A standard given as a name or {'name': .., params.., 'outputs': {out: {..}}}."""
    if spec is None:
        spec = {"name": "cann_v1"}
    if isinstance(spec, str):
        spec = {"name": spec}
    spec = dict(spec)
    per_output = spec.pop("outputs", {}) or {}
    if output is not None and output in per_output:
        override = per_output[output]
        override = {"name": override} if isinstance(override, str) else dict(override)
        if "name" in override and override["name"] != spec.get("name"):
            spec = override  # another standard: its params only
        else:
            spec.update(override)
    spec.setdefault("name", "cann_v1")
    if spec["name"] not in standards.STANDARDS:
        raise ConfigError(f"unknown standard '{spec['name']}'; known: "
                          f"{', '.join(sorted(standards.STANDARDS))}")
    return spec


def compare(actual: torch.Tensor, golden: torch.Tensor, dtype=None, standard=None,
            output: str | None = None, floor: "bool | KnownFloor" = True,
            benchmark: torch.Tensor | None = None, plots: bool = True) -> Verdict:
    """Judge ``actual`` against the float64 ``golden``.

    standard="benchmark" (msprobe's benchmark standard) judges ``actual`` by the ratios of
    its error metrics to those of ``benchmark``, another kernel's output on the same inputs.

    dtype: the output dtype whose constants apply (default: actual's dtype).
    standard: a name ('cann_v1', 'allclose', ...) or a dict with params.
    plots=False: no histogram or heat map (a figure of its own, a floor's, say).
    floor: True computes the error floor in the same pass; a ``KnownFloor`` (from
    ``output_floor`` on this golden, dtype and standard) is taken as it is; False: none.
    """
    if standard == "benchmark" or (isinstance(standard, dict)
                                   and standard.get("name") == "benchmark"):
        if benchmark is None:
            raise ConfigError("standard 'benchmark' needs benchmark=<the benchmark kernel's "
                              "output on the same inputs>")
        return compare_benchmark(actual, golden, benchmark,
                                 dt.to_torch(dtype) if dtype is not None else actual.dtype)
    spec = resolve_standard(standard, output)
    out_dtype = dt.to_torch(dtype) if dtype is not None else actual.dtype
    if tuple(actual.shape) != tuple(golden.shape):
        raise ValueError(f"shape {tuple(actual.shape)} differs from the golden's "
                         f"{tuple(golden.shape)}")
    if not out_dtype.is_floating_point:
        m = exact_metrics(actual, golden)
        ok, reason = standards.judge("exact", m, out_dtype)
        return Verdict("PASS" if ok else "FAIL", "exact", reason, "", dt.name_of(out_dtype),
                       m, None, standards.margin("exact", m, out_dtype), float("nan"),
                       {"name": "exact"})
    name = spec["name"]
    known = floor if isinstance(floor, KnownFloor) else None
    m, f, hist, heat = measure_all(actual, golden, out_dtype, atol=spec.get("atol"),
                                   rtol=spec.get("rtol"), floor=floor is True,
                                   scale=float(spec.get("scale", 1.0)), hist=plots,
                                   heat="tol" if name == "allclose" else "rel")
    if known is not None:
        f = known.metrics
        if hist is not None and known.histogram is not None:
            hist["floor"] = known.histogram
    if name == "exact":  # bitwise, never through allclose's tolerances
        em = exact_metrics(actual, golden)
        ok, reason = standards.judge("exact", em, out_dtype, spec)
        return Verdict("PASS" if ok else "FAIL", "exact", reason, "", dt.name_of(out_dtype),
                       m, f, standards.margin("exact", em, out_dtype, spec), float("nan"), spec,
                       histogram=hist, heatmap=heat)
    ok, reason = standards.judge(name, m, out_dtype, spec)
    warnings = []
    floor_margin = float("nan")
    if f is not None:
        floor_ok, floor_reason = standards.judge(name, f, out_dtype, spec)
        floor_margin = standards.margin(name, f, out_dtype, spec)
        if not floor_ok:
            warnings.append(f"{name} cannot be met even by the correctly rounded golden "
                            f"({floor_reason})")
        bias = rounding_bias(m, f, actual, golden)
        if bias:
            warnings.append(bias)
    warning = " | ".join(warnings)
    return Verdict("PASS" if ok else "FAIL", name, reason, warning, dt.name_of(out_dtype),
                   m, f, standards.margin(name, m, out_dtype, spec), floor_margin, spec,
                   histogram=hist, heatmap=heat)


def compare_benchmark(actual: torch.Tensor, golden: torch.Tensor, bench: torch.Tensor,
                      out_dtype: torch.dtype) -> Verdict:
    """msprobe's benchmark standard (verify/benchmark.py): FAIL when the kernel's error
    metrics exceed the benchmark kernel's by more than msprobe's ratio thresholds."""
    if tuple(bench.shape) != tuple(golden.shape):
        raise ValueError(f"the benchmark's shape {tuple(bench.shape)} differs from the "
                         f"golden's {tuple(golden.shape)}")
    m, f = measure_pair(actual, golden, out_dtype)
    mine = bm.metrics(actual, golden, out_dtype)
    theirs = bm.metrics(bench, golden, out_dtype)
    ok, reason, ratios = bm.judge(mine, theirs, out_dtype)
    finite = [ratios[k] / bm.THRESHOLDS[k] for k in bm.DECIDING if not math.isnan(ratios[k])]
    extra = {**{f"ms_{k}": v for k, v in mine.items()},
             **{f"bench_{k}": v for k, v in theirs.items()},
             **{f"ratio_{k}": v for k, v in ratios.items()}}
    return Verdict("PASS" if ok else "FAIL", "benchmark", reason, "", dt.name_of(out_dtype),
                   m, f, max(finite, default=0.0), float("nan"), {"name": "benchmark"}, extra)


BIAS_MIN_ELEMENTS = 64
BIAS_THRESHOLD = 0.9      # net share off in one direction: a directed conversion moves ~all
BIAS_FLOOR_MAX = 0.25     # the correctly rounded golden's own net share stays below this
BIAS_ULP_MEAN_MAX = 1.0   # a conversion's error stays within one unit in the last place


DIRECTED_MATCH_MIN = 0.9  # share of outputs equal to the golden rounded that way


def directed_share(actual: torch.Tensor | None, golden: torch.Tensor | None,
                   toward_zero: bool) -> float | None:
    """The share of inexact outputs that equal the golden rounded toward zero (or away
    from it) in the output dtype: ~1 for a directed conversion, low for a factor slightly
    off 1 (a uniform scale error such as 1 - 1/(2N)), whose outputs are the scaled values
    rounded to nearest. None without tensors."""
    if actual is None or golden is None or not actual.dtype.is_floating_point:
        return None
    a = actual.detach().reshape(-1).cpu()
    g = golden.detach().reshape(-1).to(torch.float64).cpu()
    nearest = round_once(g, a.dtype)
    n64 = nearest.to(torch.float64)
    step = (n64.abs() > g.abs()) if toward_zero else (n64.abs() < g.abs())
    target = torch.zeros_like(nearest) if toward_zero else torch.where(
        nearest >= 0, torch.full_like(nearest, float("inf")), torch.full_like(nearest, -float("inf")))
    directed = torch.where(step, torch.nextafter(nearest, target), nearest)
    inexact = torch.isfinite(g) & (a.to(torch.float64) != g)
    n = int(inexact.sum())
    if n == 0:
        return None
    return float((a[inexact] == directed[inexact]).sum()) / n


def rounding_bias(m, f, actual=None, golden=None) -> str:
    """A warning when the final rounding looks directed rather than to nearest: most
    inexact outputs off in one direction of magnitude while their errors stay at the
    rounding level (mean ULP error <= 1). Larger errors are the arithmetic's, not a
    conversion's, and say nothing about the rounding mode. Truncation is suggested only
    for outputs smaller in magnitude, and a conversion is blamed only when the outputs
    are the golden rounded that way (a factor slightly off 1 is a scale, not a rounding)."""
    if m.n < BIAS_MIN_ELEMENTS or abs(m.mag_bias) < BIAS_THRESHOLD \
            or abs(f.mag_bias) >= BIAS_FLOOR_MAX or not m.ulp_mean <= BIAS_ULP_MEAN_MAX:
        return ""
    share = f"on net {abs(m.mag_bias):.0%} of the inexact outputs are"
    detail = (f"(mag_bias {m.mag_bias:+.2f}, correctly rounded {f.mag_bias:+.2f}, mean ULP "
              f"error {m.ulp_mean:.2f})")
    matched = directed_share(actual, golden, toward_zero=m.mag_bias > 0)
    if matched is not None and matched < DIRECTED_MATCH_MIN:
        way = "smaller" if m.mag_bias > 0 else "larger"
        return (f"biased error, not a conversion: {share} {way} in magnitude than the golden "
                f"{detail}, but only {matched:.0%} of them equal the golden rounded "
                f"{'toward' if m.mag_bias > 0 else 'away from'} zero: a uniform scale error "
                f"(a factor slightly {'below' if m.mag_bias > 0 else 'above'} 1, such as "
                f"1 {'-' if m.mag_bias > 0 else '+'} 1/(2N): a wrong count, eps or step "
                f"size)?")
    if m.mag_bias > 0:
        return (f"biased rounding toward zero: {share} smaller in magnitude than the golden "
                f"{detail}; a truncating conversion instead of round-to-nearest-even?")
    return (f"biased rounding away from zero: {share} larger in magnitude than the golden "
            f"{detail}; a conversion rounding up in magnitude instead of to nearest even?")


def compare_topk(actual: torch.Tensor, golden: torch.Tensor, scores: torch.Tensor,
                 tie_rtol: float = 1e-6) -> Verdict:
    """Top-k index rows compared as sets: an expert the kernel chose instead of the
    golden's passes only when its golden score ties the k-th best score (within
    ``tie_rtol``), since tied experts may come in either order. A wrong expert FAILs and
    the reason names the row."""
    a = actual.detach().cpu().reshape(-1, actual.shape[-1]).to(torch.int64)
    g = golden.detach().cpu().reshape(-1, golden.shape[-1]).to(torch.int64)
    s = scores.detach().cpu().reshape(-1, scores.shape[-1]).to(torch.float64)
    bad_rows, first = 0, ""
    n_experts = s.shape[-1]
    for row in range(a.shape[0]):
        got, want = a[row].tolist(), g[row].tolist()
        if set(got) == set(want) and len(set(got)) == len(got):
            continue
        problem = ""
        if any(i < 0 or i >= n_experts for i in got) or len(set(got)) != len(got):
            problem = f"indices {got} are not {len(want)} distinct experts of {n_experts}"
        else:
            kth = float(s[row, want].min())
            tol = tie_rtol * max(abs(kth), 1e-30)
            extra = [i for i in got if i not in want]
            if any(abs(float(s[row, i]) - kth) > tol for i in extra):
                e = extra[0]
                problem = (f"expert {e} chosen (golden score {float(s[row, e]):.6g}) where the "
                           f"golden's top-{len(want)} is {sorted(want)} (k-th score {kth:.6g})")
        if problem:
            bad_rows += 1
            first = first or f"row {row}: {problem}"
    n = a.shape[0]
    m = exact_metrics(torch.zeros(n), torch.zeros(n))  # index rows: only the count matters
    m.allclose_mismatch = bad_rows
    m.tol_ratio = float(bad_rows)
    ok = bad_rows == 0
    reason = (f"top-{a.shape[-1]} sets match in all {n} rows (ties tolerated)" if ok
              else f"{bad_rows}/{n} rows choose other experts; {first}")
    return Verdict("PASS" if ok else "FAIL", "topk_set", reason, "", dt.name_of(actual.dtype),
                   m, None, float(bad_rows), float("nan"), {"name": "topk_set"})
