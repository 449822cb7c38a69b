"""Both floors' figures, computed once per golden and kept with it.

The output floor (the golden rounded once to the output dtype) and the compute-precision
floor's verdict (the golden evaluated in the op's compute dtype, judged under the
standard) depend on the golden, the output dtype and the standard's params only, never on
the kernel. A case's figures are one store entry beside its golden (derived kind
``floors``): the first kernel of a case computes them, every other kernel, worker and
later run reads them, so a warm run reads neither the rounded golden nor the
compute-precision trajectory, and compares only the kernel's output with the golden.
"""
from __future__ import annotations

import hashlib
import json
import math

import torch

from verify.comparator import dtypes as dt
from verify.comparator.comparison import KnownFloor, Verdict, compare, output_floor
from verify.comparator.metric_fields import Metrics

# bump when what the figures hold, or how they are computed, changes
EVALUATION = "1"
KIND = "floors"


def store_key(golden_key: str) -> str:
    """The store key of a case's floor figures: derived from its golden's key."""
    return hashlib.sha256(f"{golden_key}|{KIND}|{EVALUATION}".encode()).hexdigest()


def _std_text(std: dict) -> str:
    return json.dumps(std, sort_keys=True, default=str)


def _jsonable(x):
    """Floats as JSON keeps them: NaN and infinities as strings (the index is JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    return x


def _float(x):
    return float(x) if isinstance(x, str) and x in ("nan", "inf", "-inf") else x


def _metrics(d: dict) -> Metrics:
    return Metrics(**{k: _float(v) for k, v in d.items()})


def _output_figures(known: KnownFloor | None) -> dict | None:
    """An output floor as kept (JSON: the metrics and the histogram)."""
    if known is None:
        return None
    return _jsonable({"metrics": known.metrics.as_dict(), "histogram": known.histogram})


class FloorBook:
    """One case's floor figures: read from the store entry beside its golden, computed
    where missing, written back once (``save``) when anything new was computed."""

    def __init__(self, resolver, spec, case, first_inputs):
        self.resolver, self.spec, self.case, self.inputs = resolver, spec, case, first_inputs
        self.base = case.golden_key(spec.golden_version)
        self.key = store_key(self.base)
        self._figures: dict | None = None
        self._new = self._check = False
        self.source = ""  # where the figures came from: local, registry, computed (any new)

    def _book(self) -> dict:
        if self._figures is None:
            self._figures = dict(self.resolver.figures(self.key, self.spec, self.inputs) or {})
            # figures another machine pushed to the registry: a share is recomputed here
            fetched = self.key in self.resolver.fetched_figures
            self._check = fetched and self.resolver.check_figures(self.key)
            self.source = "registry" if fetched else "local" if self._figures else ""
        return self._figures

    def _kept(self, sub: str, fresh) -> dict | None:
        """The kept figures of ``sub``; when they came from the registry and are checked
        here, ``fresh()`` (this machine's, as kept) must give the same, else the registry's
        entry is disputed and this machine's figures serve."""
        kept = self._book().get(sub)
        if kept is None or not self._check:
            return kept
        mine = fresh()
        if mine != kept:
            differ = sorted(k for k in set(mine) | set(kept) if mine.get(k) != kept.get(k))
            self.resolver.dispute_figures(self.key, f"{sub}: {', '.join(differ)} differ")
            self._figures = {sub: mine}
            self._check, self._new, self.source = False, True, "computed"
            return mine
        return kept

    def output_floor(self, out_name: str, step: int, golden: torch.Tensor, out_dtype,
                     std: dict) -> KnownFloor | None:
        """The output floor of one output and step (as compare's own, bit for bit)."""
        sub = f"out|{out_name}|{step}|{dt.name_of(out_dtype)}|{_std_text(std)}"
        kept = self._kept(sub, lambda: _output_figures(output_floor(golden, out_dtype, std)))
        if kept is not None:
            return KnownFloor(_metrics(kept["metrics"]), kept.get("histogram"))
        known = output_floor(golden, out_dtype, std)
        if known is not None:
            self._book()[sub] = _output_figures(known)
            self._new, self.source = True, "computed"
        return known

    def compute_floor(self, out_name: str, step: int, floor_tensor, golden: torch.Tensor,
                      out_dtype, std: dict) -> Verdict | None:
        """The compute-precision floor's verdict under the standard (its metrics, margin
        and reason: what the row needs); ``floor_tensor()`` gives the floor's output,
        asked for only when the figures are not known yet."""
        sub = f"cfloor|{out_name}|{step}|{dt.name_of(out_dtype)}|{_std_text(std)}"

        def fresh() -> dict:
            f = floor_tensor()
            if f is None:
                return {"none": True}
            v = compare(f, golden, dtype=out_dtype, standard=std, floor=False, plots=False)
            return _jsonable({"verdict": v.verdict, "standard": v.standard,
                              "reason": v.reason, "dtype": v.dtype,
                              "metrics": v.metrics.as_dict(), "margin": v.margin})

        kept = self._kept(sub, fresh)
        if kept is None:
            kept = self._book()[sub] = fresh()
            self._new, self.source = True, "computed"
        if kept.get("none"):
            return None
        return Verdict(kept["verdict"], kept["standard"], kept["reason"], "",
                       kept["dtype"], _metrics(kept["metrics"]), None,
                       float(_float(kept["margin"])))

    def size(self) -> int:
        """How many figures the book holds (output floors and compute floors)."""
        return len(self._book())

    def save(self) -> None:
        """Keep what was computed beside the golden (once per case: one small entry)."""
        if self._new:
            self.resolver.keep_figures(self.key, self.base, KIND, self.spec, self.case,
                                       self.inputs, self._book())
            self._new = False
