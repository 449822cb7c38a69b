"""Third-party kernels as their authors write them: realistic inputs (rotary tables,
confident tokens), a floor that knows legitimately rounded outputs, kernel capabilities,
and the Triton interpreter's defects named on the rows they touch."""
import json
import math
from pathlib import Path

import pytest
import verify
from verify.specs import inputs
from verify.cases import selection
from verify.comparator import standards

from helpers import write_cases

ROPE_HALF = '''
import torch
import verify


@verify.kernel("rope", backend="hf", params={"layout": ["rotate_half"]})
def rope_half_tables(x, cos, sin, *, layout):
    """Hugging Face / Liger style: reads only the first half of cos and sin."""
    d = x.shape[-1] // 2
    c, s = cos[:, None, :d].float(), sin[:, None, :d].float()
    x1, x2 = x[..., :d].float(), x[..., d:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
'''


def _builtin_case(op: str, case_id: str) -> dict:
    doc = json.loads((Path(selection.builtin_cases_dir()) / f"{op}.json").read_text())
    return next(c for c in doc["levels"]["L0"] if c["id"] == case_id)


def test_rotary_tables_are_what_models_build():
    cos = inputs.rotary_table((6, 8), "cos")
    sin = inputs.rotary_table((6, 8), "sin", layout="interleaved")
    assert (cos[:, :4] == cos[:, 4:]).all() and (sin[:, 0::2] == sin[:, 1::2]).all()
    pos, i = 5, 1  # angle = pos * theta^(-2i/D)
    assert cos[pos, i] == pytest.approx(math.cos(pos * 10000 ** (-2 * i / 8)))
    linear = inputs.rotary_table((6, 8), "cos", scaling="linear", factor=4.0)
    assert linear[4, 0] == pytest.approx(cos[1, 0])  # position 4 / 4 = 1
    ntk = inputs.rotary_table((6, 8), "cos", scaling="ntk", factor=2.0)
    assert ntk[5, 0] == cos[5, 0] and ntk[5, 3] != cos[5, 3]  # low frequencies stretched


def test_a_half_table_rope_kernel_passes_and_random_tables_would_fail_it(tmp_path):
    (tmp_path / "rope_hf.py").write_text(ROPE_HALF)
    res = verify.run(level="L0", ops=["rope"], backends=["hf"],
                     kernels=[str(tmp_path / "rope_hf.py")], reports=False)
    verdicts = {r["verdict"] for r in res.rows}
    assert "FAIL" not in verdicts and "ERROR" not in verdicts and "PASS" in verdicts
    skips = [r for r in res.rows if r["verdict"] == "SKIP"]
    assert skips and all("layout in ['rotate_half']" in r["reason"] for r in skips)
    random_tables = {"op": "rope", "levels": {"L0": [{
        "id": "random-tables", "shape": [2, 5, 3, 64], "dtype": "fp32",
        "inputs": {"cos": {"dist": "uniform", "low": -1, "high": 1},
                   "sin": {"dist": "uniform", "low": -1, "high": 1}}}]}}
    write_cases(tmp_path / "cases", random_tables)
    old = verify.run(level="L0", ops=["rope"], backends=["hf"], cases=str(tmp_path / "cases"),
                     kernels=[str(tmp_path / "rope_hf.py")], reports=False)
    assert {r["verdict"] for r in old.rows} == {"FAIL"}


def test_explicit_values_take_a_shape(tmp_path):
    doc = {"op": "rope", "levels": {"L0": [{
        "id": "given-table", "shape": [1, 2, 1, 4], "dtype": "fp32",
        "inputs": {"cos": {"dist": "given", "values": [[1, 0.5, 1, 0.5], [0, 1, 0, 1]]},
                   "sin": {"dist": "given", "values": [0, 0.5, 0, 0.5, 1, 0, 1, 0],
                           "shape": [2, 4]}}}]}}
    from verify.cases import case as cases
    path = write_cases(tmp_path, doc)
    case = cases.load_file(path)[0]
    made = inputs.make_inputs(case)
    assert made["cos"].tolist() == [[1, 0.5, 1, 0.5], [0, 1, 0, 1]]
    assert tuple(made["sin"].shape) == (2, 4) and made["sin"][1, 0] == 1
    doc["levels"]["L0"][0]["inputs"]["sin"]["shape"] = [3, 4]
    with pytest.raises(verify.CaseFileError, match=r"inputs.sin.shape"):
        cases.load_file(write_cases(tmp_path, doc))


CE_KERNELS = '''
import torch
import verify


def _ce(read_back_in_working_dtype):
    class CE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, weight, labels, ignore_index, reduction):
            lf = logits.float()
            keep = labels.long() != ignore_index
            lab = torch.where(keep, labels.long(), 0)
            lse = torch.logsumexp(lf, dim=-1)
            per = torch.where(keep, weight.float() * (lse - lf.gather(-1, lab[:, None])[:, 0]),
                              torch.zeros_like(lse))
            ctx.save_for_backward(logits, weight, lab, keep, lse)
            ctx.reduction = reduction
            return per.sum() if reduction == "sum" else per

        @staticmethod
        def backward(ctx, up):
            logits, weight, lab, keep, lse = ctx.saved_tensors
            p = torch.exp(logits.float() - lse[:, None])
            if read_back_in_working_dtype:   # Liger PR #1268: p stored in bf16, then - 1
                p = p.to(logits.dtype).float()
            rows = torch.arange(p.shape[0])
            p[rows, lab] -= 1.0
            scale = weight.float() * keep * (up.float() if ctx.reduction == "none" else up)
            grad = (p * scale[:, None]).to(logits.dtype)
            return grad, None, None, None, None

    def kernel(logits, weight, labels, *, ignore_index, reduction):
        return CE.apply(logits, weight, labels, ignore_index, reduction)
    return kernel


verify.kernel("fused_cross_entropy", backend="ce", name="fp32_grad")(_ce(False))
verify.kernel("fused_cross_entropy", backend="ce", name="pr1268_bf16_readback")(_ce(True))
'''


def test_a_true_class_gradient_read_back_in_low_precision_fails_confident_tokens(tmp_path):
    (tmp_path / "ce.py").write_text(CE_KERNELS)
    write_cases(tmp_path / "cases", {"op": "fused_cross_entropy", "levels": {
        "L0": [_builtin_case("fused_cross_entropy", "confident")]}})
    res = verify.run(level="L0", ops=["fused_cross_entropy"], backends=["ce"],
                     kernels=[str(tmp_path / "ce.py")], cases=str(tmp_path / "cases"),
                     reports=False)
    view = {(r["kernel"], r["dtype"], r["case_id"]): r for r in res.rows
            if r["output"] == "grad_logits[true_class]"}
    assert len(view) == 12
    for (kern, dtype, _), r in view.items():
        if kern == "fp32_grad":
            assert r["verdict"] == "PASS", r["reason"]
        elif dtype in ("bf16", "fp16"):
            assert r["verdict"] == "FAIL", r
    full = [r for r in res.rows if r["output"] == "grad_logits" and r["kernel"] != "fp32_grad"]
    assert all(r["verdict"] == "PASS" for r in full)  # the absolute criterion misses it


ARNB_ROUNDED_X = '''
import torch
import verify


@verify.kernel("add_rms_norm_bias", backend="hf")
def rounded_x(x1, x2, gamma, beta=None, *, epsilon):
    x = (x1.float() + x2.float()).to(x1.dtype)
    xf = x.float()
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = xf * rstd * gamma.float()
    if beta is not None:
        y = y + beta.float()
    return y.to(x1.dtype), rstd, x
'''


def test_normalising_the_rounded_sum_is_a_legitimate_implementation(tmp_path):
    (tmp_path / "arnb.py").write_text(ARNB_ROUNDED_X)
    res = verify.run(level="L0", ops=["add_rms_norm_bias"], backends=["hf"], dtypes=["bf16"],
                     kernels=[str(tmp_path / "arnb.py")], reports=False)
    assert res.counts["FAIL"] == 0 and res.counts["ERROR"] == 0, res.summary()
    variant = [r for r in res.rows if r.get("golden_variant")]
    assert variant and all(r["golden_variant"] == "x rounded to bf16" for r in variant)


CAPABLE = '''
import torch
import verify

verify.backend("capable", device="cpu", max_elements=10_000, note="a test backend",
               versions={"mylib": "1.2"})


@verify.kernel("gelu", backend="capable", dtypes=["fp32"], params={"approximate": ["tanh"]})
def gelu_tanh_fp32(x, *, approximate):
    return torch.nn.functional.gelu(x.float(), approximate="tanh").to(x.dtype)


@verify.kernel("clipped_swiglu", backend="capable", forward_only=True)
def swiglu_no_backward(gate_up, *, alpha, limit):
    with torch.no_grad():
        k = gate_up.shape[-1] // 2
        g = gate_up[..., :k].float().clamp(max=limit)
        u = gate_up[..., k:].float().clamp(min=-limit, max=limit)
        return (g * torch.sigmoid(alpha * g) * (u + 1)).to(gate_up.dtype)


@verify.kernel("rmsnorm_without_weight", backend="capable")
def rms_unsupported(x, *, eps):
    if x.dtype != torch.float32:
        raise verify.Unsupported("only fp32 inputs")
    return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
'''


def test_kernel_capabilities_make_skip_rows_not_errors(tmp_path):
    (tmp_path / "capable.py").write_text(CAPABLE)
    res = verify.run(level="L0", ops=["gelu", "clipped_swiglu", "rmsnorm_without_weight"],
                     backends=["capable"], kernels=[str(tmp_path / "capable.py")],
                     reports=False)
    rows = [r for r in res.rows if r["standard"] != "expect_error"]
    assert not [r for r in rows if r["verdict"] == "ERROR"], \
        [r["reason"] for r in rows if r["verdict"] == "ERROR"]
    gelu = [r for r in rows if r["op"] == "gelu"]
    assert {r["verdict"] for r in gelu if r["dtype"] == "fp32" and "tanh" in r["params"]} \
        == {"PASS"}
    assert all(r["verdict"] == "SKIP" for r in gelu if r["dtype"] != "fp32")
    swiglu = [r for r in rows if r["op"] == "clipped_swiglu"]
    assert {r["verdict"] for r in swiglu if r["output"] == "y"} == {"PASS"}
    grads = [r for r in swiglu if r["output"] == "grad_gate_up"]
    assert grads and all(r["verdict"] == "SKIP" and "forward-only" in r["reason"]
                         for r in grads)
    rms = [r for r in rows if r["op"] == "rmsnorm_without_weight" and r["dtype"] != "fp32"]
    assert rms and all(r["verdict"] == "SKIP" and "only fp32 inputs" in r["reason"]
                       for r in rms)
    from verify.specs import registry
    backend = registry.backend("capable")
    assert backend.max_elements == 10_000 and backend.versions() == {"mylib": "1.2"}


BF16_TRITON = '''
import torch
import triton
import triton.language as tl
import verify


@triton.jit
def _rope(x_ptr, c_ptr, s_ptr, o_ptr, D: tl.constexpr, HALF: tl.constexpr):
    row = tl.program_id(0)
    seq = tl.program_id(1)
    offs = tl.arange(0, HALF)
    base = row * D
    x1 = tl.load(x_ptr + base + offs)
    x2 = tl.load(x_ptr + base + HALF + offs)
    c = tl.load(c_ptr + seq * D + offs)
    s = tl.load(s_ptr + seq * D + offs)
    tl.store(o_ptr + base + offs, x1 * c - x2 * s)      # arithmetic in the input dtype
    tl.store(o_ptr + base + HALF + offs, x2 * c + x1 * s)


@verify.kernel("rope", backend="thirdparty", params={"layout": ["rotate_half"]})
def rope_in_input_dtype(x, cos, sin, *, layout):
    """A third-party-style Triton RoPE that computes in the input dtype."""
    s_len, heads, d = x.shape[-3], x.shape[-2], x.shape[-1]
    xc = x.contiguous()
    out = torch.empty_like(xc)
    rows = xc.numel() // d
    for r in range(rows):
        seq = (r // heads) % s_len
        _rope[(1, 1)](xc.view(-1)[r * d:], cos.contiguous()[seq:], sin.contiguous()[seq:],
                      out.view(-1)[r * d:], D=d, HALF=d // 2)
    return out
'''


def test_the_triton_interpreter_defects_are_named_on_the_rows_they_touch(tmp_path):
    from verify.running import triton_probe
    if not triton_probe.interpreted():
        pytest.skip("Triton runs compiled here: no interpreter to probe")
    pytest.importorskip("triton")
    found = triton_probe.probe()
    (tmp_path / "tri.py").write_text(BF16_TRITON)
    write_cases(tmp_path / "cases", {"op": "rope", "levels": {"L0": [{
        "id": "tiny", "shape": [1, 3, 2, 16], "dtype": ["fp32", "bf16"]}]}})
    res = verify.run(level="L0", ops=["rope"], backends=["thirdparty"], reports=False,
                     kernels=[str(tmp_path / "tri.py")], cases=str(tmp_path / "cases"))
    by_dtype = {r["dtype"]: r for r in res.rows}
    assert by_dtype["fp32"]["verdict"] == "PASS" and "interpreter" not in by_dtype["fp32"]["warning"]
    if found.get("bf16"):  # triton 3.9.0: bf16 arithmetic on bit patterns
        assert by_dtype["bf16"]["verdict"] == "FAIL"
        assert "Triton interpreter defect" in by_dtype["bf16"]["warning"]
        assert "bf16 arithmetic is wrong" in by_dtype["bf16"]["warning"]
    else:
        assert by_dtype["bf16"]["verdict"] == "PASS"


def test_reasons_show_enough_digits_to_see_why_they_failed():
    assert standards._pair(0.98995, 0.99) == ("0.9899", "0.99")
    assert standards._pair(0.989999, 0.99)[0] != "0.99"
    assert standards._pair(0.5, 0.99) == ("0.5", "0.99")
