"""Known-bug kernels of the optimizer family: each one a bug real kernels have shipped.

Registered under the backend ``mutants``; the harness must FAIL every one of them at L0
or L1 under the op's default standard. Each is the correct torch kernel with one change.
"""
from __future__ import annotations

import torch

from verify.specs.registry import kernel

F32 = torch.float32
BF16 = torch.bfloat16


def _f32(t):
    return t.to(F32)


def _adam_w(weight, grad, m, v, *, beta1, beta2, lr, weight_decay, eps, step,
            eps_inside=False, coupled=False, bias_step=None, work_dtype=F32,
            state_dtype=F32):
    steps = step if bias_step is None else bias_step
    bc1 = 1.0 - beta1 ** steps if bias_step != 0 else 1.0
    bc2 = 1.0 - beta2 ** steps if bias_step != 0 else 1.0
    bc1, bc2 = torch.tensor(bc1, dtype=F32), torch.tensor(bc2, dtype=F32)
    w, g = weight.to(work_dtype), grad.to(work_dtype)
    m_, v_ = m.to(work_dtype), v.to(work_dtype)
    if coupled:
        g = g + weight_decay * w
    m_t = beta1 * m_ + (1.0 - beta1) * g
    v_t = beta2 * v_ + (1.0 - beta2) * g * g
    m_hat, v_hat = m_t / bc1.to(work_dtype), v_t / bc2.to(work_dtype)
    denom = torch.sqrt(v_hat + eps) if eps_inside else torch.sqrt(v_hat) + eps
    update = m_hat / denom + (0.0 if coupled else weight_decay * w)
    w_new = (w - lr * update).to(weight.dtype)
    return w_new, m_t.to(state_dtype).to(F32), v_t.to(state_dtype).to(F32)


_ADAM_DEFAULTS = dict(beta1=0.9, beta2=0.999, lr=1e-3, weight_decay=0.01, eps=1e-8, step=1)


@kernel("apply_adam_w_v2", backend="mutants")
def eps_inside_sqrt(weight, grad, m, v, **p):
    """AdamW with eps inside the sqrt: sqrt(v_hat + eps) instead of sqrt(v_hat) + eps."""
    return _adam_w(weight, grad, m, v, **{**_ADAM_DEFAULTS, **p}, eps_inside=True)


@kernel("apply_adam_w_v2", backend="mutants")
def coupled_weight_decay(weight, grad, m, v, **p):
    """Adam-L2 instead of AdamW: weight decay added to the gradient."""
    return _adam_w(weight, grad, m, v, **{**_ADAM_DEFAULTS, **p}, coupled=True)


@kernel("apply_adam_w_v2", backend="mutants")
def no_bias_correction(weight, grad, m, v, **p):
    """Bias correction left out."""
    return _adam_w(weight, grad, m, v, **{**_ADAM_DEFAULTS, **p}, bias_step=0)


@kernel("apply_adam_w_v2", backend="mutants")
def bias_correction_step_minus_1(weight, grad, m, v, **p):
    """Bias correction with step - 1 (an off-by-one in the step counter)."""
    q = {**_ADAM_DEFAULTS, **p}
    return _adam_w(weight, grad, m, v, **q, bias_step=q["step"] - 1 or 1e-30)


@kernel("apply_adam_w_v2", backend="mutants")
def bf16_intermediate_math(weight, grad, m, v, **p):
    """All math in the weight's dtype (bf16 math for bf16 weights) instead of fp32."""
    return _adam_w(weight, grad, m, v, **{**_ADAM_DEFAULTS, **p}, work_dtype=weight.dtype)


@kernel("apply_adam_w_v2", backend="mutants")
def states_written_bf16(weight, grad, m, v, **p):
    """m and v rounded to bf16 on write-back."""
    return _adam_w(weight, grad, m, v, **{**_ADAM_DEFAULTS, **p}, state_dtype=BF16)


# -- RMSProp ---------------------------------------------------------------------------
@kernel("apply_rms_prop", backend="mutants")
def eps_outside_sqrt(var, ms, mom, grad, *, lr=0.001, rho=0.9, momentum=0.9, epsilon=1e-7):
    """RMSProp with eps outside the sqrt (Adam habit); TF's ApplyRMSProp has it inside."""
    ms_new = ms + (grad * grad - ms) * (1.0 - rho)
    mom_new = mom * momentum + (grad * lr) / (torch.sqrt(ms_new) + epsilon)
    return var - mom_new, ms_new, mom_new


@kernel("apply_rms_prop", backend="mutants")
def rho_swapped(var, ms, mom, grad, *, lr=0.001, rho=0.9, momentum=0.9, epsilon=1e-7):
    """ms moves by rho instead of 1 - rho."""
    ms_new = ms + (grad * grad - ms) * rho
    mom_new = mom * momentum + (grad * lr) / torch.sqrt(ms_new + epsilon)
    return var - mom_new, ms_new, mom_new


@kernel("apply_rms_prop", backend="mutants")
def stale_ms(var, ms, mom, grad, *, lr=0.001, rho=0.9, momentum=0.9, epsilon=1e-7):
    """The momentum step divides by the old ms, not the updated one."""
    ms_new = ms + (grad * grad - ms) * (1.0 - rho)
    mom_new = mom * momentum + (grad * lr) / torch.sqrt(ms + epsilon)
    return var - mom_new, ms_new, mom_new


# -- Proximal gradient descent ---------------------------------------------------------
def _prox(var, alpha, l1, l2, delta, *, scale_l1=True, shrink=True):
    a, l1_, l2_ = (_f32(s).reshape(()) for s in (alpha, l1, l2))
    prox = _f32(var) - a * _f32(delta)
    thresh = a * l1_ if scale_l1 else l1_
    out = torch.sign(prox) * torch.clamp(prox.abs() - thresh, min=0.0)
    if shrink:
        out = out / (1.0 + a * l2_)
    return out.to(var.dtype)


@kernel("apply_proximal_gradient_descent", backend="mutants")
def l1_not_scaled_by_alpha(var, alpha, l1, l2, delta):
    """Soft threshold by l1 instead of alpha * l1."""
    return _prox(var, alpha, l1, l2, delta, scale_l1=False)


@kernel("apply_proximal_gradient_descent", backend="mutants")
def l2_shrink_missing(var, alpha, l1, l2, delta):
    """The 1 / (1 + alpha * l2) shrink left out."""
    return _prox(var, alpha, l1, l2, delta, shrink=False)


# -- SGD with momentum -----------------------------------------------------------------
@kernel("sgd_momentum", backend="mutants")
def ema_momentum(weight, grad, momentum_buffer, *, lr=0.01, momentum=0.9, dampening=0.0,
                 weight_decay=0.0, nesterov=False):
    """buf = mu*buf + (1-mu)*g (an EMA) instead of mu*buf + (1-dampening)*g."""
    w, g = _f32(weight), _f32(grad) + weight_decay * _f32(weight)
    buf = momentum * momentum_buffer + (1.0 - momentum) * g
    return (w - lr * buf).to(weight.dtype), buf


@kernel("sgd_momentum", backend="mutants")
def step_with_old_buffer(weight, grad, momentum_buffer, *, lr=0.01, momentum=0.9,
                         dampening=0.0, weight_decay=0.0, nesterov=False):
    """The weight moves along the buffer before this step's update."""
    w, g = _f32(weight), _f32(grad) + weight_decay * _f32(weight)
    buf = momentum * momentum_buffer + (1.0 - dampening) * g
    return (w - lr * momentum_buffer).to(weight.dtype), buf


# -- AdaGrad ---------------------------------------------------------------------------
@kernel("adagrad", backend="mutants")
def stale_sum(weight, grad, state_sum, *, lr=0.01, lr_decay=0.0, weight_decay=0.0,
              eps=1e-10, step=1):
    """Divides by the accumulated sum before adding this step's g^2."""
    w, g = _f32(weight), _f32(grad) + weight_decay * _f32(weight)
    clr = lr / (1.0 + (step - 1) * lr_decay)
    s = state_sum + g * g
    return (w - clr * g / (torch.sqrt(state_sum) + eps)).to(weight.dtype), s


@kernel("adagrad", backend="mutants")
def lr_decay_off_by_one(weight, grad, state_sum, *, lr=0.01, lr_decay=0.0, weight_decay=0.0,
                        eps=1e-10, step=1):
    """clr = lr / (1 + step * lr_decay) instead of (step - 1)."""
    w, g = _f32(weight), _f32(grad) + weight_decay * _f32(weight)
    clr = lr / (1.0 + step * lr_decay)
    s = state_sum + g * g
    return (w - clr * g / (torch.sqrt(s) + eps)).to(weight.dtype), s


# -- Lion ------------------------------------------------------------------------------
@kernel("lion", backend="mutants")
def direction_with_beta2(weight, grad, exp_avg, *, lr=1e-4, beta1=0.9, beta2=0.99,
                         weight_decay=0.0):
    """The update direction interpolates with beta2 (the state's rate) instead of beta1."""
    w, g = _f32(weight), _f32(grad)
    direction = torch.sign(beta2 * exp_avg + (1.0 - beta2) * g)
    return ((w * (1.0 - lr * weight_decay) - lr * direction).to(weight.dtype),
            beta2 * exp_avg + (1.0 - beta2) * g)


@kernel("lion", backend="mutants")
def state_with_beta1(weight, grad, exp_avg, *, lr=1e-4, beta1=0.9, beta2=0.99,
                     weight_decay=0.0):
    """The momentum state is updated with beta1 instead of beta2."""
    w, g = _f32(weight), _f32(grad)
    direction = torch.sign(beta1 * exp_avg + (1.0 - beta1) * g)
    return ((w * (1.0 - lr * weight_decay) - lr * direction).to(weight.dtype),
            beta1 * exp_avg + (1.0 - beta1) * g)


# -- LAMB ------------------------------------------------------------------------------
def _lamb(weight, grad, m, v, *, lr, beta1, beta2, eps, weight_decay, step, trust_mode):
    bc1, bc2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
    w, g = _f32(weight), _f32(grad)
    m_t = beta1 * m + (1.0 - beta1) * g
    v_t = beta2 * v + (1.0 - beta2) * g * g
    r = (m_t / bc1) / (torch.sqrt(v_t / bc2) + eps) + weight_decay * w
    w_norm, r_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(r)
    trust = {"none": torch.ones_like(w_norm), "inverted": r_norm / w_norm}[trust_mode]
    return (w - lr * trust * r).to(weight.dtype), m_t, v_t


_LAMB_DEFAULTS = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, step=1)


@kernel("lamb", backend="mutants")
def trust_ratio_missing(weight, grad, m, v, **p):
    """Plain AdamW step: the layer-wise trust ratio left out."""
    return _lamb(weight, grad, m, v, **{**_LAMB_DEFAULTS, **p}, trust_mode="none")


@kernel("lamb", backend="mutants")
def trust_ratio_inverted(weight, grad, m, v, **p):
    """Trust ratio ||r|| / ||w|| instead of ||w|| / ||r||."""
    return _lamb(weight, grad, m, v, **{**_LAMB_DEFAULTS, **p}, trust_mode="inverted")


# -- AdaFactor -------------------------------------------------------------------------
def _adafactor(weight, grad, row_var, col_var, *, lr, beta2_decay, eps1, eps2, d,
               weight_decay, step, rms_of="weight", eps_floor="squared", state_dtype=F32):
    w, g = _f32(weight), _f32(grad)
    one_minus_beta2 = float(step) ** beta2_decay
    rho = min(lr, step ** -0.5)
    ref = w if rms_of == "weight" else g
    alpha = torch.clamp(torch.linalg.vector_norm(ref) / ref.numel() ** 0.5, min=eps2) * rho
    g2 = g * g
    row_new = torch.lerp(row_var, g2.mean(dim=1), one_minus_beta2)
    col_new = torch.lerp(col_var, g2.mean(dim=0), one_minus_beta2)
    var_est = torch.outer(row_new, col_new) / torch.clamp(row_new.mean(), min=eps1)
    floor = eps1 * eps1 if eps_floor == "squared" else eps1
    update = g * torch.rsqrt(torch.clamp(var_est, min=floor))
    denom = torch.clamp(torch.linalg.vector_norm(update) / (update.numel() ** 0.5 * d), min=1.0)
    w_new = w * (1.0 - lr * weight_decay) - (alpha / denom) * update
    return (w_new.to(weight.dtype), row_new.to(state_dtype).to(F32),
            col_new.to(state_dtype).to(F32))


_ADAFACTOR_DEFAULTS = dict(lr=1e-2, beta2_decay=-0.8, eps1=2.0 ** -23, eps2=1e-3, d=1.0,
                           weight_decay=0.0, step=1)


@kernel("adafactor", backend="mutants")
def relative_step_from_grad(weight, grad, row_var, col_var, **p):
    """The relative step size scales with RMS(grad) instead of RMS(weight)."""
    return _adafactor(weight, grad, row_var, col_var, **{**_ADAFACTOR_DEFAULTS, **p},
                      rms_of="grad")


@kernel("adafactor", backend="mutants")
def eps1_not_squared(weight, grad, row_var, col_var, **p):
    """The variance floor is eps1 instead of eps1^2 (small gradients get damped)."""
    return _adafactor(weight, grad, row_var, col_var, **{**_ADAFACTOR_DEFAULTS, **p},
                      eps_floor="plain")


@kernel("adafactor", backend="mutants")
def factored_states_bf16(weight, grad, row_var, col_var, **p):
    """Row and column second moments rounded to bf16 on write-back."""
    return _adafactor(weight, grad, row_var, col_var, **{**_ADAFACTOR_DEFAULTS, **p},
                      state_dtype=BF16)
