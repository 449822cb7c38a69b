"""Dtype names used in case files, and the per-dtype constants the standards need.

Case files speak short names (``bf16``); torch speaks ``torch.bfloat16``. One table
maps both ways so every module agrees on spelling.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_BY_NAME: dict[str, torch.dtype] = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_ALIASES = {
    "float64": "fp64", "double": "fp64",
    "float32": "fp32", "float": "fp32",
    "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
}
_NAME_OF = {v: k for k, v in _BY_NAME.items()}

DTYPE_NAMES = tuple(_BY_NAME) + tuple(_ALIASES)


def canonical_name(name: str) -> str:
    """'float16' -> 'fp16'; raises KeyError for an unknown name."""
    name = _ALIASES.get(name, name)
    if name not in _BY_NAME:
        raise KeyError(name)
    return name


def to_torch(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    return _BY_NAME[canonical_name(name)]


def name_of(dtype: torch.dtype | str) -> str:
    if isinstance(dtype, str):
        return canonical_name(dtype)
    return _NAME_OF[dtype]


@dataclass(frozen=True)
class FloatTraits:
    """Constants from standards.md, per output dtype."""

    mantissa_bits: int        # ULP definition (msprobe)
    min_exp: int              # ULP definition (msprobe)
    cann_v1_threshold: float  # CANN v1: MERE < T, MARE < 10 T
    v2_rtol: float            # CANN v2 mixed tolerance
    v2_atol: float
    v2_max_abs: float         # CANN v2 limit (or 32 ULP)
    small_value: float        # msprobe small-value domain
    small_value_atol: float
    msprobe_eps: float        # msprobe relative error denominator eps
    abs_threshold_rtol: float # msprobe absolute-threshold standard
    torch_rtol: float         # torch.testing.assert_close defaults
    torch_atol: float


FLOAT_TRAITS: dict[torch.dtype, FloatTraits] = {
    torch.float16: FloatTraits(10, -14, 2**-10, 2**-9, 2**-9, 1e-1,
                               2**-10, 2**-16, 2**-11, 2**-10, 1e-3, 1e-5),
    torch.bfloat16: FloatTraits(7, -126, 2**-7, 2**-6, 2**-6, 1.0,
                                2**-10, 1e-16, 2**-8, 2**-8, 1.6e-2, 1e-5),
    torch.float32: FloatTraits(23, -126, 2**-13, 2**-10, 2**-16, 1e-2,
                               2**-20, 2**-30, 2**-24, 2**-20, 1.3e-6, 1e-5),
    # float64 outputs (rare: a kernel computing in double) get float64 ULPs and
    # torch.testing's float64 defaults; the CANN tables have no float64 row, so the
    # float32 thresholds are used as the closest published numbers.
    torch.float64: FloatTraits(52, -1022, 2**-13, 2**-10, 2**-16, 1e-2,
                               2**-20, 2**-30, 2**-53, 2**-20, 1e-7, 1e-7),
}


def traits(dtype: torch.dtype) -> FloatTraits:
    try:
        return FLOAT_TRAITS[dtype]
    except KeyError:
        raise KeyError(f"no precision constants for dtype {dtype}") from None


# (significand bits with the implicit one, smallest normal exponent, largest finite value)
_ROUNDING = {
    torch.float16: (11, -14, 65504.0),
    torch.bfloat16: (8, -126, float(torch.finfo(torch.bfloat16).max)),
}


def rounding_params(dtype: torch.dtype) -> tuple[int, int, float] | None:
    """(significand bits with the implicit one, smallest normal exponent, largest finite)
    of fp16, bf16 and fp32, for rounding float64 values into them; None for others."""
    if dtype == torch.float32:
        return 24, -126, float(np.finfo(np.float32).max)
    return _ROUNDING.get(dtype)


def round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 values rounded once, to nearest with ties to even, into ``dtype``:
    subnormals, ties and overflow to inf as IEEE 754 says. torch converts float64 to
    fp16 / bf16 through float32, which rounds twice and lands one ulp off now and then;
    the error floor must be the correctly rounded golden."""
    if dtype not in _ROUNDING or not x.dtype.is_floating_point:
        return x.to(dtype)  # float32 / float64 targets: torch rounds once already
    bits, emin, vmax = _ROUNDING[dtype]
    v = x.detach().to("cpu", torch.float64).contiguous().numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        _, e = np.frexp(v)  # v = m * 2^e with 0.5 <= |m| < 1: the leading bit is 2^(e-1)
        quantum = np.ldexp(1.0, np.maximum(e - 1, emin) - (bits - 1))
        r = np.round(v / quantum) * quantum  # np.round: ties to even; scaling is exact
        r = np.where(np.abs(r) > vmax, np.copysign(np.inf, v), r)
        r = np.where(np.isnan(v), v, r)
    return torch.from_numpy(r).to(dtype)  # exactly representable now: no second rounding
