"""Known-bug kernels of the framework-call ops: each the correct kernel with one real bug."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from verify.kernels.torch import framework_ops as good
from verify.specs.registry import kernel

F32 = torch.float32


def mutant(op):
    return kernel(op, backend="mutants")


@mutant("rms_norm")
def sum_not_mean(x, weight=None, *, eps=1e-6, with_rstd=False):
    """rsqrt(sum(x^2) + eps): the 1/D of the mean is missing."""
    xf = x.to(F32)
    rstd = torch.rsqrt(xf.square().sum(dim=-1, keepdim=True) + eps)
    y = xf * rstd * (1.0 if weight is None else weight.to(F32))
    return (y.to(x.dtype), rstd) if with_rstd else y.to(x.dtype)


@mutant("rms_norm")
def weight_ignored(x, weight=None, *, eps=1e-6, with_rstd=False):
    """The weight is never applied."""
    return good.rms_norm(x, None, eps=eps, with_rstd=with_rstd)


@mutant("silu")
def quick_gelu_sigmoid(x):
    """x * sigmoid(1.702 x): the quick-GELU approximation taken for SiLU."""
    xf = x.to(F32)
    return (xf * torch.sigmoid(1.702 * xf)).to(x.dtype)


@mutant("swiglu")
def halves_swapped(x, *, dim=-1):
    """silu(b) * a: the gate taken from the second half."""
    a, b = x.to(F32).chunk(2, dim=dim)
    return (F.silu(b) * a).to(x.dtype)


@mutant("layer_norm")
def unbiased_variance(x, weight=None, bias=None, *, eps=1e-5):
    """The variance divided by D - 1 (torch.var's default) instead of D."""
    xf = x.to(F32)
    y = (xf - xf.mean(-1, keepdim=True)) / torch.sqrt(xf.var(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(F32)
    if bias is not None:
        y = y + bias.to(F32)
    return y.to(x.dtype)


@mutant("matmul")
def batch_stride_zero(a, b):
    """b's batch stride taken as 0: every batch multiplies by b[0]."""
    bb = b.to(F32)
    if bb.dim() > 2:
        bb = bb.reshape(-1, *bb.shape[-2:])[:1].expand(*b.shape)
    return torch.matmul(a.to(F32), bb).to(a.dtype)
