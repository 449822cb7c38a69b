"""Bindings of the built-in ops to the framework calls that compute them (verify judge).

Each adapter takes a call's own arguments, as torch / torch_npu define them, and gives
the op's inputs and params; an outputs adapter brings what the call returned into the
op's layout. Calls an op does not cover raise NotCovered with the reason (they are listed
as not judged). Argument orders of the NPU calls follow torch_npu's documentation and
msprobe's CPU bench functions (msprobe/pytorch/bench_functions/).

Also declared here: ``matmul`` (a @ b with broadcasting), the batched products a model's
attention calls torch.matmul / Tensor.__matmul__ for.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from verify.specs.bindings import Call, NotCovered, bind
from verify.specs.registry import InputSpec, OutputSpec, declare_op

FLOATS = ["fp32", "fp16", "bf16"]


def _floating(name: str, t) -> None:
    if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
        raise NotCovered(f"{name} is not a floating tensor")


# -- matmul ------------------------------------------------------------------------------
def _matmul_b_shape(main):
    """b [.., K, N] for a [.., M, K]: the transposed last two dims of a."""
    return tuple(main[:-2]) + (main[-1], main[-2])


@declare_op(
    "matmul",
    inputs=[InputSpec("a"), InputSpec("b", shape=_matmul_b_shape,
                                      dist={"dist": "normal", "std": 0.1})],
    outputs=[OutputSpec("y")],
    dtypes=FLOATS,
    standard={"name": "cann_v2"},
    ranks=(2, 4),
    description="y = a @ b with torch.matmul's broadcasting over the leading dims "
                "(a [.., M, K], b [.., K, N]); 2-D b is linear without bias.",
)
def matmul(a, b):
    return (torch.matmul(a, b),)


def _matmul_call(input, other, *, out=None):
    _floating("input", input)
    _floating("other", other)
    if input.dim() < 2 or other.dim() < 2:
        raise NotCovered("a matrix-vector product (1-D operand)")
    return {"a": input, "b": other}


for _name in ("Torch.matmul", "Tensor.matmul", "Tensor.__matmul__", "Torch.bmm",
              "Tensor.bmm", "Torch.mm", "Tensor.mm"):
    bind("matmul", {_name: Call(_matmul_call)})
bind("matmul", {torch.matmul: Call(_matmul_call), torch.bmm: Call(_matmul_call),
                torch.Tensor.matmul: Call(_matmul_call), torch.Tensor.bmm: Call(_matmul_call),
                torch.Tensor.__matmul__: Call(_matmul_call)})


# -- linear ------------------------------------------------------------------------------
def _linear_call(input, weight, bias=None):
    _floating("input", input)
    if weight.dim() != 2:
        raise NotCovered(f"weight {list(weight.shape)} is not a matrix")
    x = input.reshape(-1, input.shape[-1]) if input.dim() > 3 else input
    if x.dim() < 2:
        x = x.reshape(1, -1)
    if bias is None:
        return {"x": x, "weight": weight,
                "bias": torch.zeros(weight.shape[0], dtype=input.dtype, device=input.device),
                "use_bias": False}
    return {"x": x, "weight": weight, "bias": bias, "use_bias": True}


def _linear_out(recorded, input, weight, bias=None):
    y = recorded[0]
    if input.dim() > 3:
        y = y.reshape(-1, weight.shape[0])
    elif input.dim() < 2:
        y = y.reshape(1, -1)
    return {"y": y}


bind("linear", {"Functional.linear": Call(_linear_call, _linear_out),
                F.linear: Call(_linear_call, _linear_out)})


# -- softmax -----------------------------------------------------------------------------
def _softmax_dim(x, dim):
    if dim is None:
        raise NotCovered("softmax without dim (torch's deprecated implicit dim)")
    return int(dim) % max(1, x.dim())


def _softmax_call(input, dim=None, _stacklevel=3, dtype=None):
    _floating("input", input)
    return {"x": input.movedim(_softmax_dim(input, dim), -1)}


def _softmax_out(recorded, input, dim=None, _stacklevel=3, dtype=None):
    return {"y": recorded[0].movedim(_softmax_dim(input, dim), -1)}


def _torch_softmax_call(input, dim=None, dtype=None):
    return _softmax_call(input, dim)


def _torch_softmax_out(recorded, input, dim=None, dtype=None):
    return _softmax_out(recorded, input, dim)


bind("softmax", {
    "Functional.softmax": Call(_softmax_call, _softmax_out, backward=True),
    F.softmax: Call(_softmax_call, _softmax_out, backward=True),
    "Torch.softmax": Call(_torch_softmax_call, _torch_softmax_out, backward=True),
    "Tensor.softmax": Call(_torch_softmax_call, _torch_softmax_out, backward=True),
    torch.softmax: Call(_torch_softmax_call, _torch_softmax_out, backward=True),
    torch.Tensor.softmax: Call(_torch_softmax_call, _torch_softmax_out, backward=True),
})


# -- gelu --------------------------------------------------------------------------------
def _gelu_call(input, approximate="none"):
    _floating("input", input)
    return {"x": input, "approximate": approximate}


bind("gelu", {"Functional.gelu": Call(_gelu_call, backward=True),
              F.gelu: Call(_gelu_call, backward=True)})


# -- embedding ---------------------------------------------------------------------------
def _embedding_call(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
                    scale_grad_by_freq=False, sparse=False):
    if max_norm is not None:
        raise NotCovered("max_norm renormalises the table in place")
    return {"weight": weight, "ids": input}


bind("embedding", {"Functional.embedding": Call(_embedding_call),
                   F.embedding: Call(_embedding_call)})


# -- mean --------------------------------------------------------------------------------
def _mean_layout(input, dim, keepdim):
    if not input.dtype.is_floating_point:
        raise NotCovered(f"mean of a {input.dtype} tensor")
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        dims = list(range(input.dim()))
    else:
        dims = sorted({int(d) % max(1, input.dim()) for d in
                       (dim if isinstance(dim, (list, tuple)) else [dim])})
    rest = [d for d in range(input.dim()) if d not in dims]
    x = input.permute(*rest, *dims) if input.dim() else input.reshape(1)
    return x.reshape(*[input.shape[d] for d in rest], -1)


def _mean_call(input, dim=None, keepdim=False, *, dtype=None, out=None):
    return {"x": _mean_layout(input, dim, keepdim)}


def _mean_out(recorded, input, dim=None, keepdim=False, *, dtype=None, out=None):
    return {"y": recorded[0].reshape(_mean_layout(input, dim, keepdim).shape[:-1])}


bind("mean", {"Torch.mean": Call(_mean_call, _mean_out),
              "Tensor.mean": Call(_mean_call, _mean_out),
              torch.mean: Call(_mean_call, _mean_out),
              torch.Tensor.mean: Call(_mean_call, _mean_out)})


# -- rope: npu_rotary_mul ----------------------------------------------------------------
def _rope_layout(x, r1):
    """(x as [B, S, N, D], cos/sin as [S, D], whether x was [B, N, S, D])."""
    if x.dim() != 4 or r1.dim() != 4:
        raise NotCovered(f"x {list(x.shape)} / r1 {list(r1.shape)}: 4-D tensors expected")
    b, n1, n2, d = x.shape
    if tuple(r1.shape) == (1, n1, 1, d):      # x [B, S, N, D]
        return x, False
    if tuple(r1.shape) == (1, 1, n2, d):      # x [B, N, S, D]
        return x.transpose(1, 2), True
    raise NotCovered(f"r1 {list(r1.shape)} broadcast over x {list(x.shape)}: only tables "
                     f"over the sequence ([1, S, 1, D] or [1, 1, S, D]) are covered")


def _rotary_mul_call(input, r1, r2, rotary_mode="half"):
    layouts = {"half": "rotate_half", "interleave": "interleaved"}
    if rotary_mode not in layouts:
        raise NotCovered(f"rotary_mode {rotary_mode!r}")
    x, _ = _rope_layout(input, r1)
    seq, d = x.shape[1], x.shape[-1]
    return {"x": x, "cos": r1.reshape(seq, d), "sin": r2.reshape(seq, d),
            "layout": layouts[rotary_mode]}


def _rotary_mul_out(recorded, input, r1, r2, rotary_mode="half"):
    _, bnsd = _rope_layout(input, r1)
    return {"y": recorded[0].transpose(1, 2) if bnsd else recorded[0]}


bind("rope", {"NPU.npu_rotary_mul": Call(_rotary_mul_call, _rotary_mul_out)})


# -- attention ---------------------------------------------------------------------------
def _sdpa_call(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
               scale=None, enable_gqa=False):
    if attn_mask is not None:
        raise NotCovered("an explicit attn_mask")
    if dropout_p:
        raise NotCovered(f"dropout_p {dropout_p}")
    if query.dim() != 4:
        raise NotCovered(f"query {list(query.shape)}: [B, N, S, D] expected")
    if is_causal and query.shape[-2] != key.shape[-2]:
        raise NotCovered("is_causal with S_q != S_kv (torch aligns the mask top-left)")
    return {"q": query, "k": key, "v": value, "causal": bool(is_causal),
            "scale": None if scale is None else float(scale)}


def _to_bnsd(t, layout, heads):
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        b, s, h = t.shape
        return t.reshape(b, s, heads, h // heads).transpose(1, 2)
    if layout == "SBH":
        s, b, h = t.shape
        return t.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)
    raise NotCovered(f"input_layout {layout!r}")


def _fa_causal(atten_mask, sparse_mode, s_q, s_kv, pre_tockens, next_tockens):
    """Whether npu_fusion_attention's mask arguments ask for the op's causal mask
    (bottom-right aligned) or no mask; anything else is not covered."""
    if atten_mask is None:
        if sparse_mode not in (0, 1) or next_tockens < s_kv or pre_tockens < s_q:
            raise NotCovered(f"sparse_mode {sparse_mode} / pre_tockens {pre_tockens} / "
                             f"next_tockens {next_tockens} without a mask")
        return False
    if sparse_mode == 3 or (sparse_mode == 2 and s_q == s_kv):
        return True
    if sparse_mode == 0 and not atten_mask.is_meta:  # a full mask: True = masked out
        m = atten_mask.reshape(-1, *atten_mask.shape[-2:])[0].bool()
        want = ~torch.ones(s_q, s_kv, dtype=torch.bool).tril(s_kv - s_q)
        if m.shape == want.shape and bool((m == want).all()):
            return True
        raise NotCovered("an atten_mask other than the causal one")
    if sparse_mode == 0:
        return True  # checked on the values when the record is judged
    raise NotCovered(f"sparse_mode {sparse_mode}")


def _fusion_attention_call(query, key, value, head_num, input_layout, pse=None,
                           padding_mask=None, atten_mask=None, scale=1.0, keep_prob=1.0,
                           pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                           prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                           sparse_mode=0, gen_mask_parallel=True, sync=False, **_):
    if pse is not None or padding_mask is not None:
        raise NotCovered("pse / padding_mask")
    if keep_prob < 1.0:
        raise NotCovered(f"keep_prob {keep_prob} (dropout)")
    if actual_seq_qlen is not None or input_layout == "TND":
        raise NotCovered("variable-length (TND) attention")
    q = _to_bnsd(query, input_layout, int(head_num))
    d = q.shape[-1]
    heads_kv = (key.shape[-1] // d) if input_layout in ("BSH", "SBH") else None
    k = _to_bnsd(key, input_layout, heads_kv)
    v = _to_bnsd(value, input_layout, heads_kv)
    causal = _fa_causal(atten_mask, int(sparse_mode), q.shape[-2], k.shape[-2],
                        int(pre_tockens), int(next_tockens))
    return {"q": q, "k": k, "v": v, "causal": causal, "scale": float(scale)}


def _fusion_attention_out(recorded, query, key, value, head_num, input_layout, *args, **kw):
    o = recorded[0]
    return {"o": _to_bnsd(o, input_layout, int(head_num))}


bind("attention", {
    "NPU.npu_fusion_attention": Call(_fusion_attention_call, _fusion_attention_out),
    "Functional.scaled_dot_product_attention": Call(_sdpa_call),
    F.scaled_dot_product_attention: Call(_sdpa_call),
})


# -- cross entropy -----------------------------------------------------------------------
def _ce_call(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean", label_smoothing=0.0):
    if weight is not None:
        raise NotCovered("class weights")
    if label_smoothing:
        raise NotCovered(f"label_smoothing {label_smoothing}")
    if size_average is not None or reduce is not None:
        raise NotCovered("the deprecated size_average / reduce arguments")
    if input.dim() != 2 or target.dim() != 1 or target.dtype.is_floating_point:
        raise NotCovered(f"input {list(input.shape)} / target {list(target.shape)}: "
                         f"[N, C] logits and [N] class indices are covered")
    if reduction not in ("mean", "sum", "none"):
        raise NotCovered(f"reduction {reduction!r}")
    ones = torch.ones(input.shape[0], dtype=input.dtype, device=input.device)
    return {"logits": input, "weight": ones, "labels": target,
            "ignore_index": int(ignore_index),
            "reduction": "none" if reduction == "none" else "sum"}


def _ce_out(recorded, input, target, weight=None, size_average=None, ignore_index=-100,
            reduce=None, reduction="mean", label_smoothing=0.0):
    loss = recorded[0]
    if reduction != "mean":
        return {"loss": loss}
    if target.is_meta:  # indexing checks the binding on meta tensors (no values; meta
        # arithmetic would import torch._dynamo, seconds)
        return {"loss": (loss.double(), loss.dtype)}
    # a mean over the tokens kept: the op's sum is the mean times their count (exact in
    # float64), judged in the dtype the call returned
    kept = (target != ignore_index).sum()
    return {"loss": (loss.double() * kept, loss.dtype)}


bind("fused_cross_entropy", {"Functional.cross_entropy": Call(_ce_call, _ce_out),
                             F.cross_entropy: Call(_ce_call, _ce_out)})


# -- AdamW: npu_apply_adam_w -------------------------------------------------------------
def _scalar(v) -> float:
    return float(v.item() if isinstance(v, torch.Tensor) else v)


def _adam_w_call(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, eps, grad,
                 max_grad_norm=None, amsgrad=False, maximize=False, *, out=None):
    if amsgrad:
        raise NotCovered("amsgrad")
    if out is None or len(out) != 3:
        raise ValueError("npu_apply_adam_w writes (var, m, v) through out=: the record "
                         "has no out tensors")
    var, m, v = out
    b1, b2 = _scalar(beta1), _scalar(beta2)
    # beta1_power is beta1^(t-1) here: the kernel multiplies it by beta1 first
    steps = [round(math.log(_scalar(p)) / math.log(b)) + 1 if _scalar(p) < 1 else 1
             for p, b in ((beta1_power, b1), (beta2_power, b2))]
    if steps[0] != steps[1]:
        raise ValueError(f"beta1_power and beta2_power give steps {steps[0]} and {steps[1]}")
    return {"weight": var, "grad": -grad if maximize else grad, "m": m, "v": v,
            "beta1": b1, "beta2": b2, "lr": _scalar(lr), "weight_decay": _scalar(weight_decay),
            "eps": _scalar(eps), "step": int(steps[0])}


bind("apply_adam_w_v2", {"NPU.npu_apply_adam_w": Call(_adam_w_call)})


# -- MoE routing: npu_moe_gating_top_k_softmax -------------------------------------------
def _moe_gating_call(x, finished=None, k=1):
    if finished is not None:
        raise NotCovered("finished rows")
    if x.dim() != 2:
        raise NotCovered(f"x {list(x.shape)}: [T, E] is covered")
    return {"logits": x, "top_k": int(k), "gating": "softmax", "normalize": False}


def _moe_gating_out(recorded, x, finished=None, k=1):
    return {"weights": (recorded[0].float(), recorded[0].dtype), "indices": recorded[1].long()}


bind("moe_routing", {"NPU.npu_moe_gating_top_k_softmax": Call(_moe_gating_call,
                                                              _moe_gating_out)})
