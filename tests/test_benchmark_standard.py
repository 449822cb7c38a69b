"""msprobe's benchmark standard: the kernel's errors over a benchmark kernel's errors on
the same inputs. Checked against a plain-Python write-out of msprobe 26.2's formulas
(element by element, no NumPy), and against msprobe itself where it is installed."""
import math

import numpy as np
import pytest
import torch

import verify
from verify.comparator import benchmark as bm


def _by_hand(actual: torch.Tensor, golden: torch.Tensor, dtype) -> dict:
    """msprobe's BenchmarkCompare metrics, one element at a time."""
    a = actual.float().tolist() if actual.dtype == torch.bfloat16 else actual.tolist()
    g = golden.double().tolist()
    small_bound = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -10}.get(dtype, 2 ** -20)
    atol = {torch.float16: 1e-16, torch.bfloat16: 1e-16}.get(dtype, 2 ** -30)
    eps = 2 ** -8 if dtype == torch.bfloat16 else np.finfo(np.float64).eps
    cast = (torch.tensor(g, dtype=torch.float64).to(torch.float32 if dtype == torch.bfloat16
                                                    else dtype).double().tolist())
    n = len(g)
    small = small_bad = larger = smaller = masked = 0
    sq, rels = 0.0, []
    for x, y, yc in zip(a, g, cast):
        finite = math.isfinite(x) and math.isfinite(yc)
        err = abs(x - y)
        is_small = finite and abs(y) <= small_bound
        small += is_small
        small_bad += is_small and err > atol
        if not finite or is_small:
            masked += 1
        else:
            sq += err * err
            rels.append(err / (abs(y) + eps))
        larger += x - yc > 0
        smaller += x - yc < 0
    mse = sq / n * (n / (n - masked + 0.0001) + 0.0001)
    return {"small_value_err_ratio": small_bad / small if small else 0.0,
            "rmse": math.sqrt(mse), "max_rel_err": max(rels, default=0.0),
            "mean_rel_err": sum(rels) / len(rels) if rels else 0.0,
            "eb": abs(larger - smaller) / n}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_metrics_follow_msprobes_formulas(dtype):
    rng = np.random.default_rng(5)
    g = torch.from_numpy(np.concatenate([rng.normal(0, 1, 3000), rng.normal(0, 1, 500) * 1e-4,
                                         [0.0, 2 ** -30, np.inf]]))
    a = (g * (1 + torch.from_numpy(rng.normal(0, 1e-3, g.numel())))).to(dtype)
    ours, ref = bm.metrics(a, g, dtype), _by_hand(a, g, dtype)
    for key in bm.METRICS:
        assert ours[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-15), key


def test_ratios_use_msprobes_minimum_error_and_thresholds():
    assert bm.ratio(1e-3, 0.0, torch.bfloat16) == pytest.approx(1e-3 / 2 ** -8)
    assert bm.ratio(3e-4, 1e-5, torch.float32) == pytest.approx(3e-4 / 2 ** -14)
    assert bm.ratio(3e-4, 1e-4, torch.float32) == pytest.approx(3.0)
    assert bm.ratio(0.5, 0.1, torch.float16) == pytest.approx(5.0)
    assert math.isnan(bm.ratio(math.inf, math.inf, torch.float16))
    assert bm.ratio(math.inf, 1.0, torch.float16) == math.inf
    ok, _, _ = bm.judge({"small_value_err_ratio": 0, "rmse": 1.9, "max_rel_err": 9.9,
                         "mean_rel_err": 1.9, "eb": 100},
                        {"small_value_err_ratio": 0, "rmse": 1, "max_rel_err": 1,
                         "mean_rel_err": 1, "eb": 1}, torch.float16)
    assert ok  # EB's ratio is recorded, not deciding (as in msprobe)


def test_compare_with_a_benchmark_output():
    g = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    reference = g.to(torch.bfloat16)
    assert verify.compare(g.float().to(torch.bfloat16), g, standard="benchmark",
                          benchmark=reference).verdict == "PASS"
    worse = verify.compare((g * 1.02).to(torch.bfloat16), g, standard="benchmark",
                           benchmark=reference)
    assert worse.verdict == "FAIL" and "rmse" in worse.reason and worse.margin > 1
    assert worse.extra["ratio_rmse"] > 2
    with pytest.raises(verify.ConfigError):
        verify.compare(reference, g, standard="benchmark")


def test_a_run_against_a_benchmark_backend_catches_a_mutant_by_ratio():
    res = verify.run(level="L0", ops=["lion"], backends=["mutants"], dtypes=["fp32"],
                     benchmark_backend="torch", reports=False)
    bench = [r for r in res.rows if r["standard"] == "benchmark"]
    assert bench and all(r["benchmark"] == "torch:lion" for r in bench)
    failing = {r["kernel"] for r in bench if r["verdict"] == "FAIL"}
    assert "state_with_beta1" in failing
    assert all(r["output"].endswith(" vs torch") for r in bench)
    with pytest.raises(verify.ConfigError):
        verify.run(level="L0", ops=["lion"], benchmark_backend="no_such_backend",
                   reports=False)


def test_a_benchmark_backend_judges_gradient_outputs_too():
    res = verify.run(level="L0", ops=["rmsnorm_without_weight"], backends=["mutants"],
                     dtypes=["fp32"], benchmark_backend="torch", reports=False)
    bench = [r for r in res.rows if r["standard"] == "benchmark"]
    grads = [r for r in bench if r["output"].startswith("grad_")]
    assert grads and all(r["output"].endswith(" vs torch") for r in grads)
    assert all(r["verdict"] in ("PASS", "FAIL") for r in grads)
    # a backward mutant's gradient is off against torch's gradient on the same inputs
    assert any(r["verdict"] == "FAIL" for r in grads), [(r["kernel"], r["reason"]) for r in grads]
