"""Working-precision torch kernels of the framework-call ops (rms_norm, silu, swiglu,
layer_norm, matmul): fp32 math inside, outputs in the working dtype, gradients by
autograd through the fp32 ops."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from verify.specs.registry import kernel

F32 = torch.float32


@kernel("rms_norm")
def rms_norm(x, weight=None, *, eps=1e-6, with_rstd=False):
    xf = x.to(F32)
    rstd = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    y = xf * rstd
    if weight is not None:
        y = y * weight.to(F32)
    return (y.to(x.dtype), rstd) if with_rstd else y.to(x.dtype)


@kernel("silu")
def silu(x):
    return F.silu(x.to(F32)).to(x.dtype)


@kernel("swiglu")
def swiglu(x, *, dim=-1):
    a, b = x.to(F32).chunk(2, dim=dim)
    return (F.silu(a) * b).to(x.dtype)


@kernel("layer_norm")
def layer_norm(x, weight=None, bias=None, *, eps=1e-5):
    w = None if weight is None else weight.to(F32)
    b = None if bias is None else bias.to(F32)
    return F.layer_norm(x.to(F32), (x.shape[-1],), w, b, eps).to(x.dtype)


@kernel("matmul")
def matmul(a, b):
    return torch.matmul(a.to(F32), b.to(F32)).to(a.dtype)
