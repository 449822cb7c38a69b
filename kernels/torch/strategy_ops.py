"""Working-precision torch kernels of the strategy guide's ops: fp32 math inside, outputs
in the working dtype. Each is the route the guide recommends; the other routes are in
kernels/strategies/."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from verify.goldens import strategy_ops as g
from verify.specs.registry import kernel

F32 = torch.float32


@kernel("gelu")
def gelu(x, *, approximate="none"):
    return F.gelu(x.to(F32), approximate=approximate).to(x.dtype)


@kernel("rope")
def rope(x, cos, sin, *, layout="rotate_half"):
    g._check_rope(x, cos, sin)
    return g.apply_rope(x.to(F32), cos.to(F32), sin.to(F32), layout).to(x.dtype)


@kernel("softmax")
def softmax(x):
    return torch.softmax(x.to(F32), dim=-1).to(x.dtype)


def attention_operands(q, k, v, causal, scale):
    """Checked fp32 q, k, v with kv heads expanded for GQA, the scale, the causal mask."""
    g._check_attention(q, k, v)
    group = q.shape[1] // k.shape[1]
    kf = k.to(F32).repeat_interleave(group, dim=1)
    vf = v.to(F32).repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return q.to(F32), kf, vf, scale, g.attention_mask(q.shape[-2], k.shape[-2], causal)


def attention_fp32(q, k, v, causal, scale):
    """Whole-row attention in fp32: scores, softmax, PV (fully masked rows give 0)."""
    qf, kf, vf, scale, mask = attention_operands(q, k, v, causal, scale)
    scores = (qf @ kf.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask.to(scores.device), -math.inf)
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m)
    denom = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, torch.ones_like(denom))
    return p, vf


@kernel("attention")
def attention(q, k, v, *, causal=False, scale=None, block_size=64):
    p, vf = attention_fp32(q, k, v, causal, scale)
    return (p @ vf).to(q.dtype)


def route(logits, top_k, gating, normalize):
    x = logits.to(F32)
    scores = torch.sigmoid(x) if gating == "sigmoid" else torch.softmax(x, dim=-1)
    w, idx = torch.topk(scores, top_k, dim=-1, sorted=True)
    if normalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, idx


@kernel("moe_routing")
def moe_routing(logits, *, top_k=2, gating="sigmoid", normalize=True):
    if gating not in ("sigmoid", "softmax"):
        raise ValueError(f"moe_routing: unknown gating {gating!r}")
    return route(logits, top_k, gating, normalize)


@kernel("linear")
def linear(x, weight, bias, *, use_bias=True):
    y = x.to(F32) @ weight.to(F32).transpose(0, 1)
    return (y + bias.to(F32) if use_bias else y).to(x.dtype)


@kernel("embedding")
def embedding(weight, ids):
    return F.embedding(ids, weight)


@kernel("repeat_kv")
def repeat_kv(x, *, n_rep=2):
    b, n, s, d = x.shape
    return x[:, :, None].expand(b, n, n_rep, s, d).reshape(b, n * n_rep, s, d)


@kernel("mean")
def mean(x):
    return x.to(F32).mean(dim=-1).to(x.dtype)


@kernel("rms_norm_rope")
def rms_norm_rope(x, weight, cos, sin, *, eps=1e-6, layout="rotate_half"):
    g._check_rope(x, cos, sin, "rms_norm_rope")
    n = g.rms_norm(x.to(F32), weight.to(F32), eps)
    return g.apply_rope(n, cos.to(F32), sin.to(F32), layout).to(x.dtype)
