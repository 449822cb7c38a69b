"""Chunked evaluation of float64 goldens.

A [7168, 24576] AdamW golden is 176M elements per tensor: the plain formula makes a
float64 temporary of that size for every intermediate. Evaluating the formula over
slices of the flattened tensors keeps the temporaries to one slice each, so the peak
stays close to the float64 inputs plus outputs.
"""
from __future__ import annotations

from typing import Callable

import torch

CHUNK_ELEMENTS = 1 << 20


def elementwise(fn: Callable[..., tuple], *tensors: torch.Tensor, n_out: int) -> tuple:
    """Apply ``fn`` (element-wise, returns ``n_out`` tensors) slice by slice."""
    shape = tensors[0].shape
    flat = [t.contiguous().view(-1) for t in tensors]
    outs = tuple(torch.empty(shape, dtype=torch.float64) for _ in range(n_out))
    out_flat = [o.view(-1) for o in outs]
    total = flat[0].numel() if flat else 0
    for start in range(0, total, CHUNK_ELEMENTS):
        stop = min(start + CHUNK_ELEMENTS, total)
        results = fn(*(f[start:stop] for f in flat))
        if isinstance(results, torch.Tensor):
            results = (results,)
        for dst, src in zip(out_flat, results):
            dst[start:stop] = src
    return outs


def row_chunks(rows: int, cols: int):
    """Row ranges of about CHUNK_ELEMENTS elements each, for row-wise reductions."""
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for start in range(0, rows, step):
        yield start, min(start + step, rows)


def squared_norm(fn: Callable[[int, int], torch.Tensor], rows: int, cols: int) -> float:
    """Sum of squares of ``fn(r0, r1)`` over row chunks, accumulated in float64."""
    total = 0.0
    for r0, r1 in row_chunks(rows, cols):
        part = fn(r0, r1)
        total += float(torch.dot(part.reshape(-1), part.reshape(-1)))
    return total
