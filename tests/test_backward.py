"""Backward verification end to end: gradients as outputs of their own, correct kernels
PASS, backward bugs FAIL with the forward still PASSing, reduction gradients' scaled
tolerances, separate backward kernels, non-differentiable kernels, case-file errors."""
import json
import math
import textwrap

import pytest

import verify
import verify.cases.case  # noqa: F401  (verify.cases.case.load_file, below)
from verify.errors import CaseFileError

from helpers import run_cli, write_cases


def rows_of(df, **where):
    for k, v in where.items():
        df = df[df[k] == v]
    return df


def test_mhc_post_forward_and_backward_pass_and_the_transposed_grad_fails():
    res = verify.run(level="L0", reports=False, ops=["mhc_post"], backends=["torch", "mutants"])
    df = res.df
    torch_rows = rows_of(df, backend="torch")
    assert set(torch_rows.output) == {"out", "grad_x", "grad_residual", "grad_h_post",
                                      "grad_h_res"}
    assert (torch_rows.verdict == "PASS").all(), torch_rows[torch_rows.verdict != "PASS"]
    bad = rows_of(df, kernel="h_res_grad_transposed")
    # the forward and the other gradients are right; only grad_h_res is wrong
    assert (rows_of(bad, output="out").verdict == "PASS").all()
    assert (rows_of(bad, output="grad_x").verdict == "PASS").all()
    assert (rows_of(bad, output="grad_h_res").verdict == "FAIL").all()
    caught = {m["kernel"]: m["caught"] for m in res.mutants}
    assert caught == {"h_res_grad_transposed": True, "h_res_not_transposed": True}


def test_gamma_grad_in_bf16_is_caught_only_by_the_gradient_rows():
    res = verify.run(level="L0", reports=False, ops=["add_rms_norm_bias"], backends=["torch", "mutants"],
                     cases=None)
    df = res.df
    assert (rows_of(df, backend="torch").verdict.isin(["PASS"])).all()
    bad = rows_of(df, kernel="gamma_grad_accumulated_in_bf16")
    bad = bad[bad.standard != "expect_error"]
    assert (bad[bad.output.isin(["y", "rstd", "x", "grad_x1", "grad_x2"])].verdict
            == "PASS").all()
    assert (rows_of(bad, output="grad_gamma").verdict == "FAIL").any()


def test_reduction_gradients_get_tolerances_scaled_by_their_length():
    df = verify.run(level="L0", reports=False, ops=["add_rms_norm_bias"], backends=["torch"]).df
    row = rows_of(df, case_id="doc-sample2-fp32-2x8x512", output="grad_gamma").iloc[0]
    n = 2 * 8  # gamma [512] sums over the 16 rows of x [2, 8, 512]
    assert row.reduction_n == n
    assert row.tol_scale == pytest.approx(math.sqrt(n))  # fp32 out: sqrt(n) * u32 / u32
    half = rows_of(df, case_id="tail-bf16-7x33", output="grad_gamma").iloc[0]
    assert half.reduction_n == 7 and half.tol_scale == 1.0  # bf16 rounding dominates
    plain = rows_of(df, case_id="doc-sample2-fp32-2x8x512", output="grad_x1").iloc[0]
    assert math.isnan(plain.tol_scale) or plain.tol_scale in (None, 1.0)


def test_every_fused_op_mutant_is_caught_and_torch_kernels_pass():
    ops = ["rmsnorm_without_weight", "rms_norm_gated", "clipped_swiglu",
           "fused_cross_entropy", "sinkhorn", "moe_sort_chunks_by_index",
           "moe_sort_chunks_by_index_with_probs", "chunk_local_cumsum",
           "chunk_scaled_dot_kkt", "solve_tril", "recompute_w_u", "chunk_gated_delta_rule"]
    res = verify.run(level="L0", reports=False, ops=ops, backends=["torch", "mutants"])
    torch_rows = rows_of(res.df, backend="torch")
    assert (torch_rows.verdict == "PASS").all(), torch_rows[torch_rows.verdict != "PASS"][
        ["case_id", "output", "reason"]]
    assert {m["op"] for m in res.mutants} == set(ops)
    missed = [(m["op"], m["kernel"]) for m in res.mutants if not m["caught"]]
    assert not missed
    # a backward-only bug: the forward passes, the gradient fails
    beta = rows_of(res.df, kernel="beta_detached")
    assert (rows_of(beta, output="o").verdict == "PASS").all()
    assert (rows_of(beta, output="grad_beta").verdict == "FAIL").all()
    # the missing exp clamp turns into NaN where the gates span more than ~88
    nan = rows_of(res.df, kernel="exp_clamp_missing", output="o")
    assert nan[nan.case_id.str.startswith("strong-decay")].reason.str.contains("NaN").all()


def test_the_documented_exp_clamp_is_measured_as_a_strategy():
    res = verify.run(level="L0", reports=False, ops=["chunk_gated_delta_rule"], backends=["strategies"],
                     dtypes=["fp32"])
    df = res.df[res.df.standard != "expect_error"]
    exact = rows_of(df, kernel="exp_clamp_upper_0")
    assert (exact.verdict == "PASS").all()
    doc = rows_of(df, kernel="exp_clamp_-9_0", case_id="doc-gates-fp32-1x256x2x32")
    assert (rows_of(doc, output="o").verdict == "FAIL").all()


USER_MODULE = textwrap.dedent('''
    import torch
    import verify

    @verify.kernel("rmsnorm_without_weight", backend="mine")
    def rstd_detached(x, *, eps=1e-6):
        """No graph: the harness must say so, not crash."""
        with torch.no_grad():
            return torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)

    @verify.kernel("rmsnorm_without_weight", backend="mine", name="with_backward")
    def rstd_value(x, *, eps=1e-6):
        return torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)

    @verify.backward_kernel("rmsnorm_without_weight", backend="mine", name="with_backward")
    def rstd_grad(x, *, grad_rstd, eps=1e-6):
        xf = x.float()
        r = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        return ((-grad_rstd.float() * r ** 3 * xf / x.shape[-1]).to(x.dtype),)

    @verify.kernel("rmsnorm_without_weight", backend="mine", name="bad_backward")
    def rstd_value2(x, *, eps=1e-6):
        return rstd_value(x, eps=eps)

    @verify.backward_kernel("rmsnorm_without_weight", backend="mine", name="bad_backward")
    def rstd_grad_sign(x, *, grad_rstd, eps=1e-6):
        return (-rstd_grad(x, grad_rstd=grad_rstd, eps=eps)[0],)
''')


def test_user_backward_kernels_and_a_kernel_without_a_graph(tmp_path):
    mod = tmp_path / "my_kernels.py"
    mod.write_text(USER_MODULE)
    res = verify.run(level="L0", reports=False, ops=["rmsnorm_without_weight"], backends=["mine"],
                     kernels=[str(mod)])
    df = res.df
    good = rows_of(df, kernel="with_backward")
    assert (good.verdict == "PASS").all()
    assert set(good.output) == {"rstd", "grad_x"}
    assert (rows_of(df, kernel="bad_backward", output="grad_x").verdict == "FAIL").all()
    assert (rows_of(df, kernel="bad_backward", output="rstd").verdict == "PASS").all()
    detached = rows_of(df, kernel="rstd_detached")
    assert (rows_of(detached, output="rstd").verdict == "PASS").all()  # forward kept
    errs = rows_of(detached, output="grad_x")
    assert (errs.verdict == "ERROR").all()
    assert errs.reason.str.contains("carries no autograd graph").all()


def test_case_mode_and_upstream_distribution(tmp_path):
    doc = {"op": "rmsnorm_without_weight", "levels": {"L0": [
        {"id": "fwd", "shape": [4, 32], "mode": "forward"},
        {"id": "bwd", "shape": [4, 32], "mode": "backward",
         "inputs": {"grad_rstd": {"dist": "constant", "value": 2.0}}}]}}
    folder = tmp_path / "cases"
    write_cases(folder, doc)
    df = verify.run(level="L0", reports=False, backends=["torch"], cases=str(folder)).df
    assert list(rows_of(df, case_id="fwd-fp32-4x32").output) == ["rstd"]
    assert list(rows_of(df, case_id="bwd-fp32-4x32").output) == ["grad_x"]
    assert (df.verdict == "PASS").all()


@pytest.mark.parametrize("case,field,message", [
    ({"id": "a", "shape": [4, 8], "mode": "backward"}, "$.levels.L0[0].mode",
     "declares no gradients"),
    ({"id": "b", "shape": [4, 8], "inputs": {"x": {"dist": "none"}}}, "$.levels.L0[0].inputs.x",
     "is required"),
])
def test_bad_backward_case_fields_name_the_field(tmp_path, case, field, message):
    op = "mean" if case["id"] == "a" else "rmsnorm_without_weight"
    path = write_cases(tmp_path, {"op": op, "levels": {"L0": [case]}})
    with pytest.raises(CaseFileError) as err:
        verify.cases.case.load_file(path)
    text = str(err.value)
    assert field in text and message in text and case["id"] in text


def test_backward_goldens_come_from_the_store_the_second_time(tmp_path):
    store = tmp_path / "store"
    first = verify.run(level="L0", reports=False, ops=["mhc_post"], backends=["torch"], store=str(store)).df
    second = verify.run(level="L0", reports=False, ops=["mhc_post"], backends=["torch"], store=str(store)).df
    assert set(first.golden_source) == {"computed"}
    assert set(second.golden_source) == {"local"}
    cols = ["case_id", "output", "verdict", "mere", "max_abs"]
    assert first[cols].equals(second[cols])


def test_cli_lists_gradient_rows_in_the_csv(tmp_path):
    out = tmp_path / "r"
    proc = run_cli("run", "--level", "L0", "--op", "clipped_swiglu", "--backend", "torch",
                   "--reports", str(out), "--run-id", "x")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = (out / "x" / "results.csv").read_text().splitlines()[0].split(",")
    for col in ("mode", "output", "reduction_n", "tol_scale", "backward_s"):
        assert col in header
    data = json.loads((out / "x" / "results.json").read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    assert {"y", "grad_gate_up"} <= {r["output"] for r in rows}
