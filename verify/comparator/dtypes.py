"""Dtype names used in case files, and the per-dtype constants the standards need.

Case files speak short names (``bf16``); torch speaks ``torch.bfloat16``. One table
maps both ways so every module agrees on spelling.
"""
from __future__ import annotations

import numpy as np
import torch

from verify.comparator.dtype_traits import NAME_ALIASES, TRAITS_BY_NAME, FloatTraits  # noqa: F401

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
