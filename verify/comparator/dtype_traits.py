"""Precision constants per float dtype name (reference/standards.md), without torch: the
report reads them to draw a standard's thresholds."""
from __future__ import annotations

from dataclasses import dataclass


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


# other spellings of the canonical dtype names
NAME_ALIASES = {
    "float64": "fp64", "double": "fp64",
    "float32": "fp32", "float": "fp32",
    "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
}

TRAITS_BY_NAME: dict[str, FloatTraits] = {
    "fp16": FloatTraits(10, -14, 2**-10, 2**-9, 2**-9, 1e-1,
                        2**-10, 2**-16, 2**-11, 2**-10, 1e-3, 1e-5),
    "bf16": FloatTraits(7, -126, 2**-7, 2**-6, 2**-6, 1.0,
                        2**-10, 1e-16, 2**-8, 2**-8, 1.6e-2, 1e-5),
    "fp32": FloatTraits(23, -126, 2**-13, 2**-10, 2**-16, 1e-2,
                        2**-20, 2**-30, 2**-24, 2**-20, 1.3e-6, 1e-5),
    # float64 outputs (rare: a kernel computing in double) get float64 ULPs and
    # torch.testing's float64 defaults; the CANN tables have no float64 row, so the
    # float32 thresholds are used as the closest published numbers.
    "fp64": FloatTraits(52, -1022, 2**-13, 2**-10, 2**-16, 1e-2,
                        2**-20, 2**-30, 2**-53, 2**-20, 1e-7, 1e-7),
}
