"""The strategy guide's implementation routes (ops.md section B), one kernel each, under
the backend ``strategies``: ``verify strategies OP`` runs them on the same cases and ranks
them by precision and time. Some are known-bad routes (bf16 accumulation of a mean), kept
here to show where they fail."""
from __future__ import annotations

import math

import torch

from verify.goldens import strategy_ops as g
from verify.kernels.torch import gated_delta as gdr
from verify.kernels.torch import strategy_ops as base
from verify.specs.registry import kernel

F32, BF16 = torch.float32, torch.bfloat16


def strategy(op: str, name: str):
    return kernel(op, backend="strategies", name=name)


# -- GELU ------------------------------------------------------------------------------
@strategy("gelu", "tanh")
def gelu_tanh(x, *, approximate="none"):
    """tanh approximation in fp32, whatever the case asks."""
    return g.gelu_tanh(x.to(F32)).to(x.dtype)


@strategy("gelu", "erf")
def gelu_erf(x, *, approximate="none"):
    """Exact erf form in fp32, whatever the case asks."""
    return g.gelu_exact(x.to(F32)).to(x.dtype)


# -- RoPE ------------------------------------------------------------------------------
@strategy("rope", "concat_negate")
def rope_concat(x, cos, sin, *, layout="rotate_half"):
    """Build the rotated tensor with cat / stack and a negation, then x*cos + rot*sin."""
    return base.rope(x, cos, sin, layout=layout)


@strategy("rope", "even_odd")
def rope_even_odd(x, cos, sin, *, layout="rotate_half"):
    """Write each half (or each even / odd lane) of the output from its own formula, no
    rotated copy of x."""
    g._check_rope(x, cos, sin)
    xf, c, s = x.to(F32), cos.to(F32)[:, None, :], sin.to(F32)[:, None, :]
    out = torch.empty_like(xf)
    d = x.shape[-1]
    if layout == "rotate_half":
        a, b = slice(0, d // 2), slice(d // 2, d)
    elif layout == "interleaved":
        a, b = slice(0, d, 2), slice(1, d, 2)
    else:
        raise ValueError(f"rope: unknown layout {layout!r}")
    out[..., a] = xf[..., a] * c[..., a] - xf[..., b] * s[..., a]
    out[..., b] = xf[..., b] * c[..., b] + xf[..., a] * s[..., b]
    return out.to(x.dtype)


# -- attention -------------------------------------------------------------------------
@strategy("attention", "whole_row")
def attention_whole_row(q, k, v, *, causal=False, scale=None, block_size=64):
    """softmax over the whole key row, then PV, all fp32 (O(S_kv) memory per row)."""
    return base.attention(q, k, v, causal=causal, scale=scale)


@strategy("attention", "online_softmax")
def attention_online(q, k, v, *, causal=False, scale=None, block_size=64):
    """KV in blocks of block_size: running max, running sum, output rescaled (fp32)."""
    qf, kf, vf, scale, mask = base.attention_operands(q, k, v, causal, scale)
    shape = q.shape[:-1] + (1,)
    m = torch.full(shape, -math.inf)
    l = torch.zeros(shape)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],))
    for j0 in range(0, k.shape[-2], int(block_size)):
        j1 = min(j0 + int(block_size), k.shape[-2])
        s = (qf @ kf[..., j0:j1, :].transpose(-1, -2)) * scale
        if mask is not None:
            s = s.masked_fill(~mask[:, j0:j1], -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ vf[..., j0:j1, :]
        m = m_new
    return (acc / torch.where(l > 0, l, torch.ones_like(l))).to(q.dtype)


def _bf16(t):
    return t.to(BF16).to(F32)


@strategy("attention", "bf16_pv")
def attention_bf16_pv(q, k, v, *, causal=False, scale=None, block_size=64):
    """Probabilities cast to bf16 before the PV matmul (fp32 accumulation)."""
    p, vf = base.attention_fp32(q, k, v, causal, scale)
    return (_bf16(p) @ vf).to(q.dtype)


@strategy("attention", "bf16_pv_split")
def attention_bf16_pv_split(q, k, v, *, causal=False, scale=None, block_size=64):
    """Probabilities split into a bf16 high part and a bf16 low part, two PV matmuls."""
    p, vf = base.attention_fp32(q, k, v, causal, scale)
    hi = _bf16(p)
    lo = _bf16(p - hi)
    return (hi @ vf + lo @ vf).to(q.dtype)


# -- MoE routing -----------------------------------------------------------------------
@strategy("moe_routing", "sigmoid_gating")
def moe_sigmoid(logits, *, top_k=2, gating="sigmoid", normalize=True):
    """sigmoid, normalise by the sum of the chosen, top-k (whatever the case asks)."""
    return base.route(logits, top_k, "sigmoid", normalize)


@strategy("moe_routing", "softmax_gating")
def moe_softmax(logits, *, top_k=2, gating="sigmoid", normalize=True):
    """softmax, top-k (whatever the case asks)."""
    return base.route(logits, top_k, "softmax", normalize)


# -- linear ----------------------------------------------------------------------------
@strategy("linear", "matmul_then_add")
def linear_two_ops(x, weight, bias, *, use_bias=True):
    """Two ops: the matmul's output is written in the working dtype, then the bias is added
    and rounded again."""
    y = (x.to(F32) @ weight.to(F32).transpose(0, 1)).to(x.dtype)
    return (y.to(F32) + bias.to(F32)).to(x.dtype) if use_bias else y


@strategy("linear", "fused_bias")
def linear_fused(x, weight, bias, *, use_bias=True):
    """Bias added to the fp32 accumulator (addmm), one rounding."""
    return base.linear(x, weight, bias, use_bias=use_bias)


# -- embedding -------------------------------------------------------------------------
@strategy("embedding", "gather")
def embedding_gather(weight, ids):
    """weight[ids] with multi-dim ids."""
    return weight[ids]


@strategy("embedding", "index_select")
def embedding_index_select(weight, ids):
    """index_select on the flattened ids, reshaped back."""
    return weight.index_select(0, ids.reshape(-1)).reshape(*ids.shape, weight.shape[-1])


# -- mean ------------------------------------------------------------------------------
@strategy("mean", "fp32_accumulation")
def mean_fp32(x):
    """Cast to fp32 before the sum (the guide's rule)."""
    return base.mean(x)


@strategy("mean", "bf16_accumulation")
def mean_bf16(x):
    """The known-bad route: a running sum kept in bf16, rounded after every add."""
    acc = torch.zeros(x.shape[:-1], dtype=BF16)
    xb = x.to(BF16)
    for j in range(x.shape[-1]):
        acc = acc + xb[..., j]
    return (acc.to(F32) / x.shape[-1]).to(x.dtype)


# -- RMSNorm + RoPE --------------------------------------------------------------------
@strategy("rms_norm_rope", "separate")
def rms_norm_rope_separate(x, weight, cos, sin, *, eps=1e-6, layout="rotate_half"):
    """Two ops: RMSNorm writes its output in the working dtype, RoPE reads it back."""
    n = g.rms_norm(x.to(F32), weight.to(F32), eps).to(x.dtype)
    return base.rope(n, cos, sin, layout=layout)


@strategy("rms_norm_rope", "fused")
def rms_norm_rope_fused(x, weight, cos, sin, *, eps=1e-6, layout="rotate_half"):
    """One kernel: the normalised values stay fp32 into RoPE."""
    return base.rms_norm_rope(x, weight, cos, sin, eps=eps, layout=layout)


# -- chunk_gated_delta_rule: the exp clamp of gate differences -------------------------
strategy("chunk_gated_delta_rule", "exp_clamp_upper_0")(gdr.gated_delta_kernel(
    gdr.clamped_decay, doc="exp(min(g_i - g_j, 0)) under the causal mask: exact, no overflow."))
strategy("chunk_gated_delta_rule", "exp_clamp_-9_0")(gdr.gated_delta_kernel(
    gdr.doc_clamped_decay, doc="exp(clamp(g_i - g_j, -9, 0)), the document's clamp: biased "
    "once a chunk's gates span more than 9."))
