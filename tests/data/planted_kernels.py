"""Kernels with bugs the built-in L0 and L1 cases miss (each passes them), in regimes a
hunt reaches: outlier logits, a large mean over a small spread, rows just past a block
size. Not the mutants: bugs of their own (tests/test_hunt.py)."""
import torch, verify

@verify.kernel("softmax", backend="planted")
def softmax_no_max(x):
    """exp without the max subtraction: overflows once logits pass ~88 (fp32)."""
    e = torch.exp(x.float())
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)

@verify.kernel("layer_norm", backend="planted")
def layer_norm_one_pass(x, weight=None, bias=None, *, eps=1e-5):
    """variance as E[x^2] - mean^2 in fp32: cancels when the mean is large."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = (xf * xf).mean(-1, keepdim=True) - mean * mean
    y = (xf - mean) / torch.sqrt(var.clamp_min(0) + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@verify.kernel("rms_norm", backend="planted")
def rms_norm_drops_tail(x, weight=None, *, eps=1e-6, with_rstd=False):
    """the long-row path sums whole blocks of 512 and drops the remainder."""
    n = x.shape[-1]
    xf = x.float()
    if n > 512:
        ms = xf[..., : n - n % 512].square().sum(-1, keepdim=True) / n
    else:
        ms = xf.square().mean(-1, keepdim=True)
    rstd = torch.rsqrt(ms + eps)
    y = xf * rstd
    if weight is not None:
        y = y * weight.float()
    return (y.to(x.dtype), rstd) if with_rstd else y.to(x.dtype)
