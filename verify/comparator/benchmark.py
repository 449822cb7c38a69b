"""msprobe's benchmark standard: a kernel judged by its errors relative to a benchmark
kernel's errors (the same op on another device or implementation, the same inputs, the
same golden).

Follows msprobe 26.2 (mindstudio-probe), api_accuracy_checker:
- metrics, per output, against the golden (``BenchmarkCompare._compute_metrics`` with the
  helpers of ``compare/algorithm.py``): small-value error ratio (``get_small_value_err_ratio``),
  RMSE without small and non-finite values, rescaled (``get_rmse``), max and mean relative
  error over the normal values (``get_max_rel_err``, ``get_mean_rel_err``, relative to
  |golden| + eps with eps = finfo(golden).eps, 2^-8 for bf16: ``get_abs_bench_with_eps``),
  and error balance against the golden cast to the output dtype (``get_error_balance``);
- ratios kernel / benchmark with a floor under the benchmark's figure (``calc_ratio``,
  ``StandardConfig._minmum_err``: 2^-11 fp16, 2^-8 bf16, 2^-14 fp32);
- verdict (``BenchmarkPrecisionCompare._get_status``): FAIL when a ratio is over its
  threshold (L0: max rel 10, mean rel 2, RMSE 2; small value 2); EB's ratio is recorded but,
  as in msprobe, does not decide.
"""
from __future__ import annotations

import math

import numpy as np
import torch

SMALL_VALUE = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -10, torch.float32: 2 ** -20}
SMALL_VALUE_ATOL = {torch.float16: 1e-16, torch.bfloat16: 1e-16, torch.float32: 2 ** -30}
MINIMUM_ERR = {torch.float16: 2 ** -11, torch.bfloat16: 2 ** -8, torch.float32: 2 ** -14}
BF16_EPS = 2 ** -8
THRESHOLDS = {  # msprobe's L0 api level (get_benchmark_ratio_threshold) and error thresholds
    "small_value_err_ratio": 2.0, "rmse": 2.0, "max_rel_err": 10.0, "mean_rel_err": 2.0,
    "eb": 2.0,
}
DECIDING = ("small_value_err_ratio", "rmse", "max_rel_err", "mean_rel_err")
METRICS = ("small_value_err_ratio", "rmse", "max_rel_err", "mean_rel_err", "eb")


def _device_array(actual: torch.Tensor) -> np.ndarray:
    """The output as msprobe holds it: numpy has no bfloat16, so bf16 goes to float32."""
    a = actual.detach().cpu().reshape(-1)
    if a.dtype == torch.bfloat16:
        a = a.float()
    return a.numpy()


def metrics(actual: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype | None = None) -> dict:
    """msprobe's benchmark metrics of one output against the float64 golden."""
    dtype = dtype or actual.dtype
    dev = _device_array(actual)
    bench = golden.detach().cpu().to(torch.float64).reshape(-1).numpy()
    n = bench.size
    with np.errstate(all="ignore"):
        eps = BF16_EPS if dtype == torch.bfloat16 else np.finfo(bench.dtype).eps
        abs_bench = np.abs(bench)
        both_finite = np.isfinite(dev) & np.isfinite(bench.astype(dev.dtype))
        inf_nan = ~both_finite
        abs_err = np.abs(dev - bench)
        small = (abs_bench <= SMALL_VALUE.get(dtype, 2 ** -20)) & both_finite
        small_bad = small & (abs_err > SMALL_VALUE_ATOL.get(dtype, 2 ** -30))
        n_small = int(small.sum())
        rel = np.where(small | inf_nan, -1.0, abs_err / (abs_bench + eps))
        masked = np.where(inf_nan | small, 0.0, abs_err)
        mse = float(np.mean(np.square(masked))) if n else 0.0
        mse = mse * (n / (n - int((inf_nan | small).sum()) + 0.0001) + 0.0001)
        cast = bench.astype(dev.dtype)
        larger = int(np.sum(dev - cast > 0))
        smaller = int(np.sum(dev - cast < 0))
    good = rel[rel >= 0]
    return {
        "small_value_err_ratio": 0.0 if n_small == 0 else int(small_bad.sum()) / n_small,
        "rmse": math.sqrt(mse),
        "max_rel_err": float(rel.max()) if n and rel.max() >= 0 else 0.0,
        "mean_rel_err": float(good.mean()) if good.size else 0.0,
        "eb": abs(larger - smaller) / n if n else 0.0,
    }


def ratio(x: float, y: float, dtype: torch.dtype) -> float:
    """|x| / max(|y|, msprobe's minimum error for the dtype). Non-finite figures: NaN (no
    verdict from this metric) when both are the same inf or both NaN, else inf (msprobe's
    inf / NaN consistency check fails the metric)."""
    if not (math.isfinite(x) and math.isfinite(y)):
        return math.nan if (math.isnan(x) and math.isnan(y)) or x == y else math.inf
    return abs(x) / max(abs(y), MINIMUM_ERR.get(dtype, 2 ** -14))


def judge(kernel: dict, bench: dict, dtype: torch.dtype) -> tuple[bool, str, dict]:
    """(passed, reason, ratios) of a kernel's metrics against the benchmark's."""
    ratios = {k: ratio(kernel[k], bench[k], dtype) for k in METRICS}
    over = [k for k in DECIDING if ratios[k] > THRESHOLDS[k]]
    parts = ", ".join(f"{k} {ratios[k]:.4g}" + (f" > {THRESHOLDS[k]:g}" if k in over else "")
                      for k in METRICS)
    return not over, ("ratios to the benchmark: " + parts), ratios
