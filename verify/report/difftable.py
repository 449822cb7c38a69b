"""The worst elements of a failing output: index, inputs there, golden, actual, diffs.

Ranking follows the deciding standard: for atol / rtol standards the ratio of the error
to its allowance, otherwise the CANN relative error; NaN / Inf misplacements come first.
"""
from __future__ import annotations

import math

import torch

CHUNK = 1 << 22


def _score(a: torch.Tensor, g: torch.Tensor, atol: float | None, rtol: float | None):
    d = (a - g).abs()
    if atol is not None and rtol is not None:
        score = d / (atol + rtol * g.abs()).clamp_min(1e-300)
    else:
        score = d / (g.abs() + 1e-7)
    bad_special = (a.isnan() != g.isnan()) | (a.isinf() & (a != g)) | (g.isinf() & (a != g))
    score = torch.where(bad_special, torch.full_like(score, math.inf), score)
    return torch.nan_to_num(score, nan=0.0)


def worst_elements(actual: torch.Tensor, golden: torch.Tensor, inputs: dict[str, torch.Tensor],
                   k: int = 10, atol: float | None = None, rtol: float | None = None) -> list[dict]:
    a = actual.detach().cpu().reshape(-1)
    g = golden.detach().cpu().to(torch.float64).reshape(-1)
    n = a.numel()
    if n == 0:
        return []
    best_s = torch.empty(0, dtype=torch.float64)
    best_i = torch.empty(0, dtype=torch.long)
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        s = _score(a[start:stop].to(torch.float64), g[start:stop], atol, rtol)
        top = torch.topk(s, min(k, s.numel()))
        best_s = torch.cat([best_s, top.values])
        best_i = torch.cat([best_i, top.indices + start])
        keep = torch.topk(best_s, min(k, best_s.numel()))
        best_s, best_i = keep.values, best_i[keep.indices]
    shape = tuple(actual.shape)
    rows = []
    for flat in best_i.tolist():
        av, gv = float(a[flat]), float(g[flat])
        d = abs(av - gv) if math.isfinite(av) and math.isfinite(gv) else math.nan
        row = {"index": list(_unravel(flat, shape))}
        row["inputs"] = {name: _value_at(t, flat, shape) for name, t in inputs.items()}
        row.update(golden=gv, actual=av, abs_diff=d,
                   rel_diff=d / abs(gv) if gv not in (0.0,) and math.isfinite(d) else math.nan)
        rows.append(row)
    return rows


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


def _value_at(t: torch.Tensor, flat: int, shape) -> float | None:
    """The input's value at the output's index: same-shaped inputs and scalars only."""
    if t.numel() == 1:
        return float(t.reshape(-1)[0])
    if tuple(t.shape) == tuple(shape):
        return float(t.reshape(-1)[flat])
    return None
