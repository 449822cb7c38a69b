"""Ops mapped to torch_npu's fused operators. Argument orders and dtype rules follow the
torch_npu documentation (op-plugin docs and tests); they run only on an NPU."""
from __future__ import annotations

from verify.goldens import optimizer_checks as checks
from verify.specs.registry import kernel

from . import torch_npu


def _npu():
    if torch_npu is None:
        raise RuntimeError("torch_npu is not available")
    return torch_npu


@kernel("apply_adam_w_v2", backend="npu", name="npu_apply_adam_w")
def apply_adam_w_v2(weight, grad, m, v, *, beta1=0.9, beta2=0.999, lr=1e-3,
                    weight_decay=0.01, eps=1e-8, step=1):
    """torch_npu.npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2,
    eps, grad, max_grad_norm, amsgrad, maximize, out=(var, m, v)); it raises the powers by
    one more step itself, so it is given beta**(step - 1). Updates out in place."""
    checks.check_adam_w_v2(weight, grad, m, v, step=step)
    var, m_, v_ = weight.clone(), m.clone(), v.clone()
    _npu().npu_apply_adam_w(beta1 ** (step - 1), beta2 ** (step - 1), lr, weight_decay, beta1,
                            beta2, eps, grad, None, False, False, out=(var, m_, v_))
    return var, m_, v_


@kernel("gelu", backend="npu", name="npu_gelu")
def gelu(x, *, approximate="none"):
    """torch_npu.npu_gelu(input, *, approximate='none')."""
    return _npu().npu_gelu(x, approximate=approximate)


@kernel("rope", backend="npu", name="npu_rotary_mul")
def rope(x, cos, sin, *, layout="rotate_half"):
    """torch_npu.npu_rotary_mul(x, r1, r2): x [B, S, N, D], r1 = cos and r2 = sin
    broadcast as [1, S, 1, D]; the rotate_half layout only (interleaved raises)."""
    if layout != "rotate_half":
        raise ValueError("npu_rotary_mul implements the rotate_half layout only")
    x4 = x if x.dim() == 4 else x.unsqueeze(0)
    r1 = cos[None, :, None, :].to(x.dtype)
    r2 = sin[None, :, None, :].to(x.dtype)
    out = _npu().npu_rotary_mul(x4, r1, r2)
    return out if x.dim() == 4 else out.squeeze(0)


@kernel("rms_norm_rope", backend="npu", name="npu_rms_norm_then_rotary_mul")
def rms_norm_rope(x, weight, cos, sin, *, eps=1e-6, layout="rotate_half"):
    """torch_npu.npu_rms_norm(x, gamma, epsilon) -> (y, rstd), then npu_rotary_mul."""
    y, _ = _npu().npu_rms_norm(x, weight.to(x.dtype), epsilon=eps)
    return rope(y, cos, sin, layout=layout)

