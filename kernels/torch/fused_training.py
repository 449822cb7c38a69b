"""Working-precision torch kernels of the fused training ops: fp32 math inside, outputs
in the working dtype, gradients in the inputs' dtypes.

Backward comes three ways, as real kernels ship it: a torch.autograd.Function with a
hand-written fp32 backward (add_rms_norm_bias), a separate backward kernel registered
with @backward_kernel (mhc_post, from the document's gradient formulas), and plain
autograd through fp32 torch ops (the rest).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from verify.goldens import fused_training as gold
from verify.specs.registry import backward_kernel, kernel

F32 = torch.float32


# -- add_rms_norm_bias: autograd.Function, fp32 backward ----------------------------------
def sum_fp32(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Reduction of a parameter gradient over the leading dims, accumulated in fp32."""
    return t.sum(dim=dims) if dims else t


class AddRmsNormBias(torch.autograd.Function):
    """Forward and backward of npu_add_rms_norm_bias; ``reduce`` sums the gamma / beta
    gradients over the leading dims (a parameter, so a known-bad accumulation can be
    swapped in)."""

    @staticmethod
    def forward(ctx, x1, x2, gamma, beta, epsilon, reduce):
        xf = x1.to(F32) + x2.to(F32)
        dims = gold.norm_dims(xf, gamma)
        rstd = torch.rsqrt(xf.square().mean(dim=dims, keepdim=True) + epsilon)
        y = xf * rstd * gamma.to(F32)
        if beta is not None:
            y = y + beta.to(F32)
        ctx.save_for_backward(xf, rstd, gamma)
        ctx.has_beta, ctx.dims, ctx.reduce = beta is not None, dims, reduce
        ctx.dtypes = (x1.dtype, x2.dtype, gamma.dtype, None if beta is None else beta.dtype)
        ctx.mark_non_differentiable(rstd)
        return y.to(x1.dtype), rstd, xf.to(x1.dtype)

    @staticmethod
    def backward(ctx, dy, _drstd, dx_out):
        xf, rstd, gamma = ctx.saved_tensors
        dims = ctx.dims
        lead = tuple(range(xf.dim() - len(dims)))
        dyf = dy.to(F32)
        xhat = xf * rstd
        dxhat = dyf * gamma.to(F32)
        dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(dim=dims, keepdim=True))
        if dx_out is not None:
            dx = dx + dx_out.to(F32)
        t1, t2, tg, tb = ctx.dtypes
        dgamma = ctx.reduce(dyf * xhat, lead).to(tg)
        dbeta = ctx.reduce(dyf, lead).to(tb) if ctx.has_beta else None
        return dx.to(t1), dx.to(t2), dgamma, dbeta, None, None


@kernel("add_rms_norm_bias")
def add_rms_norm_bias(x1, x2, gamma, beta=None, *, epsilon=1e-6):
    gold._check_add_rms_norm_bias(x1, x2, gamma, beta)
    return AddRmsNormBias.apply(x1, x2, gamma, beta, epsilon, sum_fp32)


# -- plain autograd through fp32 ops --------------------------------------------------------
@kernel("rmsnorm_without_weight")
def rmsnorm_without_weight(x, *, eps=1e-6):
    return torch.rsqrt(x.to(F32).square().mean(dim=-1, keepdim=True) + eps).to(x.dtype)


@kernel("rms_norm_gated")
def rms_norm_gated(x, g, weight, bias=None, residual=None, *, activation="swish",
                   prenorm=False, eps=1e-6):
    gold._check_rms_norm_gated(x, g, weight, bias, residual, activation)
    h = x.to(F32) if residual is None else x.to(F32) + residual.to(F32)
    y = h * torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps) * weight.to(F32)
    if bias is not None:
        y = y + bias.to(F32)
    y = (y * gold.gate(g.to(F32), activation)).to(x.dtype)
    return (y, h.to(x.dtype)) if prenorm else y


@kernel("clipped_swiglu")
def clipped_swiglu(gate_up, *, alpha=1.702, limit=7.0):
    gold._check_clipped_swiglu(gate_up, alpha, limit)
    k = gate_up.shape[-1] // 2
    gf = gate_up[..., :k].to(F32).clamp(max=limit)
    uf = gate_up[..., k:].to(F32).clamp(min=-limit, max=limit)
    return (gf * torch.sigmoid(alpha * gf) * (uf + 1.0)).to(gate_up.dtype)


@kernel("fused_cross_entropy")
def fused_cross_entropy(logits, weight, labels, *, ignore_index=-100, reduction="sum"):
    gold._check_cross_entropy(logits, weight, labels, ignore_index, reduction)
    ce = F.cross_entropy(logits.to(F32), labels.long(), ignore_index=ignore_index,
                         reduction="none")
    per_token = ce * weight.to(F32)
    return per_token.sum() if reduction == "sum" else per_token


@kernel("sinkhorn")
def sinkhorn(mixes, hc_scale, hc_base, *, hc_mult=4, iters=20, eps=1e-6):
    gold._check_sinkhorn(mixes, hc_scale, hc_base, hc_mult, iters)
    outs = gold.sinkhorn(mixes.to(F32), hc_scale.to(F32), hc_base.to(F32),
                         hc_mult=hc_mult, iters=iters, eps=eps)
    return tuple(o.to(mixes.dtype) for o in outs)


def chunk_rows(split_sizes, sorted_index, device) -> torch.Tensor:
    """Row indices of the sorted output: for each chunk in sorted_index order, its rows."""
    sizes = split_sizes.long().cpu()
    starts = torch.cumsum(sizes, 0) - sizes
    rows = [torch.arange(int(starts[i]), int(starts[i] + sizes[i]))
            for i in sorted_index.long().cpu()]
    return (torch.cat(rows) if rows else torch.empty(0, dtype=torch.long)).to(device)


@kernel("moe_sort_chunks_by_index")
def moe_sort_chunks_by_index(inp, split_sizes, sorted_index):
    gold._check_sort_chunks(inp, split_sizes, sorted_index)
    return inp.index_select(0, chunk_rows(split_sizes, sorted_index, inp.device))


@kernel("moe_sort_chunks_by_index_with_probs")
def moe_sort_chunks_by_index_with_probs(inp, split_sizes, sorted_index, probs):
    gold._check_sort_chunks(inp, split_sizes, sorted_index, probs)
    rows = chunk_rows(split_sizes, sorted_index, inp.device)
    return inp.index_select(0, rows), probs.index_select(0, rows)


# -- mhc_post: forward kernel and a separate backward kernel ------------------------------
@kernel("mhc_post")
def mhc_post(x, residual, h_post, h_res):
    gold._check_mhc_post(x, residual, h_post, h_res)
    out = (h_post.to(F32)[..., :, None] * x.to(F32)[..., None, :]
           + torch.einsum("bsji,bsjd->bsid", h_res.to(F32), residual.to(F32)))
    return out.to(x.dtype)


def mhc_post_grads(x, residual, h_post, h_res, grad_out, transpose_back=True):
    """The document's gradient formulas, in fp32:
    grad_x[d] = sum_i go[i,d] h_post[i]; grad_h_post[i] = sum_d go[i,d] x[d];
    grad_residual[j,d] = sum_i go[i,d] h_res[j,i]; grad_h_res[i,j] = sum_d go[j,d] res[i,d].
    Internally h_res is used permuted (0,1,3,2); the gradient is transposed back to the
    user's layout unless ``transpose_back`` is False."""
    go = grad_out.to(F32)
    xf, rf, hp, hr_t = x.to(F32), residual.to(F32), h_post.to(F32), h_res.to(F32).transpose(-1, -2)
    grad_x = torch.einsum("bsid,bsi->bsd", go, hp)
    grad_h_post = torch.einsum("bsid,bsd->bsi", go, xf)
    grad_residual = torch.einsum("bsid,bsij->bsjd", go, hr_t)
    grad_hr_t = torch.einsum("bsid,bsjd->bsij", go, rf)  # d out[i] / d hr_t[i, j]
    grad_h_res = grad_hr_t.transpose(-1, -2) if transpose_back else grad_hr_t
    return (grad_x.to(x.dtype), grad_residual.to(residual.dtype), grad_h_post.to(h_post.dtype),
            grad_h_res.contiguous().to(h_res.dtype))


@backward_kernel("mhc_post")
def mhc_post_backward(x, residual, h_post, h_res, *, grad_out):
    return mhc_post_grads(x, residual, h_post, h_res, grad_out)

