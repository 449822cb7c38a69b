"""The whole flow: correct kernels PASS every level they run, every mutant FAILs, the CLI
gives the promised exit codes, reports and errors."""
import json
import textwrap

import pandas as pd
import pytest

import verify
from verify.specs import registry
from verify.report import results

from helpers import run_cli, write_cases

OPTIMIZERS = ("apply_adam_w_v2", "apply_rms_prop", "apply_proximal_gradient_descent",
              "sgd_momentum", "adagrad", "lion", "lamb", "adafactor")
REQUIRED_COLUMNS = ["op", "case_id", "level", "backend", "kernel", "dtype", "output",
                    "verdict", "standard", "reason", "mere", "mare", "max_abs", "max_rel",
                    "rmse", "eb"]


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_correct_kernels_pass_every_case(level):
    res = verify.run(level=level, reports=False)
    bad = [(r["op"], r["case_id"], r["output"], r["verdict"], r["reason"])
           for r in res.rows if r["verdict"] in ("FAIL", "ERROR")]
    assert not bad
    for r in res.rows:  # only backends that are not available here may skip
        if r["verdict"] == "SKIP":
            assert not registry.backend(r["backend"]).available()[0] or \
                "real device" in r["reason"] or "is forward-only" in r["reason"], r
    assert {r["op"] for r in res.rows} == set(registry.ops())
    assert res.exit_status == 0


def test_every_mutant_fails_under_its_ops_default_standard():
    kernels = registry.kernels(backend_names=["mutants"])
    per_op = {}
    for k in kernels:
        per_op.setdefault(k.op, []).append(k.name)
    assert set(per_op) == set(registry.ops())  # every op has known-bad kernels
    assert all(len(per_op[op]) >= 2 for op in OPTIMIZERS), per_op
    caught = set()
    for level in ("L0", "L1"):
        res = verify.run(level=level, backends=["mutants"], reports=False)
        for r in res.rows:
            default = registry.op(r["op"]).standard["name"]
            if r["verdict"] == "FAIL" and r["standard"] == default:
                caught.add((r["op"], r["kernel"]))
        if len(caught) == len(kernels):
            break
    missed = {(k.op, k.name) for k in kernels} - caught
    assert not missed


def test_adamw_mutants_from_ops_md_are_present():
    names = {k.name for k in registry.kernels("apply_adam_w_v2", ["mutants"])}
    assert {"eps_inside_sqrt", "coupled_weight_decay", "no_bias_correction",
            "bias_correction_step_minus_1", "bf16_intermediate_math",
            "states_written_bf16"} <= names


def test_multi_step_rows_show_every_step():
    res = verify.run(level="L0", ops=["apply_adam_w_v2"], backends=["torch"], reports=False)
    rows = [r for r in res.rows if r["case_id"].startswith("run10")]
    assert rows and all(len(r["step_metrics"]) == 10 for r in rows)
    w = next(r for r in rows if r["output"] == "w_new")
    assert [s["step"] for s in w["step_metrics"]] == list(range(1, 11))
    # error grows along the trajectory, and the last step is what the row reports
    assert w["step_metrics"][-1]["max_abs"] == w["max_abs"]
    assert w["step_metrics"][-1]["max_abs"] > w["step_metrics"][0]["max_abs"]


def test_validation_of_the_real_wrappers():
    import torch
    spec = verify.op("apply_adam_w_v2")
    h = torch.zeros(4, 4, dtype=torch.float16)
    f = torch.zeros(4, 4)
    with pytest.raises(TypeError):
        spec.validate(weight=h, grad=h, m=f, v=f)
    prox = verify.op("apply_proximal_gradient_descent")
    s = torch.tensor(0.1)
    with pytest.raises(ValueError):
        prox.validate(var=torch.zeros(2, 3), delta=torch.zeros(3, 2), alpha=s, l1=s, l2=s)
    with pytest.raises(ValueError):
        prox.validate(var=torch.zeros(2, 3), delta=torch.zeros(2, 3), alpha=-s, l1=s, l2=s)


def test_api_surface():
    assert set(OPTIMIZERS) <= set(verify.ops()) and len(verify.ops()) == 37
    res = verify.run(level="L0", ops=["lion"], dtypes=["bf16"], reports=False)
    df = res.df
    assert isinstance(df, pd.DataFrame) and set(df["dtype"]) == {"bf16"}
    assert list(df.columns[:len(results.COLUMNS)]) == results.COLUMNS


# -- the command line ------------------------------------------------------------------
def test_cli_run_writes_reports_and_exits_0(tmp_path):
    out = run_cli("run", "--level", "L0", "--op", "sgd_momentum", "--dtype", "fp32",
                  "--reports", tmp_path, "--run-id", "r1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verdicts per op and kernel" in out.stdout and "PASS" in out.stdout
    df = pd.read_csv(tmp_path / "r1" / "results.csv")
    assert set(REQUIRED_COLUMNS) <= set(df.columns)
    assert set(df["verdict"]) == {"PASS"} and set(df["dtype"]) == {"fp32"}
    doc = json.loads((tmp_path / "r1" / "results.json").read_text())
    assert doc["meta"]["counts"]["PASS"] == len(df) == len(doc["rows"])


def test_cli_malformed_case_file_exits_2_naming_file_case_and_path(tmp_path):
    write_cases(tmp_path / "cases", {"op": "lion", "levels": {"L0": [
        {"id": "fine", "shape": [2, 2]}, {"id": "broken", "shape": [2, 2], "dtype": "fp8"}]}})
    out = run_cli("run", "--cases", tmp_path / "cases", "--reports", tmp_path)
    assert out.returncode == 2
    assert "lion.json" in out.stderr and "broken" in out.stderr
    assert "$.levels.L0[1].dtype" in out.stderr


def test_cli_unknown_op_and_unsupported_dtype_exit_2(tmp_path):
    out = run_cli("run", "--op", "adamx", "--reports", tmp_path)
    assert out.returncode == 2 and "unknown op 'adamx'" in out.stderr
    write_cases(tmp_path / "c", {"op": "apply_rms_prop", "levels": {"L0": [
        {"id": "half", "shape": [4, 4], "dtype": "bf16"}]}})
    out = run_cli("run", "--cases", tmp_path / "c", "--reports", tmp_path)
    assert out.returncode == 2
    assert "dtype 'bf16' is not supported by op 'apply_rms_prop'" in out.stderr
    assert "case 'half'" in out.stderr


USER_KERNELS = textwrap.dedent('''
    import torch
    import verify

    @verify.kernel("lion", backend="mine")
    def lion(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
        w, g = weight.float(), grad.float()
        d = torch.sign(beta1 * exp_avg + (1 - beta1) * g)
        return (w * (1 - lr * weight_decay) - lr * d).to(weight.dtype), beta2 * exp_avg + (1 - beta2) * g

    @verify.kernel("sgd_momentum", backend="mine")
    def sgd(weight, grad, momentum_buffer, **params):
        if weight.shape[0] == 33:
            raise RuntimeError("tail tiles are not implemented")
        w = weight.float()
        g = grad.float() + params["weight_decay"] * w
        buf = params["momentum"] * momentum_buffer + (1 - params["dampening"]) * g
        step = g + params["momentum"] * buf if params["nesterov"] else buf
        return (w - params["lr"] * step).to(weight.dtype), buf
''')


def test_user_kernels_by_file_path_and_an_error_row(tmp_path):
    mod = tmp_path / "my_kernels.py"
    mod.write_text(USER_KERNELS)
    out = run_cli("run", "--kernels", mod, "--backend", "mine", "--op", "lion", "--op", "sgd",
                  "--reports", tmp_path, "--run-id", "mine")
    assert out.returncode == 1, out.stdout + out.stderr  # the raising kernel makes it 1
    df = pd.read_csv(tmp_path / "mine" / "results.csv")
    assert set(df["backend"]) == {"mine"}
    errors = df[df["verdict"] == "ERROR"]
    assert len(errors) >= 1 and (errors["op"] == "sgd_momentum").all()
    assert errors["reason"].str.contains("tail tiles are not implemented").all()
    assert errors["case_id"].str.contains("33x").all()
    others = df[df["verdict"] != "ERROR"]
    assert len(others) > 20 and set(others["verdict"]) == {"PASS"}  # the rest finished


def test_user_kernels_by_dotted_name(tmp_path):
    (tmp_path / "mine_pkg.py").write_text(USER_KERNELS)
    out = run_cli("run", "--kernels", "mine_pkg", "--backend", "mine", "--op", "lion",
                  "--reports", tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr


def test_cli_mutants_run_reports_caught(tmp_path):
    out = run_cli("run", "--backend", "mutants", "--op", "apply_rms_prop", "--reports", tmp_path,
                  "--run-id", "m")
    assert out.returncode == 0, out.stdout + out.stderr  # every mutant caught
    assert "known-bad kernels (mutants)" in out.stdout and "MISSED" not in out.stdout
    assert out.stdout.count("caught") >= 3
    diffs = (tmp_path / "m" / "diff_tables.txt").read_text()
    assert "index | var | ms | mom | grad | golden | actual | abs_diff | rel_diff" in diffs


def test_cli_unavailable_or_unknown_backend_is_usage_error(tmp_path):
    out = run_cli("run", "--backend", "nope", "--reports", tmp_path)
    assert out.returncode == 2 and "unknown backend 'nope'" in out.stderr


def test_a_failing_kernel_gives_exit_1_and_a_diff_table(tmp_path):
    mod = tmp_path / "bad.py"
    mod.write_text(textwrap.dedent('''
        import verify
        from verify.kernels.torch.optimizers import apply_rms_prop

        @verify.kernel("apply_rms_prop", backend="bad")
        def off_by_a_bit(var, ms, mom, grad, **p):
            var_new, ms_new, mom_new = apply_rms_prop(var, ms, mom, grad, **p)
            return var_new * (1 + 1e-4), ms_new, mom_new
    '''))
    out = run_cli("run", "--kernels", mod, "--backend", "bad", "--op", "apply_rms_prop",
                  "--reports", tmp_path, "--run-id", "bad")
    assert out.returncode == 1
    doc = json.loads((tmp_path / "bad" / "results.json").read_text())
    failing = [r for r in doc["rows"] if r["verdict"] == "FAIL"]
    assert failing and all(r["output"] == "var_new" for r in failing)
    table = failing[0]["diff_table"]
    assert len(table) == 10 and set(table[0]["inputs"]) == {"var", "ms", "mom", "grad"}
    e = table[0]
    assert e["abs_diff"] == pytest.approx(abs(e["actual"] - e["golden"]))
