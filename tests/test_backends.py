"""Backends: Triton kernels in the interpreter (PASS their levels, planted bugs FAIL, the
interpreter's truncating bf16 conversion shows), torch_npu SKIPs with its reason, worker
pinning, kernel timing."""
import importlib.util
import os

import pytest

import verify
from verify.running import devices
from verify.specs import registry
from verify.report.results import mutant_summary

from helpers import run_cli

if importlib.util.find_spec("triton") is None:  # no import: the backend sets it up
    pytest.skip("triton is not installed", allow_module_level=True)

TRITON_OPS = ["apply_adam_w_v2", "apply_rms_prop", "apply_proximal_gradient_descent",
              "sgd_momentum", "adagrad", "lion", "softmax"]


def test_triton_runs_in_the_interpreter_here():
    b = registry.backend("triton")
    assert b.available() == (True, "")
    assert os.environ.get("TRITON_INTERPRET") == "1" and b.device == "cpu"
    assert b.versions()["mode"] == "interpreter"


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_triton_kernels_pass_their_levels(level):
    res = verify.run(level=level, ops=TRITON_OPS, backends=["triton"], reports=False)
    assert {r["op"] for r in res.rows} == set(TRITON_OPS)
    bad = [(r["op"], r["case_id"], r["output"], r["reason"]) for r in res.rows
           if r["verdict"] not in ("PASS", "SKIP")]
    assert not bad


def test_large_cases_skip_in_the_interpreter_with_the_reason():
    res = verify.run(level="L2", ops=["lion"], backends=["triton"], reports=False)
    assert res.rows and {r["verdict"] for r in res.rows} == {"SKIP"}
    assert "Triton interpreter" in res.rows[0]["reason"] and "real device" in res.rows[0]["reason"]


def test_planted_triton_bugs_fail():
    res = verify.run(level="L0", ops=["apply_adam_w_v2"], backends=["mutants"], reports=False)
    caught = {m["kernel"]: m["caught"] for m in mutant_summary(res.rows)}
    assert caught["triton_tail_mask_off_by_one"] and caught["triton_eps_inside_sqrt"]


def test_triton_backward_kernels_pass_and_the_planted_backward_bug_fails():
    res = verify.run(level="L0", ops=["clipped_swiglu", "rmsnorm_without_weight"],
                     backends=["triton", "mutants"], reports=False)
    tri = [r for r in res.rows if r["backend"] == "triton"]
    assert {r["output"] for r in tri} >= {"y", "grad_gate_up", "rstd", "grad_x"}
    assert all(r["verdict"] == "PASS" for r in tri), [r for r in tri if r["verdict"] != "PASS"]
    bug = [r for r in res.rows if r["kernel"] == "triton_swiglu_grad_without_alpha"
           and r["standard"] != "expect_error"]
    assert all(r["verdict"] == "PASS" for r in bug if r["output"] == "y")
    assert any(r["verdict"] == "FAIL" for r in bug if r["output"] == "grad_gate_up")


def test_the_interpreters_truncating_bf16_conversion_shows():
    res = verify.run(level="L0", ops=["apply_adam_w_v2"], backends=["triton", "torch"],
                     dtypes=["bf16"], reports=False)
    w = {r["backend"]: r for r in res.rows if r["output"] == "w_new"
         and r["case_id"] == "small-bf16-33x129"}
    tri, ref = w["triton"], w["torch"]
    assert tri["verdict"] == "PASS"           # within bf16 tolerance...
    assert tri["mag_bias"] > 0.9 and abs(ref["mag_bias"]) < 0.1
    assert tri["eb"] < 0.1                    # ...and invisible to msprobe's EB (signs mix)
    assert tri["max_abs"] > 2 * tri["floor_max_abs"]
    assert "biased rounding" in tri["warning"] and "biased" not in ref["warning"]


def test_npu_backend_skips_with_its_reason_and_is_a_usage_error_when_asked(tmp_path):
    ok, why = registry.backend("npu").available()
    if ok:
        pytest.skip("an NPU is present")
    res = verify.run(level="L0", ops=["rope"], reports=False)
    npu_rows = [r for r in res.rows if r["backend"] == "npu"]
    if importlib.util.find_spec("torch_npu") is None:  # not installed: not run, named once
        assert not npu_rows and res.exit_status == 0
        from verify.cases import selection
        assert any(line.startswith("npu: torch_npu is not installed")
                   for line in selection.unavailable_backends())
    else:  # installed but no NPU: its rows SKIP with the reason
        assert npu_rows and all(r["verdict"] == "SKIP" and r["reason"] == why
                                for r in npu_rows)
    out = run_cli("run", "--backend", "npu", "--op", "rope", "--reports", tmp_path)
    assert out.returncode == 2 and "not available here" in out.stderr and "torch_npu" in out.stderr


def test_workers_are_pinned_to_devices(monkeypatch):
    monkeypatch.setenv("VERIFY_DEVICE_COUNT_CUDA", "2")
    monkeypatch.setenv("VERIFY_DEVICE_COUNT_NPU", "4")
    env = {}
    assert devices.pin_worker("gw3", env) == {"CUDA_VISIBLE_DEVICES": "1",
                                              "ASCEND_RT_VISIBLE_DEVICES": "3"}
    env = {"CUDA_VISIBLE_DEVICES": "0"}  # the user's choice stands
    assert devices.pin_worker("gw1", env) == {"ASCEND_RT_VISIBLE_DEVICES": "1"}
    assert devices.pin_worker(None, {}) == {} and devices.pin_worker("master", {}) == {}
    monkeypatch.setenv("VERIFY_DEVICE_COUNT_CUDA", "1")
    monkeypatch.setenv("VERIFY_DEVICE_COUNT_NPU", "0")
    assert devices.pin_worker("gw5", {}) == {}


def test_time_records_a_median_per_case(tmp_path):
    res = verify.run(level="L0", ops=["lion"], backends=["torch", "triton"], reports=False,
                     time=3)
    times = {r["backend"]: r["kernel_median_s"] for r in res.rows}
    assert all(t > 0 for t in times.values())
    out = run_cli("run", "--op", "lion", "--dtype", "fp32", "--time", "2", "--reports", tmp_path,
                  "--run-id", "t")
    assert out.returncode == 0
    import pandas as pd
    assert (pd.read_csv(tmp_path / "t" / "results.csv")["kernel_median_s"] > 0).all()
    html = (tmp_path / "t" / "report.html").read_text()
    assert "backend triton" in html and "interpreter" in html
