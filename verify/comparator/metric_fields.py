"""The record of one output's metrics, apart from the code that computes them: the
report and ``verify report`` read these fields without importing torch or numba."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class Metrics:
    """Metrics of one output against its golden; every field is a plain number."""

    n: int
    nan_inf_mismatch: int
    mere: float
    mare: float
    max_abs: float
    max_rel: float
    rmse: float
    cosine: float
    eb: float
    eb_mean: float
    mag_bias: float  # (#|a|<|g| - #|a|>|g|) / inexact: ~0 rounding to nearest, ~1 truncating
    ulp_max: float
    ulp_mean: float
    ulp_gt1_ratio: float
    ulp_gt32_ratio: float
    small_count: int
    small_err_ratio: float
    rel_err_ratio: float
    hundredth: float
    thousandth: float
    ten_thousandth: float
    v2_match_ratio: float
    allclose_mismatch: int
    tol_ratio: float  # max of d / (atol + rtol|g|): allclose passes when <= 1
    atol: float
    rtol: float
    argmax_abs: int
    argmax_rel: int

    def as_dict(self, prefix: str = "") -> dict:
        return {prefix + k: v for k, v in asdict(self).items()}

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
