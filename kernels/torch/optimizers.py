"""Working-precision torch kernels of the optimizer family.

Each follows the mixed-precision contract of ops.md section A: weight / grad are cast up
to fp32, all math is fp32, states stay fp32, the weight is cast back to its dtype. They
validate their inputs like the real wrappers and run on whatever device the tensors are on.
"""
from __future__ import annotations

import torch

from verify.goldens import optimizer_checks as checks
from verify.specs.registry import kernel

F32 = torch.float32


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(F32)


def _adam_direction(w, g, m, v, beta1, beta2, eps, weight_decay, step):
    """fp32 Adam moments and m_hat / (sqrt(v_hat) + eps) + wd*w (AdamW and LAMB)."""
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    m_t = beta1 * m + (1.0 - beta1) * g
    v_t = beta2 * v + (1.0 - beta2) * g * g
    return (m_t / bc1) / (torch.sqrt(v_t / bc2) + eps) + weight_decay * w, m_t, v_t


@kernel("apply_adam_w_v2")
def apply_adam_w_v2(weight, grad, m, v, *, beta1=0.9, beta2=0.999, lr=1e-3,
                    weight_decay=0.01, eps=1e-8, step=1):
    checks.check_adam_w_v2(weight, grad, m, v, step=step)
    w = _f32(weight)
    update, m_t, v_t = _adam_direction(w, _f32(grad), m, v, beta1, beta2, eps, weight_decay,
                                       step)
    return (w - lr * update).to(weight.dtype), m_t, v_t


@kernel("apply_rms_prop")
def apply_rms_prop(var, ms, mom, grad, *, lr=0.001, rho=0.9, momentum=0.9, epsilon=1e-7):
    checks.check_rms_prop(var, ms, mom, grad)
    ms_new = ms + (grad * grad - ms) * (1.0 - rho)
    mom_new = mom * momentum + (grad * lr) / torch.sqrt(ms_new + epsilon)
    return var - mom_new, ms_new, mom_new


@kernel("apply_proximal_gradient_descent")
def apply_proximal_gradient_descent(var, alpha, l1, l2, delta):
    checks.check_proximal_gd(var, alpha, l1, l2, delta)
    a, l1_, l2_ = (_f32(s).reshape(()) for s in (alpha, l1, l2))
    prox = _f32(var) - a * _f32(delta)
    out = torch.sign(prox) / (1.0 + a * l2_) * torch.clamp(prox.abs() - a * l1_, min=0.0)
    return out.to(var.dtype)


@kernel("sgd_momentum")
def sgd_momentum(weight, grad, momentum_buffer, *, lr=0.01, momentum=0.9, dampening=0.0,
                 weight_decay=0.0, nesterov=False):
    checks.check_sgd_momentum(weight, grad, momentum_buffer)
    w, g = _f32(weight), _f32(grad)
    g = g + weight_decay * w
    buf = momentum * momentum_buffer + (1.0 - dampening) * g
    direction = g + momentum * buf if nesterov else buf
    return (w - lr * direction).to(weight.dtype), buf


@kernel("adagrad")
def adagrad(weight, grad, state_sum, *, lr=0.01, lr_decay=0.0, weight_decay=0.0, eps=1e-10,
            step=1):
    checks.check_adagrad(weight, grad, state_sum, step=step)
    clr = lr / (1.0 + (step - 1) * lr_decay)
    w, g = _f32(weight), _f32(grad)
    g = g + weight_decay * w
    s = state_sum + g * g
    return (w - clr * g / (torch.sqrt(s) + eps)).to(weight.dtype), s


@kernel("lion")
def lion(weight, grad, exp_avg, *, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0):
    checks.check_lion(weight, grad, exp_avg)
    w, g = _f32(weight), _f32(grad)
    direction = torch.sign(beta1 * exp_avg + (1.0 - beta1) * g)
    w_new = w * (1.0 - lr * weight_decay) - lr * direction
    return w_new.to(weight.dtype), beta2 * exp_avg + (1.0 - beta2) * g


@kernel("lamb")
def lamb(weight, grad, m, v, *, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6,
         weight_decay=0.01, step=1):
    checks.check_lamb(weight, grad, m, v, step=step)
    w = _f32(weight)
    r, m_t, v_t = _adam_direction(w, _f32(grad), m, v, beta1, beta2, eps, weight_decay, step)
    w_norm, r_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(r)
    trust = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, torch.ones_like(w_norm))
    return (w - lr * trust * r).to(weight.dtype), m_t, v_t


@kernel("adafactor")
def adafactor(weight, grad, row_var, col_var, *, lr=1e-2, beta2_decay=-0.8, eps1=2.0 ** -23,
              eps2=1e-3, d=1.0, weight_decay=0.0, step=1):
    checks.check_adafactor(weight, grad, row_var, col_var, step=step)
    w, g = _f32(weight), _f32(grad)
    one_minus_beta2 = float(step) ** beta2_decay
    rho = min(lr, step ** -0.5)
    alpha = torch.clamp(torch.linalg.vector_norm(w) / w.numel() ** 0.5, min=eps2) * rho
    g2 = g * g
    row_new = torch.lerp(row_var, g2.mean(dim=1), one_minus_beta2)
    col_new = torch.lerp(col_var, g2.mean(dim=0), one_minus_beta2)
    var_est = torch.outer(row_new, col_new) / torch.clamp(row_new.mean(), min=eps1)
    update = g * torch.rsqrt(torch.clamp(var_est, min=eps1 * eps1))
    denom = torch.clamp(torch.linalg.vector_norm(update) / (update.numel() ** 0.5 * d), min=1.0)
    w_new = w * (1.0 - lr * weight_decay) - (alpha / denom) * update
    return w_new.to(weight.dtype), row_new, col_new
