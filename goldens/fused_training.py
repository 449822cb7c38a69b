"""float64 goldens of the fused training operators (ops.md section C, seed 003: the
MindSpeed ops documents), forward and backward.

Each op declares its gradients; the harness differentiates these goldens with float64
autograd, so a golden is written once, as plain math, and is its own backward reference.
Where the documents leave a detail open, the docstring names the public reference
followed. The gated delta rule family lives in goldens/gated_delta.py.
"""
from __future__ import annotations

import torch

from verify.specs.registry import Gradients, InputSpec, OutputSpec, broadcast_length, declare_op

FLOATS = ["fp32", "fp16", "bf16"]
F32 = "fp32"
NONE = {"dist": "none"}
# CANN v2 mixed tolerance: CANN v1's relative error cannot be met by correctly rounded
# fp16 outputs in the subnormal range, which gates, clamps and gradients reach
MIXED = {"name": "cann_v2"}
_LAST = lambda main: (main[-1],)  # noqa: E731  a [D] parameter of x [..., D]


def _same_shape(op: str, **tensors) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if v is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{op}: {', '.join(shapes)} must have the same shape, got {shapes}")


# -- add_rms_norm_bias -------------------------------------------------------------------
def _check_add_rms_norm_bias(x1, x2, gamma, beta=None, **_):
    op = "add_rms_norm_bias"
    _same_shape(op, x1=x1, x2=x2)
    if gamma.dim() < 1 or gamma.dim() > x1.dim() \
            or tuple(x1.shape[x1.dim() - gamma.dim():]) != tuple(gamma.shape):
        raise ValueError(f"{op}: gamma {list(gamma.shape)} must equal the trailing dims of "
                         f"x1 {list(x1.shape)}")
    if beta is not None and tuple(beta.shape) != tuple(gamma.shape):
        raise ValueError(f"{op}: beta {list(beta.shape)} must have gamma's shape "
                         f"{list(gamma.shape)}")


def norm_dims(x: torch.Tensor, gamma: torch.Tensor) -> tuple[int, ...]:
    """The dims normalised: gamma's trailing dims of x."""
    return tuple(range(x.dim() - gamma.dim(), x.dim()))


@declare_op(
    "add_rms_norm_bias",
    inputs=[InputSpec("x1"), InputSpec("x2"), InputSpec("gamma", shape=_LAST),
            InputSpec("beta", shape=_LAST, dist=NONE, optional=True)],
    params=dict(epsilon=1e-6),
    outputs=[OutputSpec("y"), OutputSpec("rstd", F32), OutputSpec("x")],
    dtypes=FLOATS,
    standard=MIXED,
    validate=_check_add_rms_norm_bias,
    ranks=(1, 8),
    grads=Gradients(wrt=("x1", "x2", "gamma", "beta"), of=("y", "x"),
                    reduced={"gamma": broadcast_length("gamma", "x1"),
                             "beta": broadcast_length("beta", "x1")}),
    # Liger and Hugging Face round x = x1 + x2 to the working dtype and normalise that
    reuse={"x": lambda ins, x: {**ins, "x1": x, "x2": torch.zeros_like(x)}},
    description="x = x1 + x2; rstd = 1/sqrt(mean(x^2 over gamma's trailing dims) + eps); "
                "y = x*rstd*gamma (+ beta). Outputs (y, rstd, x); rstd keeps the leading dims "
                "with 1 for each normalised dim (x [2,4,8,64], gamma [8,64]: rstd [2,4,1,1]).",
)
def add_rms_norm_bias(x1, x2, gamma, beta, *, epsilon):
    """Formula of the MindSpeed npu_add_rms_norm_bias document. Gradients flow from y and
    from the x output (the residual stream); rstd is a saved statistic, not differentiated
    (as in the aclnn AddRmsNorm backward)."""
    _check_add_rms_norm_bias(x1, x2, gamma, beta)
    x = x1 + x2
    dims = norm_dims(x, gamma)
    rstd = 1.0 / torch.sqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = x * rstd * gamma
    if beta is not None:
        y = y + beta
    return y, rstd, x


# -- rmsnorm_without_weight --------------------------------------------------------------
@declare_op(
    "rmsnorm_without_weight",
    inputs=[InputSpec("x")],
    params=dict(eps=1e-6),
    outputs=[OutputSpec("rstd")],
    dtypes=FLOATS,
    standard=MIXED,
    ranks=(1, 4),
    grads=Gradients(wrt=("x",)),
    description="rstd = rsqrt(mean(x^2, -1) + eps), keepdim: [..., 1]. The document's "
                "sample checks RmsnormWithoutWeightFunction against exactly this.",
)
def rmsnorm_without_weight(x, *, eps):
    """The MindSpeed document's reference line: torch.rsqrt(x.square().mean(-1,
    keepdim=True) + eps); its gradient is -rstd^3 * x / D times the upstream."""
    return (torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps),)


# -- rms_norm_gated ----------------------------------------------------------------------
ACTIVATIONS = ("swish", "silu", "sigmoid")


def _check_rms_norm_gated(x, g, weight, bias=None, residual=None, activation="swish", **_):
    op = "rms_norm_gated"
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if x.dim() not in (2, 3):
        raise ValueError(f"{op}: x must be [B, T, D] or [T, D], got {list(x.shape)}")
    _same_shape(op, x=x, g=g, residual=residual)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (x.shape[-1],):
            raise ValueError(f"{op}: {name} must be [D] = [{x.shape[-1]}], got {list(t.shape)}")


def gate(g: torch.Tensor, activation: str) -> torch.Tensor:
    """swish and silu are the same: g * sigmoid(g); sigmoid: sigmoid(g)."""
    return g * torch.sigmoid(g) if activation in ("swish", "silu") else torch.sigmoid(g)


@declare_op(
    "rms_norm_gated",
    inputs=[InputSpec("x"), InputSpec("g"),
            InputSpec("weight", shape=_LAST, dist={"dist": "normal", "mean": 1.0, "std": 0.1}),
            InputSpec("bias", shape=_LAST, dist=NONE, optional=True),
            InputSpec("residual", dist=NONE, optional=True)],
    params=dict(activation="swish", prenorm=False, eps=1e-6),
    outputs=[OutputSpec("y"), OutputSpec("residual_out", when=lambda p: bool(p["prenorm"]))],
    dtypes=FLOATS,
    standard=MIXED,
    validate=_check_rms_norm_gated,
    ranks=(2, 3),
    grads=Gradients(wrt=("x", "g", "weight", "bias", "residual"),
                    reduced={"weight": broadcast_length("weight", "x"),
                             "bias": broadcast_length("bias", "x")}),
    # prenorm kernels may round h = x + residual (residual_out) and normalise that
    reuse={"residual_out": lambda ins, h: {
        **ins, "x": h, "residual": None if ins["residual"] is None else torch.zeros_like(h)}},
    description="h = x + residual; y = rmsnorm(h) * weight (+ bias) * act(g), act swish / "
                "silu (g*sigmoid(g)) or sigmoid; prenorm also returns residual_out = h.",
)
def rms_norm_gated(x, g, weight, bias, residual, *, activation, prenorm, eps):
    """Follows flash-linear-attention's fused_norm_gate (the MindSpeed document's
    reference): the norm is over the last dim, the bias is added before the gate."""
    _check_rms_norm_gated(x, g, weight, bias, residual, activation)
    h = x if residual is None else x + residual
    y = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * weight
    if bias is not None:
        y = y + bias
    y = y * gate(g, activation)
    return (y, h) if prenorm else (y,)


# -- clipped_swiglu ----------------------------------------------------------------------
def _check_clipped_swiglu(gate_up, alpha=1.702, limit=7.0, **_):
    if gate_up.shape[-1] % 2:
        raise ValueError(f"clipped_swiglu: the last dim of gate_up must be even (2K), got "
                         f"{gate_up.shape[-1]}")
    if limit < 0:
        raise ValueError(f"clipped_swiglu: swiglu_limit must be >= 0, got {limit}")


def _half_last(main):
    return tuple(main[:-1]) + (main[-1] // 2,)


@declare_op(
    "clipped_swiglu",
    inputs=[InputSpec("gate_up", dist={"dist": "normal", "std": 3.0})],
    params=dict(alpha=1.702, limit=7.0),
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard=MIXED,
    validate=_check_clipped_swiglu,
    ranks=(1, 4),
    grads=Gradients(wrt=("gate_up",)),
    description="gate = gate_up[..., :K] clamped above at limit, up = gate_up[..., K:] "
                "clamped to [-limit, limit]; y = gate*sigmoid(alpha*gate) * (up + 1).",
)
def clipped_swiglu(gate_up, *, alpha, limit):
    """The gpt-oss formulation (openai/gpt-oss swiglu), which the document's defaults
    (alpha 1.702, limit 7.0) come from. Clamped elements get no gradient."""
    _check_clipped_swiglu(gate_up, alpha, limit)
    k = gate_up.shape[-1] // 2
    g = gate_up[..., :k].clamp(max=limit)
    u = gate_up[..., k:].clamp(min=-limit, max=limit)
    return (g * torch.sigmoid(alpha * g) * (u + 1.0),)


# -- fused_cross_entropy -----------------------------------------------------------------
def _check_cross_entropy(logits, weight, labels, ignore_index=-100, reduction="sum", **_):
    op = "fused_cross_entropy"
    if reduction not in ("sum", "none"):
        raise ValueError(f"{op}: reduction must be 'sum' or 'none', got {reduction!r}")
    if logits.dim() != 2:
        raise ValueError(f"{op}: logits must be [N, V], got {list(logits.shape)}")
    n, v = logits.shape
    if tuple(weight.shape) != (n,) or tuple(labels.shape) != (n,):
        raise ValueError(f"{op}: weight and labels must be [N] = [{n}], got "
                         f"{list(weight.shape)} and {list(labels.shape)}")
    lab = labels.long()
    bad = (lab != ignore_index) & ((lab < 0) | (lab >= v))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{op}: label {int(lab[i])} at token {i} is outside [0, {v}) and is "
                         f"not ignore_index {ignore_index}")


def _logsumexp(x):
    """logsumexp over the last dim as max + log(sum(exp(x - max))), the max held constant:
    its gradient is then exp(x - max) / sum(...), the softmax, at any magnitude.
    torch.logsumexp's gradient is exp(x - lse), which is 1 for each of k tied logits once
    log(k) is under lse's ulp (|x| past ~1e16 in float64): k times the softmax (found by
    verify hunt with logits at +-1.7e38)."""
    m = x.detach().amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf / inf rows
    return (m + torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True)))[..., 0]


def _weighted_ce(logits, weight, labels, ignore_index, reduction, lse):
    _check_cross_entropy(logits, weight, labels, ignore_index, reduction)
    lab = labels.long()
    keep = lab != ignore_index
    picked = logits.gather(-1, torch.where(keep, lab, 0)[:, None])[:, 0]
    ce = lse(logits) - picked
    per_token = torch.where(keep, weight * ce, torch.zeros_like(ce))
    return (per_token.sum() if reduction == "sum" else per_token,)


def _cross_entropy_as_kernels_compute_it(logits, weight, labels, *, ignore_index,
                                         reduction):
    """The compute-precision floor: logsumexp(x) - x[label] by torch.logsumexp, the way
    Megatron-style kernels compute it in fp32. Its gradient exp(x - lse) rounds p before
    p - 1, which a confident token's true-class gradient shows (~1e-3 of p - 1): the error
    a correct fp32 kernel of the usual algorithm has. The float64 golden takes the
    stable form (_logsumexp), exact at any magnitude."""
    return _weighted_ce(logits, weight, labels, ignore_index, reduction,
                        lambda x: torch.logsumexp(x, dim=-1))


@declare_op(
    "fused_cross_entropy",
    inputs=[InputSpec("logits", dist={"dist": "normal", "std": 2.0}),
            InputSpec("weight", shape=lambda m: (m[0],),
                      dist={"dist": "uniform", "low": 0.0, "high": 1.0}),
            InputSpec("labels", "int32", shape=lambda m: (m[0],),
                      dist={"dist": "randint", "low": 0, "high": "logits.1"})],
    params=dict(ignore_index=-100, reduction="sum"),
    outputs=[OutputSpec("loss", F32)],
    dtypes=FLOATS,
    standard=MIXED,
    validate=_check_cross_entropy,
    ranks=(2, 2),
    grads=Gradients(wrt=("logits", "weight")),
    compute_floor=_cross_entropy_as_kernels_compute_it,
    description="Per-token cross entropy logsumexp(logits) - logits[label], times the "
                "token weight, 0 for ignore_index; reduction 'sum' gives the fp32 scalar "
                "loss, 'none' the [N] weighted losses.",
)
def fused_cross_entropy(logits, weight, labels, *, ignore_index, reduction):
    """FusedCrossEntropyLossFunction (MindSpeed): the loss is the sum of the weighted token
    cross entropies (not a mean); ignored tokens contribute nothing and get no gradient."""
    return _weighted_ce(logits, weight, labels, ignore_index, reduction, _logsumexp)


# -- mhc_post ----------------------------------------------------------------------------
def _check_mhc_post(x, residual, h_post, h_res, **_):
    op = "mhc_post"
    if residual.dim() != 4:
        raise ValueError(f"{op}: residual must be [B, S, N, D], got {list(residual.shape)}")
    b, s, n, d = residual.shape
    want = {"x": (b, s, d), "h_post": (b, s, n), "h_res": (b, s, n, n)}
    for name, t in (("x", x), ("h_post", h_post), ("h_res", h_res)):
        if tuple(t.shape) != want[name]:
            raise ValueError(f"{op}: {name} must be {list(want[name])} for residual "
                             f"{list(residual.shape)}, got {list(t.shape)}")


def _n_of(main):
    return tuple(main[:3])


def _nn_of(main):
    return tuple(main[:3]) + (main[2],)


def _bsd_of(main):
    return (main[0], main[1], main[3])


def _d_terms(shapes):
    """grad_h_post and grad_h_res sum over the D columns of each stream."""
    return shapes["residual"][-1]


@declare_op(
    "mhc_post",
    inputs=[InputSpec("x", shape=_bsd_of), InputSpec("residual"),
            # as mHC's pre-step makes them: h_post = 2*sigmoid(.) in (0, 2), h_res out of
            # sinkhorn (doubly stochastic)
            InputSpec("h_post", F32, shape=_n_of, dist={"dist": "uniform", "low": 0.0,
                                                        "high": 2.0}),
            InputSpec("h_res", F32, shape=_nn_of, dist={"dist": "doubly_stochastic"})],
    params={},
    outputs=[OutputSpec("out")],
    dtypes=FLOATS,
    standard=MIXED,
    validate=_check_mhc_post,
    ranks=(4, 4),
    grads=Gradients(wrt=("x", "residual", "h_post", "h_res"),
                    reduced={"h_post": _d_terms, "h_res": _d_terms,
                             "x": lambda shapes: shapes["residual"][2]}),
    description="out[b,s,i,d] = h_post[b,s,i]*x[b,s,d] + sum_j h_res[b,s,j,i]*"
                "residual[b,s,j,d], h_res in the user's layout [B,S,N,N]; fp32 inside.",
)
def mhc_post(x, residual, h_post, h_res):
    """The MindSpeed mHC post document after its fix: h_res enters transposed
    (sum over its first stream index j); grad_h_res is returned in the user's layout."""
    _check_mhc_post(x, residual, h_post, h_res)
    mixed = torch.einsum("bsji,bsjd->bsid", h_res, residual)
    return (h_post[..., :, None] * x[..., None, :] + mixed,)


# -- sinkhorn (hyper-connection split) ---------------------------------------------------
def _check_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, iters=20, **_):
    op = "sinkhorn"
    if hc_mult != 4:
        raise ValueError(f"{op}: hc_mult must be 4 (the only value supported), got {hc_mult}")
    feat = (2 + hc_mult) * hc_mult
    if mixes.dim() != 3 or mixes.shape[-1] != feat:
        raise ValueError(f"{op}: mixes must be [B, S, (2+hc)*hc] = [B, S, {feat}], got "
                         f"{list(mixes.shape)}")
    if tuple(hc_scale.shape) != (3,) or tuple(hc_base.shape) != (feat,):
        raise ValueError(f"{op}: hc_scale must be [3] and hc_base [{feat}], got "
                         f"{list(hc_scale.shape)} and {list(hc_base.shape)}")
    if iters < 1:
        raise ValueError(f"{op}: sinkhorn_iters must be >= 1, got {iters}")


def _tokens_times(k):
    return lambda shapes: shapes["mixes"][0] * shapes["mixes"][1] * k


@declare_op(
    "sinkhorn",
    inputs=[InputSpec("mixes"), InputSpec("hc_scale", F32, shape=lambda m: (3,)),
            InputSpec("hc_base", F32, shape=lambda m: (m[-1],))],
    params=dict(hc_mult=4, iters=20, eps=1e-6),
    outputs=[OutputSpec("pre"), OutputSpec("post"), OutputSpec("comb")],
    dtypes=FLOATS,
    standard=MIXED,
    validate=_check_sinkhorn,
    ranks=(3, 3),
    # the shape rule the hunt cannot guess: mixes' last dim is (2 + hc) hc = 24, hc = 4
    hunt={"last_dim": [24], "params": {"hc_mult": []}},
    grads=Gradients(wrt=("mixes", "hc_scale", "hc_base"),
                    reduced={"hc_scale": _tokens_times(16), "hc_base": _tokens_times(1)}),
    description="HC-split Sinkhorn: pre = sigmoid(m_pre*s0 + b_pre) + eps, post = "
                "2*sigmoid(m_post*s1 + b_post), comb = Sinkhorn(exp(l - rowmax(l))) with "
                "l = m_comb*s2 + b_comb over [hc, hc], iters rounds of row then column "
                "normalisation (each sum + eps).",
)
def sinkhorn(mixes, hc_scale, hc_base, *, hc_mult, iters, eps):
    """The MindSpeed(-MM) hc_split_sinkhorn (SinkhornFunction) formulation, which the
    document describes: pre gets + eps, post is 2*sigmoid, the comb logits are
    exponentiated after a row max and normalised rows first, each sum taking + eps."""
    _check_sinkhorn(mixes, hc_scale, hc_base, hc_mult, iters)
    hc = hc_mult
    lead = mixes.shape[:-1]
    pre = torch.sigmoid(mixes[..., :hc] * hc_scale[0] + hc_base[:hc]) + eps
    post = 2.0 * torch.sigmoid(mixes[..., hc:2 * hc] * hc_scale[1] + hc_base[hc:2 * hc])
    logits = (mixes[..., 2 * hc:].reshape(*lead, hc, hc) * hc_scale[2]
              + hc_base[2 * hc:].reshape(hc, hc))
    comb = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    for _ in range(iters):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


# -- moe_sort_chunks_by_index ------------------------------------------------------------
def _check_sort_chunks(inp, split_sizes, sorted_index, probs=None, check_dtypes=True, **_):
    op = "moe_sort_chunks_by_index"
    for name, t in (("split_sizes", split_sizes), ("sorted_index", sorted_index)):
        if check_dtypes and t.dtype != torch.int32:
            raise TypeError(f"{op}: {name} must be int32, got {t.dtype}")
    if inp.dim() != 2:
        raise ValueError(f"{op}: inp must be [num_tokens, hidden], got {list(inp.shape)}")
    sizes, order = split_sizes.long(), sorted_index.long()
    if sizes.shape != order.shape or sizes.dim() != 1:
        raise ValueError(f"{op}: split_sizes and sorted_index must be [num_splits]")
    if bool((sizes < 0).any()) or int(sizes.sum()) != inp.shape[0]:
        raise ValueError(f"{op}: split_sizes must be >= 0 and sum to num_tokens "
                         f"{inp.shape[0]}, got sum {int(sizes.sum())}")
    if sorted(order.tolist()) != list(range(order.numel())):
        raise ValueError(f"{op}: sorted_index must be a permutation of 0..{order.numel() - 1}")
    if probs is not None and tuple(probs.shape) != (inp.shape[0],):
        raise ValueError(f"{op}: probs must be [num_tokens] = [{inp.shape[0]}]")


def sort_chunks(t: torch.Tensor, sizes, order) -> torch.Tensor:
    """Rows split into chunks of ``sizes``; chunk order[i] becomes the i-th chunk."""
    chunks = torch.split(t, [int(s) for s in sizes])
    return torch.cat([chunks[int(i)] for i in order], dim=0)


_SPLITS = [InputSpec("split_sizes", "int32", shape=lambda m: (8,),
                     dist={"dist": "partition", "total": "inp.0"}),
           InputSpec("sorted_index", "int32", shape=lambda m: (8,),
                     dist={"dist": "permutation"})]
_EXACT = {"name": "allclose", "atol": 0.0, "rtol": 0.0}


@declare_op(
    "moe_sort_chunks_by_index",
    inputs=[InputSpec("inp")] + _SPLITS,
    params={},
    outputs=[OutputSpec("out")],
    dtypes=FLOATS,
    standard=_EXACT,
    validate=_check_sort_chunks,
    ranks=(2, 2),
    grads=Gradients(wrt=("inp",)),
    description="Rows of inp split by split_sizes; the chunks are concatenated in the "
                "order sorted_index gives. A pure move: compared bit for bit.",
)
def moe_sort_chunks_by_index(inp, split_sizes, sorted_index):
    """TransformerEngine's moe_sort_chunks_by_index semantics (the document's reference):
    output = cat(chunks[sorted_index[0]], chunks[sorted_index[1]], ...)."""
    _check_sort_chunks(inp, split_sizes, sorted_index, check_dtypes=False)
    return (sort_chunks(inp, split_sizes.long(), sorted_index.long()),)


@declare_op(
    "moe_sort_chunks_by_index_with_probs",
    inputs=[InputSpec("inp")] + _SPLITS
    + [InputSpec("probs", shape=lambda m: (m[0],),
                 dist={"dist": "uniform", "low": 0.0, "high": 1.0})],
    params={},
    outputs=[OutputSpec("out"), OutputSpec("probs_out")],
    dtypes=FLOATS,
    standard=_EXACT,
    validate=_check_sort_chunks,
    ranks=(2, 2),
    grads=Gradients(wrt=("inp", "probs")),
    description="moe_sort_chunks_by_index that moves the per-token probs with their rows.",
)
def moe_sort_chunks_by_index_with_probs(inp, split_sizes, sorted_index, probs):
    _check_sort_chunks(inp, split_sizes, sorted_index, probs, check_dtypes=False)
    sizes, order = split_sizes.long(), sorted_index.long()
    return (sort_chunks(inp, sizes, order),
            sort_chunks(probs[:, None], sizes, order)[:, 0])

