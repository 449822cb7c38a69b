"""float64 goldens of the framework calls real models make most: rms_norm, silu, swiglu
and layer_norm, each bound to its torch / torch_npu calls (``calls=``) so that recorded
calls of a model (``verify judge``) are judged against them.

Definitions (PyTorch's and torch_npu's documented math):
- rms_norm: y = x * rsqrt(mean(x^2, -1) + eps) * weight; npu_rms_norm also returns
  rstd = rsqrt(mean(x^2) + eps) [..., 1] in fp32.
- silu: x * sigmoid(x).
- swiglu (npu_swiglu(x, dim)): a, b = chunk(x, 2, dim); silu(a) * b.
- layer_norm: (x - mean) / sqrt(var + eps) * weight + bias, var the biased variance.
"""
from __future__ import annotations

import math

import torch

from verify.specs.bindings import Call, NotCovered
from verify.specs.registry import Gradients, InputSpec, OutputSpec, broadcast_length, declare_op

FLOATS = ["fp32", "fp16", "bf16"]
_LAST = lambda main: (main[-1],)  # noqa: E731  a [D] parameter of x [..., D]
_WEIGHT = {"dist": "uniform", "low": 0.5, "high": 1.5}


def _flat_norm(x, normalized_shape, *params):
    """F.rms_norm / F.layer_norm normalise the last len(normalized_shape) dims: the op
    normalises the last one, so those dims are flattened into it (parameters too)."""
    shape = [int(n) for n in ([normalized_shape] if isinstance(normalized_shape, int)
                              else normalized_shape)]
    if list(x.shape[len(x.shape) - len(shape):]) != shape:
        raise ValueError(f"normalized_shape {shape} is not the last dims of x "
                         f"{list(x.shape)}")
    d = math.prod(shape)
    flat = x.reshape(*x.shape[:x.dim() - len(shape)], d)
    return (flat,) + tuple(None if p is None else p.reshape(d) for p in params)


def _unflat(recorded, x, normalized_shape, *rest, **kw):
    return {"y": recorded[0].reshape(*_flat_norm(x, normalized_shape)[0].shape)}


# -- rms_norm ----------------------------------------------------------------------------
def _rms_norm_call(input, normalized_shape, weight=None, eps=None):
    x, w = _flat_norm(input, normalized_shape, weight)
    if eps is None:  # torch's default: the input dtype's machine epsilon
        eps = torch.finfo(input.dtype).eps
    return {"x": x, "weight": w, "eps": float(eps)}


def _npu_rms_norm_call(x, gamma, epsilon=1e-6):
    if gamma.dim() != 1:
        raise NotCovered(f"gamma {list(gamma.shape)}: the op normalises the last dim only")
    return {"x": x, "weight": gamma, "eps": float(epsilon), "with_rstd": True}


def _npu_rms_norm_outputs(recorded, x, gamma, epsilon=1e-6):
    out = {"y": recorded[0]}
    if len(recorded) > 1 and recorded[1] is not None:
        out["rstd"] = recorded[1].reshape(*x.shape[:-1], 1)
    return out


@declare_op(
    "rms_norm",
    inputs=[InputSpec("x"), InputSpec("weight", shape=_LAST, dist=_WEIGHT, optional=True)],
    params=dict(eps=1e-6, with_rstd=False),
    outputs=[OutputSpec("y"), OutputSpec("rstd", "fp32", when=lambda p: p["with_rstd"])],
    dtypes=FLOATS,
    standard={"name": "cann_v2"},
    ranks=(1, 4),
    grads=Gradients(wrt=("x", "weight"), of=("y",),
                    reduced={"weight": broadcast_length("weight", "x")}),
    description="RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * weight (weight "
                "optional); with_rstd also gives rstd [..., 1] in fp32 (npu_rms_norm).",
    calls={
        "Functional.rms_norm": Call(_rms_norm_call, _unflat),
        "Torch.rms_norm": Call(_rms_norm_call, _unflat),
        torch.nn.functional.rms_norm: Call(_rms_norm_call, _unflat),
        torch.rms_norm: Call(_rms_norm_call, _unflat),
        "NPU.npu_rms_norm": Call(_npu_rms_norm_call, _npu_rms_norm_outputs),
    },
)
def rms_norm(x, weight, *, eps, with_rstd):
    rstd = torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    y = x * rstd
    if weight is not None:
        y = y * weight
    return (y, rstd) if with_rstd else (y,)


# -- silu --------------------------------------------------------------------------------
def _silu_call(input, inplace=False):
    return {"x": input}


@declare_op(
    "silu",
    inputs=[InputSpec("x", dist={"dist": "normal", "std": 3.0})],
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "cann_v2"},
    ranks=(1, 4),
    grads=Gradients(wrt=("x",)),
    description="SiLU (swish): x * sigmoid(x) = x / (1 + exp(-x)).",
    calls={
        "Functional.silu": Call(_silu_call, backward=True),
        torch.nn.functional.silu: Call(_silu_call, backward=True),
    },
)
def silu(x):
    # x * sigmoid(x), not x / (1 + exp(-x)): the latter's autograd backward is inf / inf
    # (NaN) once exp(-x) overflows float64 (x < -709), where the true gradient is -0
    return (x * torch.sigmoid(x),)


# -- swiglu ------------------------------------------------------------------------------
def _swiglu_call(x, dim=-1):
    if x.shape[dim] % 2:
        raise ValueError(f"npu_swiglu splits dim {dim} of x {list(x.shape)} in halves: "
                         f"its size must be even")
    return {"x": x, "dim": int(dim)}


@declare_op(
    "swiglu",
    inputs=[InputSpec("x", dist={"dist": "normal", "std": 2.0})],
    params=dict(dim=-1),
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "cann_v2"},
    ranks=(1, 4),
    grads=Gradients(wrt=("x",)),
    description="SwiGLU as npu_swiglu(x, dim): a, b = x.chunk(2, dim); silu(a) * b (the "
                "output has half of x's size along dim).",
    calls={"NPU.npu_swiglu": Call(_swiglu_call, backward=True)},
)
def swiglu(x, *, dim):
    if x.shape[dim] % 2:
        raise ValueError(f"swiglu: dim {dim} of x {list(x.shape)} must have an even size")
    a, b = x.chunk(2, dim=dim)
    return (a * torch.sigmoid(a) * b,)  # as silu: a finite backward for a < -709


# -- layer_norm --------------------------------------------------------------------------
def _layer_norm_call(input, normalized_shape, weight=None, bias=None, eps=1e-5,
                     cudnn_enable=True):
    x, w, b = _flat_norm(input, normalized_shape, weight, bias)
    return {"x": x, "weight": w, "bias": b, "eps": float(eps)}


@declare_op(
    "layer_norm",
    inputs=[InputSpec("x"),
            InputSpec("weight", shape=_LAST, dist=_WEIGHT, optional=True),
            InputSpec("bias", shape=_LAST, dist={"dist": "normal", "std": 0.1},
                      optional=True)],
    params=dict(eps=1e-5),
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "cann_v2"},
    ranks=(1, 4),
    grads=Gradients(wrt=("x", "weight", "bias"),
                    reduced={"weight": broadcast_length("weight", "x"),
                             "bias": broadcast_length("bias", "x")}),
    description="LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * weight + bias, "
                "var the biased variance; weight and bias optional.",
    calls={
        "Functional.layer_norm": Call(_layer_norm_call, _unflat),
        "Torch.layer_norm": Call(_layer_norm_call, _unflat),
        torch.nn.functional.layer_norm: Call(_layer_norm_call, _unflat),
    },
)
def layer_norm(x, weight, bias, *, eps):
    mu = x.mean(dim=-1, keepdim=True)
    centred = x - mu
    var = (centred * centred).mean(dim=-1, keepdim=True)
    y = centred / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return (y,)
