"""float64 goldens of the optimizer-update family (ops.md section A) and their declarations.

Every golden takes float64 CPU tensors (the kernel's inputs, already rounded to the
working dtype, then upcast) and returns float64 tensors in declared order. Python float
params are used as float64 values throughout.
"""
from __future__ import annotations

import math

import torch
from numba.extending import register_jitable

from verify.specs.registry import InputSpec, OutputSpec, declare_op

from . import optimizer_checks as checks
from .chunked import elementwise, row_chunks, sign, sqrt, squared_norm

F32 = "fp32"
_NONNEG_STATE = {"dist": "uniform", "low": 0.0, "high": 0.01}
_MOMENT = {"dist": "normal", "mean": 0.0, "std": 0.1}


def _grad() -> InputSpec:
    return InputSpec("grad", per_step=True)


def _adam_direction(w, g, m, v, beta1, beta2, eps, weight_decay, step):
    """Adam moments and the decoupled-decay direction m_hat / (sqrt(v_hat) + eps) + wd*w,
    shared by AdamW and LAMB; bias corrections are host-side scalars 1 - beta**step."""
    return _adam_terms(w, g, m, v, beta1, beta2, eps, weight_decay,
                       1.0 - beta1 ** step, 1.0 - beta2 ** step)


@register_jitable(inline="always")  # also callable from the compiled (fused) formula
def _adam_terms(w, g, m, v, beta1, beta2, eps, weight_decay, bc1, bc2):
    m_t = beta1 * m + (1.0 - beta1) * g
    v_t = beta2 * v + (1.0 - beta2) * g * g
    return (m_t / bc1) / (sqrt(v_t / bc2) + eps) + weight_decay * w, m_t, v_t


def _adam_w_one(w, g, m, v, p):
    beta1, beta2, lr, weight_decay, eps, bc1, bc2 = p
    update, m_t, v_t = _adam_terms(w, g, m, v, beta1, beta2, eps, weight_decay, bc1, bc2)
    return w - lr * update, m_t, v_t


# -- AdamW -----------------------------------------------------------------------------
@declare_op(
    "apply_adam_w_v2",
    inputs=[InputSpec("weight"), _grad(), InputSpec("m", F32, dist=_MOMENT),
            InputSpec("v", F32, dist=_NONNEG_STATE)],
    params=dict(beta1=0.9, beta2=0.999, lr=1e-3, weight_decay=0.01, eps=1e-8, step=1),
    outputs=[OutputSpec("w_new"), OutputSpec("m_new", F32), OutputSpec("v_new", F32)],
    dtypes=["fp32", "bf16"],
    ranks=(2, 2),
    standard={"name": "allclose"},
    validate=checks.check_adam_w_v2,
    feedback={"weight": "w_new", "m": "m_new", "v": "v_new"},
    step_param="step",
    aliases=("adamw", "adam_w"),
    description="ApplyAdamWV2: AdamW with decoupled weight decay, eps outside the sqrt "
                "(Loshchilov & Hutter 2019).",
)
def apply_adam_w_v2(weight, grad, m, v, *, beta1, beta2, lr, weight_decay, eps, step):
    """AdamW step: w - lr * (m_hat / (sqrt(v_hat) + eps) + wd * w)."""
    params = (beta1, beta2, lr, weight_decay, eps, 1.0 - beta1 ** step, 1.0 - beta2 ** step)
    return elementwise(_adam_w_one, weight, grad, m, v, n_out=3, params=params)


# -- RMSProp ---------------------------------------------------------------------------
@declare_op(
    "apply_rms_prop",
    inputs=[InputSpec("var"), InputSpec("ms", dist=_NONNEG_STATE),
            InputSpec("mom", dist=_MOMENT), _grad()],
    params=dict(lr=0.001, rho=0.9, momentum=0.9, epsilon=1e-7),
    outputs=[OutputSpec("var_new"), OutputSpec("ms_new"), OutputSpec("mom_new")],
    dtypes=["fp32"],
    ranks=(2, 2),
    standard={"name": "allclose", "atol": 1e-5, "rtol": 1e-5},
    validate=checks.check_rms_prop,
    feedback={"var": "var_new", "ms": "ms_new", "mom": "mom_new"},
    aliases=("rmsprop",),
    description="ApplyRMSProp (TensorFlow ApplyRMSProp semantics): eps inside the sqrt.",
)
def apply_rms_prop(var, ms, mom, grad, *, lr, rho, momentum, epsilon):
    return elementwise(_rms_prop_one, var, ms, mom, grad, n_out=3,
                       params=(lr, rho, momentum, epsilon))


def _rms_prop_one(var_, ms_, mom_, g, p):
    lr, rho, momentum, epsilon = p
    ms_new = ms_ + (g * g - ms_) * (1.0 - rho)
    mom_new = mom_ * momentum + (g * lr) / sqrt(ms_new + epsilon)
    return var_ - mom_new, ms_new, mom_new


# -- Proximal gradient descent ---------------------------------------------------------
def _scalar_shape(_main):
    return ()


def _const(value):
    return {"dist": "constant", "value": value}


@declare_op(
    "apply_proximal_gradient_descent",
    inputs=[InputSpec("var"), InputSpec("alpha", shape=_scalar_shape, dist=_const(0.01)),
            InputSpec("l1", shape=_scalar_shape, dist=_const(0.001)),
            InputSpec("l2", shape=_scalar_shape, dist=_const(0.01)),
            InputSpec("delta", per_step=True)],
    params={},
    outputs=[OutputSpec("var_new")],
    dtypes=["fp32", "fp16"],
    standard={"name": "cann_v1"},
    validate=checks.check_proximal_gd,
    ranks=(1, 8),
    feedback={"var": "var_new"},
    aliases=("proximal_gd", "proximal"),
    description="TensorFlow ApplyProximalGradientDescent: soft-threshold after a "
                "gradient step, then shrink by 1 + alpha*l2.",
)
def apply_proximal_gradient_descent(var, alpha, l1, l2, delta):
    """prox = var - alpha*delta; sign(prox)/(1+alpha*l2) * max(|prox| - alpha*l1, 0).
    sign(0) = 0 as in TensorFlow; an empty var gives an empty output."""
    a, l1_, l2_ = (float(s.reshape(())) for s in (alpha, l1, l2))

    def one(var_, delta_):
        prox = var_ - a * delta_
        return torch.sign(prox) / (1.0 + a * l2_) * torch.clamp(prox.abs() - a * l1_, min=0.0)

    return elementwise(one, var, delta, n_out=1)


# -- SGD with momentum -----------------------------------------------------------------
@declare_op(
    "sgd_momentum",
    inputs=[InputSpec("weight"), _grad(), InputSpec("momentum_buffer", F32, dist=_MOMENT)],
    params=dict(lr=0.01, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False),
    outputs=[OutputSpec("w_new"), OutputSpec("buf_new", F32)],
    dtypes=["fp32", "bf16", "fp16"],
    ranks=(2, 2),
    standard={"name": "allclose"},
    validate=checks.check_sgd_momentum,
    feedback={"weight": "w_new", "momentum_buffer": "buf_new"},
    aliases=("sgd",),
    description="SGD with momentum, PyTorch torch.optim.SGD semantics with an existing "
                "momentum buffer: g += wd*w; buf = mu*buf + (1-dampening)*g.",
)
def sgd_momentum(weight, grad, momentum_buffer, *, lr, momentum, dampening, weight_decay,
                 nesterov):
    return elementwise(_sgd_momentum_one, weight, grad, momentum_buffer, n_out=2,
                       params=(lr, momentum, dampening, weight_decay, float(bool(nesterov))))


def _sgd_momentum_one(w, g, buf, p):
    lr, momentum, dampening, weight_decay, nesterov = p
    g = g + weight_decay * w
    buf_new = momentum * buf + (1.0 - dampening) * g
    step_dir = g + momentum * buf_new if nesterov else buf_new
    return w - lr * step_dir, buf_new


# -- AdaGrad ---------------------------------------------------------------------------
@declare_op(
    "adagrad",
    inputs=[InputSpec("weight"), _grad(), InputSpec("state_sum", F32, dist=_NONNEG_STATE)],
    params=dict(lr=0.01, lr_decay=0.0, weight_decay=0.0, eps=1e-10, step=1),
    outputs=[OutputSpec("w_new"), OutputSpec("sum_new", F32)],
    dtypes=["fp32", "bf16", "fp16"],
    ranks=(2, 2),
    standard={"name": "allclose"},
    validate=checks.check_adagrad,
    feedback={"weight": "w_new", "state_sum": "sum_new"},
    step_param="step",
    description="AdaGrad, PyTorch torch.optim.Adagrad semantics: clr = lr/(1+(step-1)*"
                "lr_decay); sum += g^2; w -= clr*g/(sqrt(sum)+eps).",
)
def adagrad(weight, grad, state_sum, *, lr, lr_decay, weight_decay, eps, step):
    clr = lr / (1.0 + (step - 1) * lr_decay)
    return elementwise(_adagrad_one, weight, grad, state_sum, n_out=2,
                       params=(clr, weight_decay, eps))


def _adagrad_one(w, g, s, p):
    clr, weight_decay, eps = p
    g = g + weight_decay * w
    s_new = s + g * g
    return w - clr * g / (sqrt(s_new) + eps), s_new


# -- Lion ------------------------------------------------------------------------------
@declare_op(
    "lion",
    inputs=[InputSpec("weight"), _grad(), InputSpec("exp_avg", F32, dist=_MOMENT)],
    params=dict(lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0),
    outputs=[OutputSpec("w_new"), OutputSpec("exp_avg_new", F32)],
    dtypes=["fp32", "bf16", "fp16"],
    ranks=(2, 2),
    standard={"name": "allclose"},
    validate=checks.check_lion,
    feedback={"weight": "w_new", "exp_avg": "exp_avg_new"},
    description="Lion (Chen et al. 2023): w = w*(1-lr*wd) - lr*sign(b1*m + (1-b1)*g); "
                "m = b2*m + (1-b2)*g after the update; sign(0) = 0.",
)
def lion(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    return elementwise(_lion_one, weight, grad, exp_avg, n_out=2,
                       params=(lr, beta1, beta2, weight_decay))


def _lion_one(w, g, m, p):
    lr, beta1, beta2, weight_decay = p
    direction = sign(beta1 * m + (1.0 - beta1) * g)
    return w * (1.0 - lr * weight_decay) - lr * direction, beta2 * m + (1.0 - beta2) * g


# -- LAMB ------------------------------------------------------------------------------
@declare_op(
    "lamb",
    inputs=[InputSpec("weight"), _grad(), InputSpec("m", F32, dist=_MOMENT),
            InputSpec("v", F32, dist=_NONNEG_STATE)],
    params=dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, step=1),
    outputs=[OutputSpec("w_new"), OutputSpec("m_new", F32), OutputSpec("v_new", F32)],
    dtypes=["fp32", "bf16", "fp16"],
    ranks=(2, 2),
    standard={"name": "allclose"},
    validate=checks.check_lamb,
    feedback={"weight": "w_new", "m": "m_new", "v": "v_new"},
    step_param="step",
    description="LAMB (You et al. 2020, Algorithm 2, with Adam bias correction): the Adam "
                "step r = m_hat/(sqrt(v_hat)+eps) + wd*w scaled by the layer-wise trust "
                "ratio ||w|| / ||r|| over the whole tensor (1 when either norm is 0).",
)
def lamb(weight, grad, m, v, *, lr, beta1, beta2, eps, weight_decay, step):
    def moments(w, g, m_, v_):
        return _adam_direction(w, g, m_, v_, beta1, beta2, eps, weight_decay, step)

    r, m_new, v_new = elementwise(moments, weight, grad, m, v, n_out=3)
    flat_w, flat_r = weight.reshape(-1), r.view(-1)
    n = flat_w.numel()
    w_norm = math.sqrt(squared_norm(lambda a, b: flat_w[a:b], n, 1))
    r_norm = math.sqrt(squared_norm(lambda a, b: flat_r[a:b], n, 1))
    trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
    for a, b in row_chunks(n, 1):  # w_new written over r, slice by slice
        flat_r[a:b] = flat_w[a:b] - (lr * trust) * flat_r[a:b]
    return r, m_new, v_new


# -- AdaFactor -------------------------------------------------------------------------
def _rows(main):
    return tuple(main[:-1])


def _cols(main):
    return tuple(main[-1:])


@declare_op(
    "adafactor",
    inputs=[InputSpec("weight"), _grad(),
            InputSpec("row_var", F32, shape=_rows, dist=_NONNEG_STATE),
            InputSpec("col_var", F32, shape=_cols, dist=_NONNEG_STATE)],
    params=dict(lr=1e-2, beta2_decay=-0.8, eps1=2.0 ** -23, eps2=1e-3, d=1.0,
                weight_decay=0.0, step=1),
    outputs=[OutputSpec("w_new"), OutputSpec("row_var_new", F32),
             OutputSpec("col_var_new", F32)],
    dtypes=["fp32", "bf16", "fp16"],
    ranks=(2, 2),
    standard={"name": "allclose"},
    validate=checks.check_adafactor,
    feedback={"weight": "w_new", "row_var": "row_var_new", "col_var": "col_var_new"},
    step_param="step",
    description="AdaFactor (Shazeer & Stern 2018), PyTorch torch.optim.Adafactor "
                "semantics for a 2-D weight: factored row / column second moments, rank-1 "
                "rebuild, update clipping by RMS / d, relative step size, decoupled decay. "
                "eps1 defaults to the fp32 machine epsilon (torch's default for fp32).",
)
def adafactor(weight, grad, row_var, col_var, *, lr, beta2_decay, eps1, eps2, d,
              weight_decay, step):
    rows, cols = weight.shape
    one_minus_beta2 = float(step) ** beta2_decay
    rho = min(lr, 1.0 / math.sqrt(step))
    w_rms = math.sqrt(squared_norm(lambda a, b: weight[a:b], rows, cols) / weight.numel())
    alpha = max(eps2, w_rms) * rho

    row_mean = torch.empty(rows, dtype=torch.float64)
    col_sum = torch.zeros(cols, dtype=torch.float64)
    for a, b in row_chunks(rows, cols):
        g2 = grad[a:b] * grad[a:b]
        row_mean[a:b] = g2.mean(dim=1)
        col_sum += g2.sum(dim=0)
    # the convex combination of two non-negative terms: no cancellation, where the lerp
    # form v + (m - v) * c loses m entirely once v is huge (verify hunt found it: a
    # state of 1.7e38 at step 1, c = 1, gave 0 instead of m)
    row_new = row_var * (1.0 - one_minus_beta2) + row_mean * one_minus_beta2
    col_new = col_var * (1.0 - one_minus_beta2) + (col_sum / rows) * one_minus_beta2
    row_scale = max(float(row_new.mean()), eps1)

    w_new = torch.empty_like(weight)  # holds the raw update first
    for a, b in row_chunks(rows, cols):
        var_est = torch.outer(row_new[a:b], col_new) / row_scale
        w_new[a:b] = grad[a:b] * torch.rsqrt(torch.clamp(var_est, min=eps1 * eps1))
    u_rms = math.sqrt(squared_norm(lambda a, b: w_new[a:b], rows, cols) / weight.numel())
    scale = alpha / max(1.0, u_rms / d)
    decay = 1.0 - lr * weight_decay
    for a, b in row_chunks(rows, cols):
        w_new[a:b] = weight[a:b] * decay - scale * w_new[a:b]
    return w_new, row_new, col_new
