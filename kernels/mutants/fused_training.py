"""Known-bug kernels of the fused training ops: each the correct kernel with one real bug,
forward or backward. A backward bug leaves the forward outputs right, so only the
gradient rows can catch it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from verify.goldens import fused_training as gold
from verify.kernels.torch import fused_training as good
from verify.specs.registry import backward_kernel, kernel

F32, BF16 = torch.float32, torch.bfloat16


def mutant(op):
    return kernel(op, backend="mutants")


# -- add_rms_norm_bias -------------------------------------------------------------------
def sum_in_bf16(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Row by row accumulation with a bf16 running sum."""
    rows = t.reshape(-1, *t.shape[len(dims):]) if dims else t[None]
    acc = torch.zeros(rows.shape[1:], dtype=BF16, device=t.device)
    for row in rows:
        acc = acc + row.to(BF16)
    return acc.to(F32)


@mutant("add_rms_norm_bias")
def gamma_grad_accumulated_in_bf16(x1, x2, gamma, beta=None, *, epsilon=1e-6):
    """Backward bug: the gamma / beta gradients summed over the rows in a bf16 running sum."""
    gold._check_add_rms_norm_bias(x1, x2, gamma, beta)
    return good.AddRmsNormBias.apply(x1, x2, gamma, beta, epsilon, sum_in_bf16)


@mutant("add_rms_norm_bias")
def beta_before_gamma(x1, x2, gamma, beta=None, *, epsilon=1e-6):
    """Forward bug: y = (x*rstd + beta) * gamma, the bias added before the scale."""
    xf = x1.to(F32) + x2.to(F32)
    dims = gold.norm_dims(xf, gamma)
    rstd = torch.rsqrt(xf.square().mean(dim=dims, keepdim=True) + epsilon)
    xhat = xf * rstd + (0 if beta is None else beta.to(F32))
    return (xhat * gamma.to(F32)).to(x1.dtype), rstd, xf.to(x1.dtype)


# -- rmsnorm_without_weight --------------------------------------------------------------
class _RstdNoMeanGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps):
        xf = x.to(F32)
        rstd = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
        ctx.save_for_backward(xf, rstd)
        ctx.dtype = x.dtype
        return rstd.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xf, rstd = ctx.saved_tensors
        return (-grad.to(F32) * rstd.pow(3) * xf).to(ctx.dtype), None  # the 1/D is missing


@mutant("rmsnorm_without_weight")
def grad_missing_mean_factor(x, *, eps=1e-6):
    """Backward bug: d rstd / dx without the 1/D of the mean."""
    return _RstdNoMeanGrad.apply(x, eps)


@mutant("rmsnorm_without_weight")
def rsqrt_of_sum(x, *, eps=1e-6):
    """Forward bug: rsqrt(sum(x^2)) instead of the mean."""
    return torch.rsqrt(x.to(F32).square().sum(dim=-1, keepdim=True) + eps).to(x.dtype)


# -- rms_norm_gated ----------------------------------------------------------------------
@mutant("rms_norm_gated")
def sigmoid_gate_always(x, g, weight, bias=None, residual=None, *, activation="swish",
                        prenorm=False, eps=1e-6):
    """Forward bug: the gate is sigmoid(g) whatever the activation asks."""
    return good.rms_norm_gated(x, g, weight, bias, residual, activation="sigmoid",
                               prenorm=prenorm, eps=eps)


@mutant("rms_norm_gated")
def bias_gets_no_grad(x, g, weight, bias=None, residual=None, *, activation="swish",
                      prenorm=False, eps=1e-6):
    """Backward bug: the bias is treated as a constant (no db)."""
    return good.rms_norm_gated(x, g, weight, None if bias is None else bias.detach(),
                               residual, activation=activation, prenorm=prenorm, eps=eps)


# -- clipped_swiglu ----------------------------------------------------------------------
@mutant("clipped_swiglu")
def up_not_clamped_below(gate_up, *, alpha=1.702, limit=7.0):
    """Forward bug: up clamped at +limit only."""
    k = gate_up.shape[-1] // 2
    gf = gate_up[..., :k].to(F32).clamp(max=limit)
    uf = gate_up[..., k:].to(F32).clamp(max=limit)
    return (gf * torch.sigmoid(alpha * gf) * (uf + 1.0)).to(gate_up.dtype)


class _SwigluStraightThrough(torch.autograd.Function):
    """Right forward; the backward differentiates as if nothing were clamped."""

    @staticmethod
    def forward(ctx, gate_up, alpha, limit):
        ctx.save_for_backward(gate_up)
        ctx.alpha = alpha
        return good.clipped_swiglu(gate_up, alpha=alpha, limit=limit)

    @staticmethod
    def backward(ctx, grad):
        (gate_up,) = ctx.saved_tensors
        k = gate_up.shape[-1] // 2
        with torch.enable_grad():
            gu = gate_up.detach().to(F32).requires_grad_(True)
            gf, uf = gu[..., :k], gu[..., k:]
            y = gf * torch.sigmoid(ctx.alpha * gf) * (uf + 1.0)
            (d,) = torch.autograd.grad(y, gu, grad.to(F32))
        return d.to(gate_up.dtype), None, None


@mutant("clipped_swiglu")
def grad_through_clamp(gate_up, *, alpha=1.702, limit=7.0):
    """Backward bug: clamped elements still get a gradient."""
    return _SwigluStraightThrough.apply(gate_up, alpha, limit)


# -- fused_cross_entropy -----------------------------------------------------------------
@mutant("fused_cross_entropy")
def no_max_shift(logits, weight, labels, *, ignore_index=-100, reduction="sum"):
    """Forward bug: log(sum(exp(logits))) without subtracting the row max: overflows."""
    lf = logits.to(F32)
    lab = labels.long()
    keep = lab != ignore_index
    lse = torch.log(torch.exp(lf).sum(dim=-1))
    ce = lse - lf.gather(-1, torch.where(keep, lab, 0)[:, None])[:, 0]
    per_token = torch.where(keep, ce * weight.to(F32), torch.zeros_like(ce))
    return per_token.sum() if reduction == "sum" else per_token


class _CrossEntropyIgnoredGrad(torch.autograd.Function):
    """Right forward; the backward forgets to zero the ignored tokens' rows."""

    @staticmethod
    def forward(ctx, logits, weight, labels, ignore_index, reduction):
        ctx.save_for_backward(logits, weight, labels)
        ctx.reduction = reduction
        return good.fused_cross_entropy(logits, weight, labels, ignore_index=ignore_index,
                                        reduction=reduction)

    @staticmethod
    def backward(ctx, grad):
        logits, weight, labels = ctx.saved_tensors
        lf = logits.to(F32)
        lab = labels.long().clamp(0, lf.shape[-1] - 1)
        p = torch.softmax(lf, dim=-1)
        onehot = F.one_hot(lab, lf.shape[-1]).to(F32)
        g = grad.to(F32) if ctx.reduction == "none" else grad.to(F32).expand(lf.shape[0])
        d_logits = (p - onehot) * (weight.to(F32) * g)[:, None]
        ce = torch.logsumexp(lf, -1) - lf.gather(-1, lab[:, None])[:, 0]
        return d_logits.to(logits.dtype), (ce * g).to(weight.dtype), None, None, None


@mutant("fused_cross_entropy")
def ignored_tokens_get_grad(logits, weight, labels, *, ignore_index=-100, reduction="sum"):
    """Backward bug: tokens with ignore_index get gradients as if their label were 0."""
    gold._check_cross_entropy(logits, weight, labels, ignore_index, reduction)
    return _CrossEntropyIgnoredGrad.apply(logits, weight, labels, ignore_index, reduction)


# -- mhc_post ----------------------------------------------------------------------------
@mutant("mhc_post")
def h_res_grad_transposed(x, residual, h_post, h_res):
    """Backward bug: grad_h_res returned in the internal, transposed layout (forward
    right; see its separate backward kernel)."""
    return good.mhc_post(x, residual, h_post, h_res)


@backward_kernel("mhc_post", backend="mutants", name="h_res_grad_transposed")
def h_res_grad_transposed_backward(x, residual, h_post, h_res, *, grad_out):
    return good.mhc_post_grads(x, residual, h_post, h_res, grad_out, transpose_back=False)


@mutant("mhc_post")
def h_res_not_transposed(x, residual, h_post, h_res):
    """Forward bug: h_res used as given (sum_j h_res[i, j]) instead of transposed."""
    return good.mhc_post(x, residual, h_post, h_res.transpose(-1, -2))


# -- sinkhorn ----------------------------------------------------------------------------
@mutant("sinkhorn")
def one_iteration_short(mixes, hc_scale, hc_base, *, hc_mult=4, iters=20, eps=1e-6):
    """Forward bug: the loop runs iters - 1 rounds (range(1, iters))."""
    pre, post, _ = good.sinkhorn(mixes, hc_scale, hc_base, hc_mult=hc_mult, iters=iters,
                                 eps=eps)
    hc, lead = hc_mult, mixes.shape[:-1]
    logits = (mixes[..., 2 * hc:].to(F32).reshape(*lead, hc, hc) * hc_scale[2].to(F32)
              + hc_base[2 * hc:].to(F32).reshape(hc, hc))
    comb = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    for _ in range(1, iters):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb.to(mixes.dtype)


@mutant("sinkhorn")
def hc_scale_grad_dropped(mixes, hc_scale, hc_base, *, hc_mult=4, iters=20, eps=1e-6):
    """Backward bug: the comb branch's hc_scale[2] gets no gradient (treated as constant)."""
    scale = torch.cat([hc_scale[:2], hc_scale[2:].detach()])
    return good.sinkhorn(mixes, scale, hc_base, hc_mult=hc_mult, iters=iters, eps=eps)


# -- moe_sort_chunks_by_index --------------------------------------------------------------
@mutant("moe_sort_chunks_by_index")
def scatter_instead_of_gather(inp, split_sizes, sorted_index):
    """Forward bug: chunk i is written to position sorted_index[i] (the inverse order)."""
    inverse = torch.argsort(sorted_index.long()).to(torch.int32)
    return good.moe_sort_chunks_by_index(inp, split_sizes, inverse)


class _SortNoUnpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, split_sizes, sorted_index):
        return good.moe_sort_chunks_by_index(inp, split_sizes, sorted_index)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None  # the gradient must be un-permuted


@mutant("moe_sort_chunks_by_index")
def grad_not_unpermuted(inp, split_sizes, sorted_index):
    """Backward bug: the output gradient passed back in sorted order."""
    gold._check_sort_chunks(inp, split_sizes, sorted_index)
    return _SortNoUnpermute.apply(inp, split_sizes, sorted_index)


@mutant("moe_sort_chunks_by_index_with_probs")
def probs_not_permuted(inp, split_sizes, sorted_index, probs):
    """Forward bug: probs returned in the original token order."""
    return good.moe_sort_chunks_by_index(inp, split_sizes, sorted_index), probs * 1


@mutant("moe_sort_chunks_by_index_with_probs")
def probs_grad_not_unpermuted(inp, split_sizes, sorted_index, probs):
    """Backward bug: the probs gradient passed back in sorted order."""
    gold._check_sort_chunks(inp, split_sizes, sorted_index, probs)
    out = good.moe_sort_chunks_by_index(inp, split_sizes, sorted_index)
    return out, _SortNoUnpermute.apply(probs[:, None], split_sizes, sorted_index)[:, 0]
