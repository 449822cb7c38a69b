"""The compute-precision floor (verify/compute_floor.py): correct kernels that round their
intermediates legitimately PASS with a warning that shows both figures; known-bad kernels
still FAIL. Each correct kernel here FAILed on main before the floor existed."""
import json
import shutil

import pytest

import verify
from verify.golden import compute_floor as cfl

from helpers import REPO, write_cases

CE_LSE = '''
import torch, verify

def _ce(read_back):
    def ce(logits, weight, labels, *, ignore_index=-100, reduction="sum"):
        """Megatron-style: logsumexp(x) - x[label], autograd for the backward; with
        read_back the logits go through their own dtype first (a bf16 softmax input)."""
        x = logits.float()
        lab = labels.long()
        keep = lab != ignore_index
        picked = x.gather(-1, torch.where(keep, lab, 0)[:, None])[:, 0]
        per = torch.where(keep, (torch.logsumexp(x, -1) - picked) * weight.float(),
                          torch.zeros_like(picked))
        return per.sum() if reduction == "sum" else per
    return ce

verify.kernel("fused_cross_entropy", backend="mine", name="lse_gather")(_ce(False))
'''

LAYER_NORM = '''
import torch, verify
import torch.nn.functional as F

@verify.declare_op(
    "scaled_add_layer_norm",
    inputs=[verify.InputSpec("x"), verify.InputSpec("residual"),
            verify.InputSpec("gamma", shape=lambda m: m[-1:],
                             dist={"dist": "uniform", "low": 0.5, "high": 1.5}),
            verify.InputSpec("beta", shape=lambda m: m[-1:])],
    params={"alpha": 0.5, "eps": 1e-5},
    outputs=[verify.OutputSpec("h"), verify.OutputSpec("y")],
    dtypes=["fp32", "bf16"], standard="cann_v2",
    reuse={"h": lambda ins, h: {**ins, "x": h, "residual": torch.zeros_like(h)}})
def scaled_add_layer_norm(x, residual, gamma, beta, *, alpha, eps):
    h = x + alpha * residual
    mu = h.mean(-1, keepdim=True)
    var = ((h - mu) ** 2).mean(-1, keepdim=True)
    return h, (h - mu) / torch.sqrt(var + eps) * gamma + beta

def _h(x, residual, alpha):
    return x.float() + alpha * residual.float()

@verify.kernel("scaled_add_layer_norm", backend="good")
def torch_layer_norm(x, residual, gamma, beta, *, alpha, eps):
    h = _h(x, residual, alpha)
    y = F.layer_norm(h, h.shape[-1:], gamma.float(), beta.float(), eps)
    return h.to(x.dtype), y.to(x.dtype)

@verify.kernel("scaled_add_layer_norm", backend="good", name="fast_rounded_h")
def fast(x, residual, gamma, beta, *, alpha, eps):
    """h written in the working dtype first and normalised from there (the declared reuse)."""
    h = _h(x, residual, alpha).to(x.dtype)
    y = F.layer_norm(h.float(), h.shape[-1:], gamma.float(), beta.float(), eps)
    return h, y.to(x.dtype)

@verify.kernel("scaled_add_layer_norm", backend="bad", name="one_pass_variance")
def one_pass(x, residual, gamma, beta, *, alpha, eps):
    h = _h(x, residual, alpha)
    mu = h.mean(-1, keepdim=True)
    var = (h * h).mean(-1, keepdim=True) - mu * mu
    y = (h - mu) * torch.rsqrt(var.clamp_min(0) + eps) * gamma.float() + beta.float()
    return h.to(x.dtype), y.to(x.dtype)

@verify.kernel("scaled_add_layer_norm", backend="bad", name="h_through_bf16")
def h_bf16(x, residual, gamma, beta, *, alpha, eps):
    h = _h(x, residual, alpha)
    y = F.layer_norm(h.bfloat16().float(), h.shape[-1:], gamma.float(), beta.float(), eps)
    return h.to(x.dtype), y.to(x.dtype)
'''

LN_CASES = {"op": "scaled_add_layer_norm", "levels": {"L0": [
    {"id": "plain", "shape": [16, 256], "dtype": ["fp32", "bf16"]},
    {"id": "ill-conditioned", "description": "mean 3, std 0.001: fp32 cancellation",
     "shape": [16, 1024], "dtype": "fp32",
     "inputs": {"x": {"dist": "normal", "mean": 3.0, "std": 0.001},
                "residual": {"dist": "constant", "value": 0.0}}},
    {"id": "low-variance", "description": "h's spread is below bf16's spacing at 3",
     "shape": [8, 256], "dtype": "bf16",
     "inputs": {"x": {"dist": "constant", "value": 3.0},
                "residual": {"dist": "normal", "std": 0.002}}}]}}


def _rows(res, **match):
    case = match.pop("case_id", None)
    return [r for r in res.rows if all(r.get(k) == v for k, v in match.items())
            and (case is None or r["case_id"].startswith(case + "-"))]


@pytest.fixture(scope="module")
def layer_norm_run(tmp_path_factory, module_registrations):
    tmp = tmp_path_factory.mktemp("ln")
    (tmp / "ln.py").write_text(LAYER_NORM)
    write_cases(tmp / "cases", LN_CASES)
    return verify.run(level="L0", kernels=[str(tmp / "ln.py")], backends=["good", "bad"],
                      ops=["scaled_add_layer_norm"], cases=str(tmp / "cases"), reports=False)


def test_an_ill_conditioned_layer_norm_passes_torch_within_the_compute_floor(layer_norm_run):
    row, = _rows(layer_norm_run, kernel="torch_layer_norm", case_id="ill-conditioned",
                 output="y")
    assert row["verdict"] == "PASS" and row["passed_by"] == "cfloor"
    # the metric columns are the exact golden's, and they fail cann_v2 on their own
    assert row["v2_match_ratio"] < 0.99
    assert row["cfloor_margin"] >= cfl.MIN_FLOOR_MARGIN and row["cfloor_ratio"] <= 1.0
    assert "compute-precision floor" in row["warning"] and "exact golden" in row["warning"]
    plain = _rows(layer_norm_run, kernel="torch_layer_norm", case_id="plain")
    assert {r["verdict"] for r in plain} == {"PASS"}
    assert not any(r.get("passed_by") for r in plain)


@pytest.mark.parametrize("kernel", ["one_pass_variance", "h_through_bf16"])
def test_bad_layer_norms_still_fail_the_ill_conditioned_case(layer_norm_run, kernel):
    row, = _rows(layer_norm_run, kernel=kernel, case_id="ill-conditioned", output="y")
    assert row["verdict"] == "FAIL" and not row.get("passed_by")
    assert row["cfloor_ratio"] > 1.0


def test_a_variant_pass_shows_the_exact_golden_error(layer_norm_run):
    """The newcomer's low-variance row: y collapses to beta once h is rounded to bf16.
    It passes against the declared variant, but the row shows the exact golden's error."""
    row, = _rows(layer_norm_run, kernel="fast_rounded_h", case_id="low-variance", output="y")
    assert row["verdict"] == "PASS" and row["passed_by"] == "variant"
    assert row["golden_variant"] == "h rounded to bf16"
    assert row["max_abs"] > 0.5                       # the exact golden's error
    assert row["variant_max_abs"] < row["max_abs"]    # the variant's, in its own column
    assert f"{row['max_abs']:.3g}" in row["warning"]
    assert row["v2_match_ratio"] < 0.99


def test_the_terminal_and_report_list_floor_and_variant_passes_apart(layer_norm_run, tmp_path):
    from verify.report import results
    text = results.summary_text(layer_norm_run.rows, width=200)
    assert "passed only by a variant or the compute-precision floor" in text
    block = text.split("passed only by a variant or the compute-precision floor", 1)[1]
    assert "fast_rounded_h" in block and "torch_layer_norm" in block
    results.write(layer_norm_run.rows, tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert 'id="passed-by-floor"' in html and "fast_rounded_h" in html


@pytest.fixture(scope="module")
def ce_run(tmp_path_factory, module_registrations):
    """The built-in L0 cases of fused_cross_entropy (their inputs are the reproducer's)."""
    tmp = tmp_path_factory.mktemp("ce")
    (tmp / "ce.py").write_text(CE_LSE)
    return verify.run(level="L0", kernels=[str(tmp / "ce.py")], backends=["mine"],
                      ops=["fused_cross_entropy"], reports=False)


def test_lse_minus_gather_cross_entropy_passes_confident_tokens(ce_run):
    view = _rows(ce_run, output="grad_logits[true_class]", case_id="confident")
    assert len(view) == 6 and {r["verdict"] for r in view} == {"PASS"}
    by_floor = [r for r in view if r.get("passed_by") == "cfloor"]
    assert by_floor, "the fp32 rounding of p in p - 1 failed the exact golden before"
    for r in by_floor:
        assert r["allclose_mismatch"] > 0          # the exact golden's figure stays shown
        assert r["cfloor_max_abs"] > 0 and r["cfloor_ratio"] <= 1.0
    judged = [r for r in ce_run.rows if r["standard"] != "expect_error"]
    assert {r["verdict"] for r in judged} == {"PASS"}


@pytest.fixture(scope="module")
def gdn_run(module_registrations):
    return verify.run(level="L0", ops=["chunk_gated_delta_rule"], backends=["mine"],
                      kernels=[str(REPO / "tests" / "data" / "bf16_intermediates_gdn.py")],
                      dtypes=["bf16", "fp16", "fp32"], reports=False)


def test_a_kernel_keeping_bf16_intermediates_passes_the_fp32_final_state(gdn_run):
    finals = _rows(gdn_run, output="final_state")
    low = [r for r in finals if r["dtype"] in ("bf16", "fp16")]
    assert low and {r["verdict"] for r in low} == {"PASS"}
    assert sum(r.get("passed_by") == "cfloor" for r in low) >= len(low) // 2
    # fp32 cases store nothing in a lower dtype: judged by the standard alone
    assert not any(r.get("passed_by") for r in finals if r["dtype"] == "fp32")


def test_the_golden_marks_what_a_real_kernel_stores_in_the_working_dtype():
    import torch
    x = torch.tensor([1.0 + 2 ** -12], dtype=torch.float32)
    assert cfl.working(x).item() == x.item()           # the float64 golden: untouched
    with cfl._working_dtype(torch.bfloat16):
        assert cfl.working(x).item() == 1.0            # the floor: rounded to bf16
    assert verify.working is cfl.working


def test_a_softmax_computed_in_bf16_is_not_excused_by_the_floor():
    res = verify.run(level="L0", ops=["softmax"], backends=["mutants"], dtypes=["bf16"],
                     reports=False)
    rows = [r for r in _rows(res, kernel="no_max_subtraction") if r["output"] == "y"]
    assert rows and all(r["verdict"] == "FAIL" for r in rows if r["standard"] != "expect_error")
    assert not any(r.get("passed_by") for r in rows)
