"""Compact plot data for an output, computed at run time and kept in results.json, so a
report can be rebuilt (``verify report``) without the tensors.

- histogram: counts of log10 of the CANN relative error d / (|g| + 1e-7), for the kernel
  and for the error floor (the golden rounded to the output dtype), on fixed bins;
- heat map: for outputs of 2 or more dims (leading dims flattened), the largest error in
  each cell of a grid of at most GRID x GRID cells: where in the tensor the error sits.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from verify.comparator.histbins import BIN_HI, BIN_LO, BINS_PER_DECADE, EDGES  # noqa: F401  (re-exported)
from verify.comparator.histbins import HEAT_GRID as GRID
from verify.comparator import metrics
from verify.comparator.metrics import three_digits

CHUNK = 1 << 22


def _error(a: torch.Tensor, g: torch.Tensor, atol=None, rtol=None) -> torch.Tensor:
    """d / (|g| + 1e-7), or d / (atol + rtol|g|); misplaced NaN / Inf are inf, the same
    NaN or Inf in the same place is no error."""
    a64 = a.to(torch.float64)
    if atol is not None and rtol is not None:
        denom = (atol + rtol * g.abs()).clamp_min(1e-300)
    else:
        denom = g.abs() + 1e-7
    err = (a64 - g).abs() / denom
    bad = (a64.isnan() != g.isnan()) | ((a64.isinf() | g.isinf()) & (a64 != g))
    err = torch.where(bad, torch.full_like(err, math.inf), err)
    return torch.nan_to_num(err, nan=0.0)


def histogram(actual: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype) -> dict:
    """Counts per bin of log10(rel error) on EDGES, for the kernel and for the error
    floor; 'zero' counts exact elements, 'under' / 'over' those below / above the bins
    (misplaced NaN / Inf count as over). ``verify.compare`` gives the same counts with
    its metrics (one pass); this is for a histogram alone."""
    return metrics.measure_all(actual, golden, dtype, floor=True, hist=True).histogram


def heatmap(actual: torch.Tensor, golden: torch.Tensor, atol: float | None = None,
            rtol: float | None = None) -> dict | None:
    """Max error per cell: d / (atol + rtol|g|) under allclose, else the CANN relative
    error. None for outputs of fewer than 2 dims. ``verify.compare`` gives the same grid
    from its metrics pass; this is the heat map alone, in torch."""
    if actual.dim() < 2 or actual.numel() == 0:
        return None
    cols = actual.shape[-1]
    a = actual.detach().cpu().reshape(-1, cols)
    g = golden.detach().cpu().to(torch.float64).reshape(-1, cols)
    rows = a.shape[0]
    gr, gc = min(rows, GRID), min(cols, GRID)
    grid = torch.zeros(gr, gc, dtype=torch.float64)
    step = max(1, CHUNK // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        err = _error(a[r0:r1], g[r0:r1], atol, rtol).clamp_max(1e300)
        pooled = F.adaptive_max_pool1d(err.unsqueeze(0), gc).squeeze(0)  # rows x gc
        bins = (torch.arange(r0, r1) * gr // rows).unsqueeze(1).expand(-1, gc)
        grid.scatter_reduce_(0, bins, pooled, reduce="amax")
    return {"rows": rows, "cols": cols, "grid": three_digits(grid.numpy()),
            "measure": "d/(atol+rtol|g|)" if atol is not None else "d/(|g|+1e-7)"}
