"""Inputs keep the contract of real callers: solve_tril's A is strictly lower triangular
(a random upper part only in an explicit adversarial case), recompute_w_u's A comes in the
working dtype, as flash-linear-attention's pipeline passes it."""
import torch

import verify

KERNELS = '''
import torch, verify
from verify.goldens import gated_delta as gold

@verify.kernel("solve_tril", backend="fla_like", name="reads_upper_part", forward_only=True)
def solve_tril(A, cu_seqlens=None):
    """Like fla's merging 32/64-wide kernels: inverts I + the whole chunk block, trusting
    the documented contract that A is strictly lower triangular."""
    gold.check_solve_tril(A, cu_seqlens)
    out = torch.zeros(A.shape, dtype=torch.float32)
    bt = A.shape[-1]
    for b, s0, e0 in gold.segments(A.shape[0], A.shape[1], cu_seqlens):
        for s, e in gold.chunks(s0, e0, bt):
            m = A[b, s:e, :, :e - s].float().permute(1, 0, 2)
            inv = torch.linalg.inv(torch.eye(e - s) + m).permute(1, 0, 2)
            out[b, s:e, :, :e - s] = inv
    return out

@verify.kernel("recompute_w_u", backend="fla_like", name="one_dtype")
def recompute_w_u(k, v, beta, A, g=None, cu_seqlens=None):
    """fla's recompute_w_u_fwd takes A in k's dtype and says so."""
    if A.dtype != k.dtype:
        raise TypeError(f"A must be {k.dtype}, got {A.dtype}")
    from verify.kernels.torch import gated_delta as tk
    return tk.recompute_w_u(k, v, beta, A, g, cu_seqlens)
'''


def test_solve_tril_reads_only_real_inputs_except_in_the_adversarial_case(tmp_path):
    (tmp_path / "k.py").write_text(KERNELS)
    res = verify.run(level="L0", ops=["solve_tril"], backends=["fla_like"],
                     kernels=[str(tmp_path / "k.py")], reports=False)
    judged = [r for r in res.rows if r["standard"] != "expect_error"]
    failing = {r["case_id"].split("-fp32")[0] for r in judged if r["verdict"] in ("FAIL", "ERROR")}
    # strictly lower per chunk, chunks restarting at every sequence (varlen) as the kkt
    # output is: only the adversarial case shows the kernel reading the upper part
    assert failing == {"upper-part"}
    assert any(r["verdict"] == "PASS" and r["case_id"].startswith("blocks") for r in judged)
    doc = verify.op("solve_tril").golden_fn.__doc__
    assert "only A's strictly lower triangle is read" not in doc


def test_the_builtin_solve_tril_kernel_passes_the_adversarial_case():
    res = verify.run(level="L0", ops=["solve_tril"], backends=["torch"], reports=False)
    upper = [r for r in res.rows if r["case_id"].startswith("upper-part")]
    assert upper and {r["verdict"] for r in upper} == {"PASS"}


def test_recompute_w_u_takes_a_in_the_working_dtype(tmp_path):
    assert verify.op("recompute_w_u").input_dtype("A", "bf16") == torch.bfloat16
    (tmp_path / "k.py").write_text(KERNELS)
    res = verify.run(level="L0", ops=["recompute_w_u"], backends=["fla_like"],
                     kernels=[str(tmp_path / "k.py")], reports=False)
    judged = [r for r in res.rows if r["standard"] != "expect_error"]
    assert judged and not [r for r in judged if r["verdict"] == "ERROR"]
    assert {r["dtype"] for r in judged} >= {"bf16", "fp32"}
