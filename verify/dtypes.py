"""Dtype names used in case files, and the per-dtype constants the standards need.

Case files speak short names (``bf16``); torch speaks ``torch.bfloat16``. One table
maps both ways so every module agrees on spelling.
"""
from __future__ import annotations

import numpy as np
import torch

from .dtype_traits import NAME_ALIASES, TRAITS_BY_NAME, FloatTraits  # noqa: F401

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
_NAME_OF = {v: k for k, v in _BY_NAME.items()}

DTYPE_NAMES = tuple(_BY_NAME) + tuple(NAME_ALIASES)


def canonical_name(name: str) -> str:
    """'float16' -> 'fp16'; raises KeyError for an unknown name."""
    name = NAME_ALIASES.get(name, name)
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


def rounding_params(dtype: torch.dtype) -> tuple[int, int, float]:
    """(significand bits with the implicit one, smallest normal exponent, largest finite)
    of a float dtype, from its precision constants: what rounding float64 into it needs."""
    t = traits(dtype)
    return t.mantissa_bits + 1, t.min_exp, float(torch.finfo(dtype).max)


def round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 values rounded once, to nearest with ties to even, into ``dtype``:
    subnormals, ties and overflow to inf as IEEE 754 says. torch converts float64 to
    fp16 / bf16 through float32, which rounds twice and lands one ulp off now and then;
    the error floor must be the correctly rounded golden. The rounding is the metrics
    pass's own (metrics._round_range), so a rounded tensor and the pass agree."""
    if dtype in (torch.float32, torch.float64) or dtype not in FLOAT_TRAITS \
            or not x.dtype.is_floating_point:
        return x.to(dtype)  # float32 / float64 targets: torch rounds once already
    from .metrics import _round_range, _rounding_of
    v = x.detach().to("cpu", torch.float64).contiguous().reshape(-1).numpy()
    r = np.empty_like(v)
    _round_range(v, v.view(np.int64), 0, v.shape[0], _rounding_of(dtype), r)
    return torch.from_numpy(r).reshape(x.shape).to(dtype)  # exact now: no second rounding
