"""Compare one output with its golden under a standard, with the error floor beside it.

The error floor is the same metrics for the golden rounded to the output dtype: the best
any kernel writing that dtype can do. When even that fails the standard, the verdict
carries a warning: the standard cannot be met by the correctly rounded result.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import dtypes as dt
from . import standards
from .errors import ConfigError
from .metrics import Metrics, exact_metrics, measure_pair


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
            output: str | None = None, floor: bool = True) -> Verdict:
    """Judge ``actual`` against the float64 ``golden``.

    dtype: the output dtype whose constants apply (default: actual's dtype).
    standard: a name ('cann_v1', 'allclose', ...) or a dict with params.
    """
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
    m, f = measure_pair(actual, golden, out_dtype, atol=spec.get("atol"),
                        rtol=spec.get("rtol"), floor=floor)
    ok, reason = standards.judge(name, m, out_dtype, spec)
    warning = ""
    floor_margin = float("nan")
    if f is not None:
        floor_ok, floor_reason = standards.judge(name, f, out_dtype, spec)
        floor_margin = standards.margin(name, f, out_dtype, spec)
        if not floor_ok:
            warning = (f"{name} cannot be met even by the correctly rounded golden "
                       f"({floor_reason})")
    return Verdict("PASS" if ok else "FAIL", name, reason, warning, dt.name_of(out_dtype),
                   m, f, standards.margin(name, m, out_dtype, spec), floor_margin, spec)
