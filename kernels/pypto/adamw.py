"""ApplyAdamWV2 in PyPTO, as the source documents describe it: two pypto.loop levels over
M and K, valid_shape tails, fp32 math (bf16 weight and grad cast up, the weight cast back),
three assembles. Built per shape and dtype: the tile sizes and loop counts are constants
of the kernel. The bugs flags plant the two defects the tests must catch.

No `from __future__ import annotations` here: PyPTO's parser reads the tensor annotations.
"""

import pypto

F32 = pypto.DT_FP32
DTYPES = {"fp32": pypto.DT_FP32, "bf16": pypto.DT_BF16}


def verified_jit(run_mode):
    """pypto.frontend.jit with pass verification on (the CPU evaluator needs it)."""
    return pypto.frontend.jit(runtime_options={"run_mode": run_mode},
                              verify_options={"enable_pass_verify": True,
                                              "pass_verify_pass_filter": []})


def tiles(m: int, k: int) -> tuple[int, int]:
    """DEFAULT tile config of the seed (M tile 32, K tile 1024), clipped to the shape."""
    return min(32, m), min(1024, k)


def build(M, K, dtype, beta1, beta2, lr, weight_decay, eps, step, run_mode,
          bug=None):
    DT = DTYPES[dtype]
    TM, TK = tiles(M, K)
    bc1, bc2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
    low = dtype != "fp32"
    bf16_math = low and bug == "missing_cast"  # the cast up to fp32 left out: bf16 math
    cast_up = low and not bf16_math
    v_row = 0 if bug == "wrong_assemble_offset" else 1  # v assembled without its M offset

    @verified_jit(run_mode)
    def apply_adam_w_v2(w: pypto.Tensor((M, K), DT), g: pypto.Tensor((M, K), DT),
                        m: pypto.Tensor((M, K), F32), v: pypto.Tensor((M, K), F32),
                        w_out: pypto.Tensor((M, K), DT), m_out: pypto.Tensor((M, K), F32),
                        v_out: pypto.Tensor((M, K), F32)):
        pypto.set_vec_tile_shapes(32, 512)
        for mi in pypto.loop((M + TM - 1) // TM):
            for ki in pypto.loop((K + TK - 1) // TK):
                off = [mi * TM, ki * TK]
                valid = [(M - mi * TM).min(TM), (K - ki * TK).min(TK)]
                wt = pypto.view(w, [TM, TK], off, valid_shape=valid)
                gt = pypto.view(g, [TM, TK], off, valid_shape=valid)
                mt = pypto.view(m, [TM, TK], off, valid_shape=valid)
                vt = pypto.view(v, [TM, TK], off, valid_shape=valid)
                # plain ifs on constants: PyPTO's parser mishandles if / elif chains
                if cast_up:
                    wt = pypto.cast(wt, F32)
                    gt = pypto.cast(gt, F32)
                if bf16_math:
                    mt = pypto.cast(mt, DT)
                    vt = pypto.cast(vt, DT)
                m_new = pypto.add(pypto.mul(mt, beta1), pypto.mul(gt, 1.0 - beta1))
                v_new = pypto.add(pypto.mul(vt, beta2), pypto.mul(pypto.mul(gt, gt), 1.0 - beta2))
                denom = pypto.add(pypto.sqrt(pypto.div(v_new, bc2)), eps)
                update = pypto.add(pypto.div(pypto.div(m_new, bc1), denom),
                                   pypto.mul(wt, weight_decay))
                w_new = pypto.sub(wt, pypto.mul(update, lr))
                if cast_up:
                    w_new = pypto.cast(w_new, DT)
                if bf16_math:
                    m_new = pypto.cast(m_new, F32)
                    v_new = pypto.cast(v_new, F32)
                pypto.assemble(w_new, off, w_out)
                pypto.assemble(m_new, off, m_out)
                pypto.assemble(v_new, [mi * TM * v_row, ki * TK], v_out)

    return apply_adam_w_v2
