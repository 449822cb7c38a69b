"""ApplyRMSProp and ApplyProximalGradientDescent in PyPTO: the same tiling as AdamW (two
pypto.loop levels over rows and columns, valid_shape tails, one assemble per output).

No `from __future__ import annotations` here: PyPTO's parser reads the tensor annotations.
"""
import pypto

from .adamw import tiles, verified_jit

F32 = pypto.DT_FP32
DTYPES = {"fp32": pypto.DT_FP32, "fp16": pypto.DT_FP16}


def build_rms_prop(M, K, lr, rho, momentum, epsilon, run_mode):
    TM, TK = tiles(M, K)

    @verified_jit(run_mode)
    def apply_rms_prop(var: pypto.Tensor((M, K), F32), ms: pypto.Tensor((M, K), F32),
                       mom: pypto.Tensor((M, K), F32), grad: pypto.Tensor((M, K), F32),
                       var_out: pypto.Tensor((M, K), F32), ms_out: pypto.Tensor((M, K), F32),
                       mom_out: pypto.Tensor((M, K), F32)):
        pypto.set_vec_tile_shapes(32, 512)
        for mi in pypto.loop((M + TM - 1) // TM):
            for ki in pypto.loop((K + TK - 1) // TK):
                off = [mi * TM, ki * TK]
                valid = [(M - mi * TM).min(TM), (K - ki * TK).min(TK)]
                vt = pypto.view(var, [TM, TK], off, valid_shape=valid)
                st = pypto.view(ms, [TM, TK], off, valid_shape=valid)
                mt = pypto.view(mom, [TM, TK], off, valid_shape=valid)
                gt = pypto.view(grad, [TM, TK], off, valid_shape=valid)
                ms_new = pypto.add(st, pypto.mul(pypto.sub(pypto.mul(gt, gt), st), 1.0 - rho))
                mom_new = pypto.add(pypto.mul(mt, momentum),
                                    pypto.div(pypto.mul(gt, lr),
                                              pypto.sqrt(pypto.add(ms_new, epsilon))))
                pypto.assemble(pypto.sub(vt, mom_new), off, var_out)
                pypto.assemble(ms_new, off, ms_out)
                pypto.assemble(mom_new, off, mom_out)

    return apply_rms_prop


def build_proximal(M, K, dtype, alpha, l1, l2, run_mode):
    DT = DTYPES[dtype]
    TM, TK = tiles(M, K)
    low = dtype != "fp32"
    shrink = 1.0 / (1.0 + alpha * l2)

    @verified_jit(run_mode)
    def apply_proximal_gradient_descent(var: pypto.Tensor((M, K), DT),
                                        delta: pypto.Tensor((M, K), DT),
                                        out: pypto.Tensor((M, K), DT)):
        pypto.set_vec_tile_shapes(32, 512)
        for mi in pypto.loop((M + TM - 1) // TM):
            for ki in pypto.loop((K + TK - 1) // TK):
                off = [mi * TM, ki * TK]
                valid = [(M - mi * TM).min(TM), (K - ki * TK).min(TK)]
                vt = pypto.view(var, [TM, TK], off, valid_shape=valid)
                dt = pypto.view(delta, [TM, TK], off, valid_shape=valid)
                if low:
                    vt = pypto.cast(vt, F32)
                    dt = pypto.cast(dt, F32)
                prox = pypto.sub(vt, pypto.mul(dt, alpha))
                kept = pypto.relu(pypto.sub(pypto.abs(prox), alpha * l1))
                res = pypto.mul(pypto.mul(pypto.sign(prox), kept), shrink)
                if low:
                    res = pypto.cast(res, DT)
                pypto.assemble(res, off, out)

    return apply_proximal_gradient_descent
