"""Triton kernels of the optimizer family, softmax, and two planted bugs.

Element-wise kernels over flattened tensors, fp32 math, states fp32, the weight stored in
its own dtype. Outputs are written into copies of the inputs, as the real in-place
optimizer kernels do. Without Triton the kernels are still registered, so their rows SKIP
with the reason instead of vanishing.
"""
from __future__ import annotations

import torch

from verify.goldens import optimizer_checks as checks
from verify.specs.registry import kernel

from . import IMPORT_ERROR, block_size, triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _adamw(w_ptr, g_ptr, m_ptr, v_ptr, n, beta1, beta2, lr, wd, eps, bc1, bc2,
               EPS_INSIDE: tl.constexpr, TAIL_BUG: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < (n - 1 if TAIL_BUG else n)
        w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask)
        v = tl.load(v_ptr + offs, mask=mask)
        m_t = beta1 * m + (1.0 - beta1) * g
        v_t = beta2 * v + (1.0 - beta2) * g * g
        if EPS_INSIDE:
            denom = tl.sqrt(v_t / bc2 + eps)
        else:
            denom = tl.sqrt(v_t / bc2) + eps
        w_new = w - lr * ((m_t / bc1) / denom + wd * w)
        tl.store(w_ptr + offs, w_new.to(w_ptr.dtype.element_ty), mask=mask)
        tl.store(m_ptr + offs, m_t, mask=mask)
        tl.store(v_ptr + offs, v_t, mask=mask)

    @triton.jit
    def _rms_prop(var_ptr, ms_ptr, mom_ptr, g_ptr, n, lr, rho, momentum, eps,
                  BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        var = tl.load(var_ptr + offs, mask=mask)
        ms = tl.load(ms_ptr + offs, mask=mask)
        mom = tl.load(mom_ptr + offs, mask=mask)
        g = tl.load(g_ptr + offs, mask=mask)
        ms_new = ms + (g * g - ms) * (1.0 - rho)
        mom_new = mom * momentum + (g * lr) / tl.sqrt(ms_new + eps)
        tl.store(var_ptr + offs, var - mom_new, mask=mask)
        tl.store(ms_ptr + offs, ms_new, mask=mask)
        tl.store(mom_ptr + offs, mom_new, mask=mask)

    @triton.jit
    def _proximal(var_ptr, delta_ptr, alpha_ptr, l1_ptr, l2_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        var = tl.load(var_ptr + offs, mask=mask).to(tl.float32)
        delta = tl.load(delta_ptr + offs, mask=mask).to(tl.float32)
        a = tl.load(alpha_ptr).to(tl.float32)
        l1 = tl.load(l1_ptr).to(tl.float32)
        l2 = tl.load(l2_ptr).to(tl.float32)
        prox = var - a * delta
        sign = tl.where(prox > 0, 1.0, tl.where(prox < 0, -1.0, tl.where(prox == 0, 0.0, prox)))
        # tl.maximum drops NaN by default: NaN in must stay NaN out (TF semantics)
        shrunk = tl.maximum(tl.abs(prox) - a * l1, 0.0, propagate_nan=tl.PropagateNan.ALL)
        out = sign / (1.0 + a * l2) * shrunk
        tl.store(var_ptr + offs, out.to(var_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _sgd(w_ptr, g_ptr, buf_ptr, n, lr, momentum, dampening, wd,
             NESTEROV: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32) + wd * w
        buf = momentum * tl.load(buf_ptr + offs, mask=mask) + (1.0 - dampening) * g
        if NESTEROV:
            step = g + momentum * buf
        else:
            step = buf
        tl.store(w_ptr + offs, (w - lr * step).to(w_ptr.dtype.element_ty), mask=mask)
        tl.store(buf_ptr + offs, buf, mask=mask)

    @triton.jit
    def _adagrad(w_ptr, g_ptr, s_ptr, n, clr, wd, eps, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32) + wd * w
        s = tl.load(s_ptr + offs, mask=mask) + g * g
        tl.store(w_ptr + offs, (w - clr * g / (tl.sqrt(s) + eps)).to(w_ptr.dtype.element_ty),
                 mask=mask)
        tl.store(s_ptr + offs, s, mask=mask)

    @triton.jit
    def _lion(w_ptr, g_ptr, m_ptr, n, lr, beta1, beta2, wd, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask)
        c = beta1 * m + (1.0 - beta1) * g
        sign = tl.where(c > 0, 1.0, tl.where(c < 0, -1.0, 0.0))
        w_new = w * (1.0 - lr * wd) - lr * sign
        tl.store(w_ptr + offs, w_new.to(w_ptr.dtype.element_ty), mask=mask)
        tl.store(m_ptr + offs, beta2 * m + (1.0 - beta2) * g, mask=mask)

    @triton.jit
    def _softmax(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        y = e / tl.sum(e, axis=0)
        tl.store(y_ptr + row * cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _grid(n: int):
    return (max(1, triton.cdiv(n, block_size())),)


def _flat_copies(*tensors):
    """Contiguous copies the kernel updates in place, as the real optimizer kernels do."""
    return tuple(t.contiguous().clone() for t in tensors)


def _unavailable(*_, **__):
    raise RuntimeError(IMPORT_ERROR)


def triton_kernel(op: str, backend: str = "triton", name: str | None = None,
                  forward_only: bool = False):
    def wrap(fn):
        return kernel(op, backend=backend, name=name or fn.__name__,
                      forward_only=forward_only)(
            fn if triton is not None else _unavailable)
    return wrap


def _adamw_launch(weight, grad, m, v, beta1, beta2, lr, weight_decay, eps, step,
                  eps_inside=False, tail_bug=False):
    checks.check_adam_w_v2(weight, grad, m, v, step=step)
    w, m_, v_ = _flat_copies(weight, m, v)
    n = w.numel()
    _adamw[_grid(n)](w, grad.contiguous(), m_, v_, n, beta1, beta2, lr, weight_decay, eps,
                     1.0 - beta1 ** step, 1.0 - beta2 ** step, EPS_INSIDE=eps_inside,
                     TAIL_BUG=tail_bug, BLOCK=block_size())
    return w, m_, v_


@triton_kernel("apply_adam_w_v2")
def apply_adam_w_v2(weight, grad, m, v, *, beta1=0.9, beta2=0.999, lr=1e-3,
                    weight_decay=0.01, eps=1e-8, step=1):
    return _adamw_launch(weight, grad, m, v, beta1, beta2, lr, weight_decay, eps, step)


@triton_kernel("apply_rms_prop")
def apply_rms_prop(var, ms, mom, grad, *, lr=0.001, rho=0.9, momentum=0.9, epsilon=1e-7):
    checks.check_rms_prop(var, ms, mom, grad)
    var_, ms_, mom_ = _flat_copies(var, ms, mom)
    n = var_.numel()
    _rms_prop[_grid(n)](var_, ms_, mom_, grad.contiguous(), n, lr, rho, momentum, epsilon,
                        BLOCK=block_size())
    return var_, ms_, mom_


@triton_kernel("apply_proximal_gradient_descent")
def apply_proximal_gradient_descent(var, alpha, l1, l2, delta):
    checks.check_proximal_gd(var, alpha, l1, l2, delta)
    (out,) = _flat_copies(var)
    n = out.numel()
    if n:
        _proximal[_grid(n)](out, delta.contiguous(), alpha.reshape(1), l1.reshape(1),
                            l2.reshape(1), n, BLOCK=block_size())
    return out


@triton_kernel("sgd_momentum")
def sgd_momentum(weight, grad, momentum_buffer, *, lr=0.01, momentum=0.9, dampening=0.0,
                 weight_decay=0.0, nesterov=False):
    checks.check_sgd_momentum(weight, grad, momentum_buffer)
    w, buf = _flat_copies(weight, momentum_buffer)
    n = w.numel()
    _sgd[_grid(n)](w, grad.contiguous(), buf, n, lr, momentum, dampening, weight_decay,
                   NESTEROV=bool(nesterov), BLOCK=block_size())
    return w, buf


@triton_kernel("adagrad")
def adagrad(weight, grad, state_sum, *, lr=0.01, lr_decay=0.0, weight_decay=0.0, eps=1e-10,
            step=1):
    checks.check_adagrad(weight, grad, state_sum, step=step)
    w, s = _flat_copies(weight, state_sum)
    n = w.numel()
    _adagrad[_grid(n)](w, grad.contiguous(), s, n, lr / (1.0 + (step - 1) * lr_decay),
                       weight_decay, eps, BLOCK=block_size())
    return w, s


@triton_kernel("lion")
def lion(weight, grad, exp_avg, *, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0):
    checks.check_lion(weight, grad, exp_avg)
    w, m = _flat_copies(weight, exp_avg)
    n = w.numel()
    _lion[_grid(n)](w, grad.contiguous(), m, n, lr, beta1, beta2, weight_decay,
                    BLOCK=block_size())
    return w, m


@triton_kernel("softmax", forward_only=True)
def softmax(x):
    cols = x.shape[-1]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // max(cols, 1)
    if rows and cols:
        _softmax[(rows,)](xc, y, cols, BLOCK=triton.next_power_of_2(cols))
    return y


# -- planted bugs: they must FAIL ------------------------------------------------------
@triton_kernel("apply_adam_w_v2", backend="mutants", name="triton_tail_mask_off_by_one")
def triton_tail_mask_off_by_one(weight, grad, m, v, *, beta1=0.9, beta2=0.999, lr=1e-3,
                                weight_decay=0.01, eps=1e-8, step=1):
    """Triton AdamW whose tail mask is offs < n - 1: the last element is never updated."""
    return _adamw_launch(weight, grad, m, v, beta1, beta2, lr, weight_decay, eps, step,
                         tail_bug=True)


@triton_kernel("apply_adam_w_v2", backend="mutants", name="triton_eps_inside_sqrt")
def triton_eps_inside_sqrt(weight, grad, m, v, *, beta1=0.9, beta2=0.999, lr=1e-3,
                           weight_decay=0.01, eps=1e-8, step=1):
    """Triton AdamW with eps inside the sqrt."""
    return _adamw_launch(weight, grad, m, v, beta1, beta2, lr, weight_decay, eps, step,
                         eps_inside=True)
