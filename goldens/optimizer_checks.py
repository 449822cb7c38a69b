"""Input validation of the real optimizer kernel wrappers (ops.md section A).

The torch kernels call these exactly like the wrappers they stand for, so a case that
feeds an unsupported dtype gets the wrapper's TypeError, not a silently wrong result.
"""
from __future__ import annotations

import torch

_FLOAT_WEIGHTS = (torch.float32, torch.bfloat16, torch.float16)


def _same_shapes(op: str, **tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{op}: shapes must match, got {shapes}")


def _dtype_in(op: str, name: str, t: torch.Tensor, allowed) -> None:
    if t.dtype not in allowed:
        raise TypeError(f"{op}: {name} dtype {t.dtype} not supported; "
                        f"expected one of {[str(a) for a in allowed]}")


def _step(op: str, step) -> None:
    if isinstance(step, bool) or int(step) != step or step < 1:
        raise ValueError(f"{op}: step must be an integer >= 1, got {step!r}")


def _weight_grad_states(op: str, weights_allowed, weight, grad, **states) -> None:
    _same_shapes(op, weight=weight, grad=grad, **states)
    _dtype_in(op, "weight", weight, weights_allowed)
    if grad.dtype != weight.dtype:
        raise TypeError(f"{op}: grad dtype {grad.dtype} must match weight dtype {weight.dtype}")
    for name, state in states.items():
        _dtype_in(op, name, state, (torch.float32,))


def check_adam_w_v2(weight, grad, m, v, *, step, **_):
    """ApplyAdamWV2: bf16 | fp32 weights (fp16 raises TypeError), fp32 m / v, step >= 1."""
    _weight_grad_states("apply_adam_w_v2", (torch.float32, torch.bfloat16),
                        weight, grad, m=m, v=v)
    _step("apply_adam_w_v2", step)


def check_rms_prop(var, ms, mom, grad, **_):
    """ApplyRMSProp: four fp32 2-D tensors of one shape."""
    op = "apply_rms_prop"
    _same_shapes(op, var=var, ms=ms, mom=mom, grad=grad)
    for name, t in dict(var=var, ms=ms, mom=mom, grad=grad).items():
        _dtype_in(op, name, t, (torch.float32,))
    if var.dim() != 2:
        raise ValueError(f"{op}: inputs must be 2-D, got {var.dim()}-D")


def check_proximal_gd(var, alpha, l1, l2, delta, **_):
    """ApplyProximalGradientDescent: var / delta fp16 | fp32 of one shape (1..8 dims);
    alpha, l1, l2 one-element tensors of var's dtype, non-negative."""
    op = "apply_proximal_gradient_descent"
    _dtype_in(op, "var", var, (torch.float32, torch.float16))
    if delta.dtype != var.dtype:
        raise TypeError(f"{op}: delta dtype {delta.dtype} must match var dtype {var.dtype}")
    if tuple(delta.shape) != tuple(var.shape):
        raise ValueError(f"{op}: delta shape {tuple(delta.shape)} must match "
                         f"var shape {tuple(var.shape)}")
    if var.dim() > 8:
        raise ValueError(f"{op}: var has {var.dim()} dims, at most 8 are supported")
    for name, s in dict(alpha=alpha, l1=l1, l2=l2).items():
        if s.numel() != 1 or s.dim() > 1:
            raise ValueError(f"{op}: {name} must be a scalar (0-D or [1]), got shape "
                             f"{tuple(s.shape)}")
        if s.dtype != var.dtype:
            raise TypeError(f"{op}: {name} dtype {s.dtype} must match var dtype {var.dtype}")
        if float(s.reshape(())) < 0:
            raise ValueError(f"{op}: {name} must be non-negative, got {float(s.reshape(()))}")


def check_sgd_momentum(weight, grad, momentum_buffer, **_):
    _weight_grad_states("sgd_momentum", _FLOAT_WEIGHTS, weight, grad,
                        momentum_buffer=momentum_buffer)


def check_adagrad(weight, grad, state_sum, *, step, **_):
    _weight_grad_states("adagrad", _FLOAT_WEIGHTS, weight, grad, state_sum=state_sum)
    _step("adagrad", step)


def check_lion(weight, grad, exp_avg, **_):
    _weight_grad_states("lion", _FLOAT_WEIGHTS, weight, grad, exp_avg=exp_avg)


def check_lamb(weight, grad, m, v, *, step, **_):
    _weight_grad_states("lamb", _FLOAT_WEIGHTS, weight, grad, m=m, v=v)
    _step("lamb", step)


def check_adafactor(weight, grad, row_var, col_var, *, step, **_):
    op = "adafactor"
    _same_shapes(op, weight=weight, grad=grad)
    _dtype_in(op, "weight", weight, _FLOAT_WEIGHTS)
    if grad.dtype != weight.dtype:
        raise TypeError(f"{op}: grad dtype {grad.dtype} must match weight dtype {weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"{op}: the factored form needs a 2-D weight, got {weight.dim()}-D")
    rows, cols = weight.shape
    if tuple(row_var.shape) != (rows,) or tuple(col_var.shape) != (cols,):
        raise ValueError(f"{op}: row_var must be [{rows}] and col_var [{cols}], got "
                         f"{tuple(row_var.shape)} and {tuple(col_var.shape)}")
    for name, t in dict(row_var=row_var, col_var=col_var).items():
        _dtype_in(op, name, t, (torch.float32,))
    _step(op, step)
