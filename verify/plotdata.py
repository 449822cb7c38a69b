"""Compact plot data for an output, computed at run time and kept in results.json, so a
report can be rebuilt (``verify report``) without the tensors.

- histogram: counts of log10 of the CANN relative error d / (|g| + 1e-7), for the kernel
  and for the error floor (the golden rounded to the output dtype), on fixed bins;
- heat map: for outputs of 2 or more dims (leading dims flattened), the largest error in
  each cell of a grid of at most GRID x GRID cells: where in the tensor the error sits.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit, prange

from . import dtypes as dt
from . import metrics  # noqa: F401  (sets numba's cache folder before anything compiles)

BIN_LO, BIN_HI, BINS_PER_DECADE = -12, 3, 4
EDGES = [BIN_LO + i / BINS_PER_DECADE for i in range((BIN_HI - BIN_LO) * BINS_PER_DECADE + 1)]
GRID = 32
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



N_BINS = len(EDGES) - 1
HIST_BLOCK = 1 << 16


@njit(cache=True, parallel=True, nogil=True)
def _hist_blocks(a, g, out):
    """Per block of HIST_BLOCK elements: counts per bin of log10(d / (|g| + 1e-7)), then
    zero (exact, or the same NaN / Inf), under and over (misplaced NaN / Inf count as
    over). One pass, compiled: the report's histogram costs a fraction of the metrics."""
    n = a.shape[0]
    n_blocks = out.shape[0]
    for b in prange(n_blocks):
        lo = b * HIST_BLOCK
        hi = min(n, lo + HIST_BLOCK)
        for i in range(lo, hi):
            av = a[i]
            gv = g[i]
            a_nan = av != av
            g_nan = gv != gv
            if a_nan or g_nan:
                out[b, N_BINS + (0 if a_nan and g_nan else 2)] += 1
                continue
            if np.isinf(av) or np.isinf(gv):
                out[b, N_BINS + (0 if av == gv else 2)] += 1
                continue
            rel = abs(av - gv) / (abs(gv) + 1e-7)
            if rel == 0.0:
                out[b, N_BINS] += 1
                continue
            lg = np.log10(rel)
            if lg < BIN_LO:
                out[b, N_BINS + 1] += 1
            elif lg >= BIN_HI:
                out[b, N_BINS + 2] += 1
            else:
                out[b, int(np.floor((lg - BIN_LO) * BINS_PER_DECADE))] += 1


def _counts(a: np.ndarray, g: np.ndarray) -> dict:
    out = np.zeros((max(1, -(-a.shape[0] // HIST_BLOCK)), N_BINS + 3), dtype=np.int64)
    if a.shape[0]:
        _hist_blocks(a, g, out)
    total = out.sum(axis=0)
    return {"counts": total[:N_BINS].tolist(), "zero": int(total[N_BINS]),
            "under": int(total[N_BINS + 1]), "over": int(total[N_BINS + 2])}


def histogram(actual: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype) -> dict:
    """Counts per bin of log10(rel error) on EDGES, for the kernel and for the error
    floor; 'zero' counts exact elements, 'under' / 'over' those below / above the bins
    (misplaced NaN / Inf count as over)."""
    a = actual.detach().cpu().reshape(-1)
    g = golden.detach().cpu().to(torch.float64).reshape(-1)
    g_np = g.contiguous().numpy()
    out = {"actual": _counts(a.to(torch.float64).contiguous().numpy(), g_np)}
    out["floor"] = _counts(dt.round_once(g, dtype).to(torch.float64).contiguous().numpy(), g_np)
    return out


def heatmap(actual: torch.Tensor, golden: torch.Tensor, atol: float | None = None,
            rtol: float | None = None) -> dict | None:
    """Max error per cell: d / (atol + rtol|g|) under allclose, else the CANN relative
    error. None for outputs of fewer than 2 dims."""
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
    return {"rows": rows, "cols": cols, "grid": [[float(f"{v:.3g}") for v in row]
                                                   for row in grid.tolist()],
            "measure": "d/(atol+rtol|g|)" if atol is not None else "d/(|g|+1e-7)"}
