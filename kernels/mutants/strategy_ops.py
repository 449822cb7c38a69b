"""Known-bug kernels of the strategy guide's ops: each the correct kernel with one real bug."""
from __future__ import annotations

import torch

from verify.kernels.torch import strategy_ops as good
from verify.specs.registry import kernel

F32 = torch.float32


def mutant(op):
    return kernel(op, backend="mutants")


@mutant("gelu")
def erf_argument_not_scaled(x, *, approximate="none"):
    """0.5x(1 + erf(x)) instead of erf(x / sqrt 2)."""
    xf = x.to(F32)
    return (0.5 * xf * (1 + torch.erf(xf))).to(x.dtype)


@mutant("rope")
def rotate_half_sign_flipped(x, cos, sin, *, layout="rotate_half"):
    """The rotated half negated on the wrong side: cat(x2, -x1)."""
    return good.rope(x, cos, -sin, layout=layout)


@mutant("softmax")
def no_max_subtraction(x):
    """exp(x) / sum in the input's dtype without subtracting the row max: overflows."""
    e = torch.exp(x)
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


@mutant("attention")
def missing_scale(q, k, v, *, causal=False, scale=None, block_size=64):
    """Scores not scaled by 1/sqrt(D)."""
    return good.attention(q, k, v, causal=causal, scale=1.0)


@mutant("attention")
def gqa_heads_tiled(q, k, v, *, causal=False, scale=None, block_size=64):
    """GQA with kv heads repeated as a tile (head h uses kv head h % Nkv, not h // G)."""
    group = q.shape[1] // k.shape[1]
    return good.attention(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1),
                          causal=causal, scale=scale)


@mutant("moe_routing")
def weights_not_normalized(logits, *, top_k=2, gating="sigmoid", normalize=True):
    """The normalize flag ignored: raw scores returned as weights."""
    return good.route(logits, top_k, gating, False)


@mutant("linear")
def bias_dropped(x, weight, bias, *, use_bias=True):
    """The bias never added."""
    return good.linear(x, weight, bias, use_bias=False)


@mutant("embedding")
def ids_off_by_one(weight, ids):
    """1-based ids assumed: row ids - 1 (clamped at 0)."""
    return weight[(ids - 1).clamp_min(0)]


@mutant("repeat_kv")
def heads_tiled(x, *, n_rep=2):
    """repeat() instead of expand + reshape: heads come out as [h0, h1, h0, h1]."""
    return x.repeat(1, n_rep, 1, 1)


@mutant("mean")
def divides_by_n_minus_1(x):
    """sum / (N - 1)."""
    return (x.to(F32).sum(dim=-1) / max(x.shape[-1] - 1, 1)).to(x.dtype)


@mutant("rms_norm_rope")
def weight_not_applied(x, weight, cos, sin, *, eps=1e-6, layout="rotate_half"):
    """RMSNorm without its weight."""
    return good.rms_norm_rope(x, torch.ones_like(weight), cos, sin, eps=eps, layout=layout)

