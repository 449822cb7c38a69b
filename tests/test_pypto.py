"""PyPTO kernels on the CPU: pass-verify evaluation as a functional reference, each case in
a subprocess, the calculator built once and cached, the modelled AICore time recorded."""
import importlib.util
import json

import pytest

from verify.specs import registry

from helpers import REPO, run_cli, write_cases

if importlib.util.find_spec("pypto") is None:
    pytest.skip("pypto is not installed", allow_module_level=True)


def test_backend_is_pinned_and_opt_in():
    b = registry.backend("pypto")
    assert b.available() == (True, "") and b.versions()["pypto"] == "0.2.0"
    assert not b.default  # a case costs seconds: --backend pypto


def test_pypto_kernels_pass_L0_with_modelled_times(tmp_path):
    out = run_cli("run", "--level", "L0", "--backend", "pypto", "--op", "apply_adam_w_v2",
                  "--op", "apply_rms_prop", "--op", "apply_proximal_gradient_descent",
                  "-n", "2", "--reports", tmp_path, "--run-id", "p", timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    rows = json.loads((tmp_path / "p" / "results.json").read_text())["rows"]
    assert {r["op"] for r in rows} == {"apply_adam_w_v2", "apply_rms_prop",
                                       "apply_proximal_gradient_descent"}
    assert {r["verdict"] for r in rows} == {"PASS"}
    timed = [r for r in rows if r["standard"] != "expect_error" and r["shape"] not in ("0", "2x0")]
    assert timed and all(isinstance(r["aicore_time_us"], float) and r["aicore_time_us"] > 0
                         for r in timed)
    assert not (REPO / "output").exists()  # PyPTO's folders stay in the case's temp folder


def test_planted_pypto_bugs_fail(tmp_path):
    write_cases(tmp_path / "cases", {"op": "apply_adam_w_v2", "levels": {"L0": [
        {"id": "tails", "shape": [33, 129], "dtype": ["fp32", "bf16"]}]}})
    out = run_cli("run", "--cases", tmp_path / "cases", "--backend", "mutants", "-k", "pypto",
                  "--reports", tmp_path, "--run-id", "m", timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:]  # every mutant selected was caught
    doc = json.loads((tmp_path / "m" / "results.json").read_text())
    caught = {m["kernel"]: m["caught"] for m in doc["mutants"]}
    assert caught == {"pypto_wrong_assemble_offset": True, "pypto_missing_cast": True}
