"""Dtype names used in case files, and the per-dtype constants the standards need.

Case files speak short names (``bf16``); torch speaks ``torch.bfloat16``. One table
maps both ways so every module agrees on spelling.
"""
from __future__ import annotations


import numpy as np
import torch

from .dtype_traits import TRAITS_BY_NAME, FloatTraits  # noqa: F401  (re-exported)

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


FLOAT_TRAITS: dict[torch.dtype, FloatTraits] = {
    _BY_NAME[name]: t for name, t in TRAITS_BY_NAME.items()}


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
