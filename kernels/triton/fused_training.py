"""Triton kernels of two fused training ops, forward and a separate backward kernel each
(registered with @backward_kernel), the way the MindSpeed Triton ops ship them:
clipped_swiglu and rmsnorm_without_weight. fp32 math, results in the inputs' dtypes.
Without Triton the kernels are still registered, so their rows SKIP with the reason."""
from __future__ import annotations

import torch

from verify.goldens import fused_training as gold
from verify.specs.registry import backward_kernel, kernel

from . import IMPORT_ERROR, block_size, triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _swiglu_fwd(gu_ptr, y_ptr, k, alpha, limit, BLOCK: tl.constexpr):
        row, blk = tl.program_id(0), tl.program_id(1)
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < k
        a = tl.load(gu_ptr + row * 2 * k + offs, mask=mask).to(tl.float32)
        u = tl.load(gu_ptr + row * 2 * k + k + offs, mask=mask).to(tl.float32)
        g = tl.minimum(a, limit)
        uc = tl.minimum(tl.maximum(u, -limit), limit)
        y = g * tl.sigmoid(alpha * g) * (uc + 1.0)
        tl.store(y_ptr + row * k + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _swiglu_bwd(gu_ptr, dy_ptr, dgu_ptr, k, alpha, limit, ALPHA_IN_GRAD: tl.constexpr,
                    BLOCK: tl.constexpr):
        row, blk = tl.program_id(0), tl.program_id(1)
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < k
        a = tl.load(gu_ptr + row * 2 * k + offs, mask=mask).to(tl.float32)
        u = tl.load(gu_ptr + row * 2 * k + k + offs, mask=mask).to(tl.float32)
        dy = tl.load(dy_ptr + row * k + offs, mask=mask).to(tl.float32)
        g = tl.minimum(a, limit)
        uc = tl.minimum(tl.maximum(u, -limit), limit)
        s = tl.sigmoid(alpha * g)
        if ALPHA_IN_GRAD:
            dsilu = s + alpha * g * s * (1.0 - s)
        else:
            dsilu = s + g * s * (1.0 - s)
        # clamp passes the gradient where the input lies inside its bounds (inclusive)
        da = tl.where(a <= limit, dy * (uc + 1.0) * dsilu, 0.0)
        du = tl.where((u >= -limit) & (u <= limit), dy * g * s, 0.0)
        out_ty = dgu_ptr.dtype.element_ty
        tl.store(dgu_ptr + row * 2 * k + offs, da.to(out_ty), mask=mask)
        tl.store(dgu_ptr + row * 2 * k + k + offs, du.to(out_ty), mask=mask)

    @triton.jit
    def _rstd_fwd(x_ptr, r_ptr, d, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * d + offs, mask=offs < d, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / d + eps)
        tl.store(r_ptr + row, r.to(r_ptr.dtype.element_ty))

    @triton.jit
    def _rstd_bwd(x_ptr, dr_ptr, dx_ptr, d, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < d
        x = tl.load(x_ptr + row * d + offs, mask=mask, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / d + eps)
        dr = tl.load(dr_ptr + row).to(tl.float32)
        dx = -dr * r * r * r * x / d
        tl.store(dx_ptr + row * d + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _need_triton():
    if triton is None:
        raise RuntimeError(IMPORT_ERROR)


def _rows(t: torch.Tensor, width: int) -> int:
    return t.numel() // width if width else 0


# -- clipped_swiglu ----------------------------------------------------------------------
@kernel("clipped_swiglu", backend="triton")
def clipped_swiglu(gate_up, *, alpha=1.702, limit=7.0):
    """One program per (row, block of K): gate and up loaded side by side."""
    _need_triton()
    gold._check_clipped_swiglu(gate_up, alpha, limit)
    gu = gate_up.contiguous()
    k = gu.shape[-1] // 2
    y = torch.empty(*gu.shape[:-1], k, dtype=gu.dtype, device=gu.device)
    rows, blk = _rows(gu, 2 * k), min(block_size(), triton.next_power_of_2(max(k, 1)))
    if rows and k:
        _swiglu_fwd[(rows, triton.cdiv(k, blk))](gu, y, k, float(alpha), float(limit), BLOCK=blk)
    return y


def swiglu_backward(gate_up, grad_y, alpha, limit, alpha_in_grad=True):
    _need_triton()
    gu, dy = gate_up.contiguous(), grad_y.contiguous()
    k = gu.shape[-1] // 2
    dgu = torch.empty_like(gu)
    rows, blk = _rows(gu, 2 * k), min(block_size(), triton.next_power_of_2(max(k, 1)))
    if rows and k:
        _swiglu_bwd[(rows, triton.cdiv(k, blk))](gu, dy, dgu, k, float(alpha), float(limit),
                                                 ALPHA_IN_GRAD=alpha_in_grad, BLOCK=blk)
    return dgu


@backward_kernel("clipped_swiglu", backend="triton")
def clipped_swiglu_backward(gate_up, *, grad_y, alpha=1.702, limit=7.0):
    """d gate_up from d y: the SwiGLU derivative where the clamps pass it, 0 elsewhere."""
    return (swiglu_backward(gate_up, grad_y, alpha, limit),)


@kernel("clipped_swiglu", backend="mutants", name="triton_swiglu_grad_without_alpha")
def triton_swiglu_grad_without_alpha(gate_up, *, alpha=1.702, limit=7.0):
    """Planted Triton backward bug: d silu(alpha g)/dg written without the inner alpha."""
    return clipped_swiglu(gate_up, alpha=alpha, limit=limit)


@backward_kernel("clipped_swiglu", backend="mutants", name="triton_swiglu_grad_without_alpha")
def _triton_swiglu_grad_without_alpha_bwd(gate_up, *, grad_y, alpha=1.702, limit=7.0):
    return (swiglu_backward(gate_up, grad_y, alpha, limit, alpha_in_grad=False),)


# -- rmsnorm_without_weight --------------------------------------------------------------
@kernel("rmsnorm_without_weight", backend="triton")
def rmsnorm_without_weight(x, *, eps=1e-6):
    """One program per row, the whole row in one block."""
    _need_triton()
    xc = x.contiguous()
    d = xc.shape[-1]
    r = torch.empty(*xc.shape[:-1], 1, dtype=x.dtype, device=x.device)
    rows = _rows(xc, d)
    if rows and d:
        _rstd_fwd[(rows,)](xc, r, d, float(eps), BLOCK=triton.next_power_of_2(d))
    return r


@backward_kernel("rmsnorm_without_weight", backend="triton")
def rmsnorm_without_weight_backward(x, *, grad_rstd, eps=1e-6):
    """dx = -d rstd * rstd^3 * x / D, rstd recomputed per row."""
    _need_triton()
    xc, dr = x.contiguous(), grad_rstd.contiguous()
    d = xc.shape[-1]
    dx = torch.empty_like(xc)
    rows = _rows(xc, d)
    if rows and d:
        _rstd_bwd[(rows,)](xc, dr, dx, d, float(eps), BLOCK=triton.next_power_of_2(d))
    return (dx,)
