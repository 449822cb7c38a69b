"""Chunked and fused evaluation of float64 goldens.

A [7168, 24576] AdamW golden is 176M elements per tensor: the plain formula makes a
float64 temporary of that size for every intermediate. Evaluating the formula over
slices of the flattened tensors keeps the temporaries to one slice each, so the peak
stays close to the float64 inputs plus outputs.

Each temporary is still a trip through memory, which left large element-wise goldens ~4x
from one read of the inputs and one write of the outputs. A formula written for
``elementwise(fn, ..., params=...)`` with ``sqrt`` / ``sign`` from here runs two ways: on
torch slices (small tensors: nothing to compile) and, from FUSED_MIN_ELEMENTS on, compiled
per element by numba, every output written in the same loop. Both evaluate the same IEEE
operations in the same order (no fast-math, no fused multiply-add), so they agree to the
last bit.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from numba import njit, prange
from numba.extending import overload

from verify.comparator import metrics  # noqa: F401  (sets numba's cache folder before anything compiles)

CHUNK_ELEMENTS = 1 << 20
FUSED_MIN_ELEMENTS = 1 << 22  # below this the torch path wins: no compile, little data


def sqrt(x):
    """Correctly rounded square root of a float64 tensor or, inside a compiled formula, of
    a float. torch's float64 sqrt on CPU is SLEEF's (within 0.5001 ulp: 78 of 5,000 random
    values one ulp off here); NumPy's and the compiled one are IEEE's, so both paths agree."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.float64 and x.device.type == "cpu":
            with np.errstate(invalid="ignore"):  # sqrt(-1) is NaN, as torch gives it
                return torch.from_numpy(np.sqrt(x.contiguous().numpy()))
        return torch.sqrt(x)
    return math.sqrt(x)


def sign(x):
    """torch.sign: -1, 0 or 1, and 0 for NaN and -0."""
    if isinstance(x, torch.Tensor):
        return torch.sign(x)
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


@overload(sqrt, inline="always")
def _sqrt_compiled(x):
    return lambda x: math.sqrt(x)


@overload(sign, inline="always")
def _sign_compiled(x):
    return lambda x: 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


def elementwise(fn: Callable[..., tuple], *tensors: torch.Tensor, n_out: int,
                params: tuple | None = None) -> tuple:
    """Apply ``fn`` (element-wise, returns ``n_out`` values) to the tensors: ``fn(*slices)``
    slice by slice, or with ``params`` (a tuple of floats) ``fn(*values, params)``, then
    compiled and fused for large tensors."""
    shape = tensors[0].shape
    flat = [t.contiguous().view(-1) for t in tensors]
    outs = tuple(torch.empty(shape, dtype=torch.float64) for _ in range(n_out))
    out_flat = [o.view(-1) for o in outs]
    total = flat[0].numel() if flat else 0
    if params is not None and total >= FUSED_MIN_ELEMENTS and (len(flat), n_out) in _DRIVERS:
        _fused(fn, flat, out_flat, tuple(float(p) for p in params))
        return outs
    for start in range(0, total, CHUNK_ELEMENTS):
        stop = min(start + CHUNK_ELEMENTS, total)
        slices = [f[start:stop] for f in flat]
        results = fn(*slices) if params is None else fn(*slices, params)
        if isinstance(results, torch.Tensor):
            results = (results,)
        for dst, src in zip(out_flat, results):
            dst[start:stop] = src
    return outs


_COMPILED: dict = {}


def _fused(fn, flat, out_flat, params: tuple) -> None:
    key = (fn, len(flat), len(out_flat))
    drive = _COMPILED.get(key)
    if drive is None:  # once per process and formula (~1 s, paid only at these sizes)
        drive = _COMPILED[key] = _DRIVERS[(len(flat), len(out_flat))](
            njit(error_model="numpy", inline="always")(fn))
    drive(*(t.numpy() for t in flat), *(o.numpy() for o in out_flat), params)


# One driver per arity, made around the compiled formula: a formula passed as an argument
# is called through a pointer and nothing vectorises (5x slower); a formula the driver
# closes over is inlined into its loop.
def _drive_2_1(kernel):
    @njit(parallel=True, error_model="numpy")
    def drive(a, b, o1, p):
        for i in prange(a.shape[0]):
            o1[i] = kernel(a[i], b[i], p)
    return drive


def _drive_3_2(kernel):
    @njit(parallel=True, error_model="numpy")
    def drive(a, b, c, o1, o2, p):
        for i in prange(a.shape[0]):
            o1[i], o2[i] = kernel(a[i], b[i], c[i], p)
    return drive


def _drive_4_3(kernel):
    @njit(parallel=True, error_model="numpy")
    def drive(a, b, c, d, o1, o2, o3, p):
        for i in prange(a.shape[0]):
            o1[i], o2[i], o3[i] = kernel(a[i], b[i], c[i], d[i], p)
    return drive


_DRIVERS = {(2, 1): _drive_2_1, (3, 2): _drive_3_2, (4, 3): _drive_4_3}


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
