"""float64 goldens of the strategy guide's operators (ops.md section B, seed 001).

One math each; the implementation routes ("strategies") are kernels in
kernels/strategies/, compared on the same cases by ``verify strategies OP``.
"""
from __future__ import annotations

import math

import torch

from verify.specs.registry import Gradients, InputSpec, OutputSpec, declare_op

F32 = "fp32"
FLOATS = ["fp32", "fp16", "bf16"]
_UNIT = {"dist": "uniform", "low": -1.0, "high": 1.0}


def _check_rank(op: str, t: torch.Tensor, lo: int, hi: int, what: str) -> None:
    if not lo <= t.dim() <= hi:
        raise ValueError(f"{op}: {what} must have {lo}..{hi} dims, got {t.dim()}")


# -- GELU ------------------------------------------------------------------------------
def gelu_exact(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


@declare_op(
    "gelu",
    inputs=[InputSpec("x", dist={"dist": "normal", "std": 2.0})],
    params=dict(approximate="none"),
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "cann_v2"},
    ranks=(1, 4),
    grads=Gradients(wrt=("x",)),
    description="GELU: 0.5x(1+erf(x/sqrt 2)) (approximate='none') or the tanh "
                "approximation (approximate='tanh'), PyTorch's definition.",
)
def gelu(x, *, approximate):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return (gelu_tanh(x) if approximate == "tanh" else gelu_exact(x),)


# -- RoPE ------------------------------------------------------------------------------
def rotate(x: torch.Tensor, layout: str) -> torch.Tensor:
    """rotate_half: cat(-x2, x1) over the halves; interleaved: (-x_odd, x_even) pairs."""
    if layout == "rotate_half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    if layout == "interleaved":
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    raise ValueError(f"rope: layout must be 'rotate_half' or 'interleaved', got {layout!r}")


def _seq_dim_shape(main):
    """cos / sin are [S, D] for x [.., S, H, D]."""
    return (main[-3], main[-1])


# Real callers pass rotary tables built from positions and inverse frequencies, whose two
# halves (rotate_half) or pairs (interleaved) are equal, and kernels such as Hugging Face's
# and Liger's read only half of each. Random tables would break that contract.
ROTARY_COS = {"dist": "rotary", "part": "cos"}
ROTARY_SIN = {"dist": "rotary", "part": "sin"}


def _rope_inputs():
    return [InputSpec("x"), InputSpec("cos", shape=_seq_dim_shape, dist=ROTARY_COS),
            InputSpec("sin", shape=_seq_dim_shape, dist=ROTARY_SIN)]


def _check_rope(x, cos, sin, op="rope"):
    _check_rank(op, x, 3, 4, "x ([B,] S, H, D)")
    if x.shape[-1] % 2:
        raise ValueError(f"{op}: the head dim must be even, got {x.shape[-1]}")
    want = (x.shape[-3], x.shape[-1])
    if tuple(cos.shape) != want or tuple(sin.shape) != want:
        raise ValueError(f"{op}: cos and sin must be [S, D] = {list(want)}")


def apply_rope(x, cos, sin, layout):
    c, s = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    return x * c + rotate(x, layout) * s


@declare_op(
    "rope",
    inputs=_rope_inputs(),
    params=dict(layout="rotate_half"),
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "allclose"},
    validate=lambda x, cos, sin, **_: _check_rope(x, cos, sin),
    ranks=(3, 4),
    description="Rotary embedding y = x*cos + rotate(x)*sin; x [B, S, H, D] or [S, H, D], "
                "cos / sin [S, D]; layout rotate_half (HF Llama) or interleaved (GPT-J).",
)
def rope(x, cos, sin, *, layout):
    return (apply_rope(x, cos, sin, layout),)


# -- softmax ---------------------------------------------------------------------------
@declare_op(
    "softmax",
    inputs=[InputSpec("x", dist={"dist": "normal", "std": 2.0})],
    params={},
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    # the gradient y * (g - sum(g * y)) cancels: judged by CANN v2, not in ULPs
    standard={"name": "ulp", "outputs": {"grad_x": "cann_v2"}},
    ranks=(1, 4),
    grads=Gradients(wrt=("x",)),
    description="softmax over the last axis: exp(x - max) / sum. Judged in ULPs: CANN v1's "
                "relative error cannot be met by correctly rounded fp16 probabilities in the "
                "subnormal range.",
)
def softmax(x):
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True),)


# -- attention -------------------------------------------------------------------------
def attention_mask(s_q: int, s_kv: int, causal: bool) -> torch.Tensor | None:
    """Causal, aligned bottom-right: query i sees keys j <= i + (S_kv - S_q). With
    S_q > S_kv the first queries see no key at all: fully masked rows, whose output is 0."""
    if not causal:
        return None
    i = torch.arange(s_q)[:, None]
    j = torch.arange(s_kv)[None, :]
    return j <= i + (s_kv - s_q)


def _check_attention(q, k, v, **_):
    op = "attention"
    for name, t in dict(q=q, k=k, v=v).items():
        _check_rank(op, t, 4, 4, f"{name} [B, N, S, D]")
    if k.shape != v.shape:
        raise ValueError(f"{op}: k {list(k.shape)} and v {list(v.shape)} must match")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{op}: batch and head dim of q and k must match")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{op}: Nq = {q.shape[1]} must be a multiple of Nkv = {k.shape[1]} (GQA)")


@declare_op(
    "attention",
    inputs=[InputSpec("q"), InputSpec("k"), InputSpec("v")],
    params=dict(causal=False, scale=None, block_size=64),
    outputs=[OutputSpec("o")],
    dtypes=FLOATS,
    standard={"name": "cann_v2"},
    validate=_check_attention,
    ranks=(4, 4),
    description="Scaled dot-product attention softmax(q k^T * scale) v, scale 1/sqrt(D) by "
                "default; GQA with Nq = G * Nkv (query head h uses kv head h // G); optional "
                "causal mask aligned bottom-right; fully masked rows give 0. block_size is "
                "for blocked kernels only.",
)
def attention(q, k, v, *, causal, scale, block_size):
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = (q @ k.transpose(-1, -2)) * scale
    mask = attention_mask(q.shape[-2], k.shape[-2], causal)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m)
    denom = p.sum(dim=-1, keepdim=True)
    o = (p @ v) / torch.where(denom > 0, denom, torch.ones_like(denom))
    return (o,)


# -- MoE routing -----------------------------------------------------------------------
def _check_moe_routing(logits, *, top_k, gating, normalize, **_):
    """The router's contract: 1 <= top_k <= the experts in logits' last dim (verify hunt
    found kernels raising past it, an input the wrapper refuses)."""
    experts = logits.shape[-1] if logits.dim() else 0
    if not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ValueError(f"moe_routing: top_k must be from 1 to the {experts} experts of "
                         f"logits {list(logits.shape)}, got {top_k!r}")
    if gating not in ("sigmoid", "softmax"):
        raise ValueError(f"moe_routing: gating must be 'sigmoid' or 'softmax', got {gating!r}")


@declare_op(
    "moe_routing",
    inputs=[InputSpec("logits", dist={"dist": "normal", "std": 1.0})],
    params=dict(top_k=2, gating="sigmoid", normalize=True),
    outputs=[OutputSpec("weights", F32), OutputSpec("indices", "int64", compare="topk_set",
                                                    scores="scores"),
             OutputSpec("scores", "fp64", golden_only=True)],
    dtypes=FLOATS,
    standard={"name": "allclose"},
    validate=_check_moe_routing,
    ranks=(2, 2),
    description="MoE routing over logits [T, E]: scores = sigmoid or softmax(logits); the "
                "top_k experts by score in descending order; their scores as fp32 weights, "
                "divided by their sum when normalize. Indices compare as sets per row, "
                "tolerant of ties.",
)
def moe_routing(logits, *, top_k, gating, normalize):
    if gating == "sigmoid":
        scores = torch.sigmoid(logits)
    elif gating == "softmax":
        scores = torch.softmax(logits, dim=-1)
    else:
        raise ValueError(f"moe_routing: gating must be 'sigmoid' or 'softmax', got {gating!r}")
    weights, idx = torch.topk(scores, top_k, dim=-1, sorted=True)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, idx, scores


# -- linear ----------------------------------------------------------------------------
@declare_op(
    "linear",
    inputs=[InputSpec("x"), InputSpec("weight", shape=lambda m: (m[-1], m[-1]),
                                      dist={"dist": "normal", "std": 0.05}),
            InputSpec("bias", shape=lambda m: (m[-1],))],
    params=dict(use_bias=True),
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "cann_v2"},
    ranks=(2, 3),
    description="y = x @ weight^T (+ bias when use_bias); x [.., K], weight [N, K], bias [N].",
)
def linear(x, weight, bias, *, use_bias):
    y = x @ weight.transpose(0, 1)
    return (y + bias if use_bias else y,)


# -- embedding -------------------------------------------------------------------------
@declare_op(
    "embedding",
    inputs=[InputSpec("weight", shape=lambda m: (1000, 64)),
            InputSpec("ids", "int64", dist={"dist": "randint", "low": 0, "high": "weight.0"})],
    params={},
    outputs=[OutputSpec("out")],
    dtypes=FLOATS,
    standard={"name": "allclose", "atol": 0.0, "rtol": 0.0},
    ranks=(1, 4),
    description="Row gather out[..., :] = weight[ids[...], :] for ids of any rank (the case's "
                "main shape is the ids' shape; the table is set with shapes.weight).",
)
def embedding(weight, ids):
    return (weight[ids.to(torch.int64)],)


# -- repeat_kv -------------------------------------------------------------------------
@declare_op(
    "repeat_kv",
    inputs=[InputSpec("x")],
    params=dict(n_rep=2),
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "allclose", "atol": 0.0, "rtol": 0.0},
    ranks=(4, 4),
    description="[B, Nkv, S, D] -> [B, Nkv * n_rep, S, D], each kv head repeated n_rep times "
                "in place (expand + reshape, HF repeat_kv).",
)
def repeat_kv(x, *, n_rep):
    b, n, s, d = x.shape
    return (x[:, :, None].expand(b, n, n_rep, s, d).reshape(b, n * n_rep, s, d),)


# -- mean ------------------------------------------------------------------------------
@declare_op(
    "mean",
    inputs=[InputSpec("x", dist={"dist": "uniform", "low": 0.0, "high": 1.0})],
    params={},
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "cann_v1"},
    ranks=(1, 4),
    description="Mean over the last axis (sum / N). Inputs default to uniform [0, 1) so the "
                "mean is away from 0 and relative errors mean something.",
)
def mean(x):
    return (x.sum(dim=-1) / x.shape[-1],)


# -- fused RMSNorm + RoPE --------------------------------------------------------------
def rms_norm(x, weight, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


@declare_op(
    "rms_norm_rope",
    inputs=_rope_inputs()[:1] + [InputSpec("weight", shape=lambda m: (m[-1],),
                                           dist={"dist": "uniform", "low": 0.5, "high": 1.5})]
    + _rope_inputs()[1:],
    params=dict(eps=1e-6, layout="rotate_half"),
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "allclose"},
    validate=lambda x, weight, cos, sin, **_: _check_rope(x, cos, sin, "rms_norm_rope"),
    ranks=(3, 4),
    description="RMSNorm over the head dim (x * rsqrt(mean(x^2) + eps) * weight) followed by "
                "RoPE, as the fused q/k pre-processing of attention.",
)
def rms_norm_rope(x, weight, cos, sin, *, eps, layout):
    return (apply_rope(rms_norm(x, weight, eps), cos, sin, layout),)
