"""Where goldens come from during a run: computed once per case per process.

A golden trajectory (one tuple of float64 outputs per step) is keyed by the case's golden
key, so several kernels and backends of one case share one computation.
"""
from __future__ import annotations

import time

import torch

from . import inputs as inp
from .cases import Case
from .registry import OpSpec


def golden_trajectory(spec: OpSpec, case: Case,
                      first_inputs: dict | None = None) -> list[tuple[torch.Tensor, ...]]:
    """float64 outputs of every step; each step's outputs feed the next step's inputs.

    ``first_inputs``: the case's inputs if the caller already made them (saves a copy).
    """
    first = first_inputs if first_inputs is not None else inp.make_inputs(case)
    current = {k: v.to(torch.float64) for k, v in first.items()}
    params = dict(case.params)
    out_steps = []
    for step in range(case.steps):
        if step:
            fresh = inp.make_inputs(case, step, [i.name for i in spec.inputs if i.per_step])
            current.update({k: v.to(torch.float64) for k, v in fresh.items()})
            if spec.step_param:
                params[spec.step_param] = case.params[spec.step_param] + step
        outs = spec.golden_fn(**current, **params)
        outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        out_steps.append(outs)
        for in_name, out_name in spec.feedback.items():
            current[in_name] = outs[spec.output_names.index(out_name)]
    return out_steps


class GoldenCache:
    """Per-process cache: golden key -> (trajectory, seconds it took)."""

    def __init__(self, max_items: int = 64):
        self._items: dict[str, list] = {}
        self._max = max_items

    def get(self, spec: OpSpec, case: Case, first_inputs: dict | None = None
            ) -> tuple[list, str, float]:
        key = case.golden_key(spec.golden_version)
        if key in self._items:
            return self._items[key], "memory", 0.0
        t0 = time.perf_counter()
        traj = golden_trajectory(spec, case, first_inputs)
        seconds = time.perf_counter() - t0
        big = sum(t.numel() for step in traj for t in step) > (1 << 24)
        if not big:
            if len(self._items) >= self._max:
                self._items.pop(next(iter(self._items)))
            self._items[key] = traj
        return traj, "computed", seconds
