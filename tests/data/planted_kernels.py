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


@verify.kernel("sgd_momentum", backend="planted")
def sgd_nesterov_drops_decay(weight, grad, momentum_buffer, *, lr=0.01, momentum=0.9,
                             dampening=0.0, weight_decay=0.0, nesterov=False):
    """nesterov's look-ahead adds the raw gradient: the weight decay is lost there (only
    nesterov with weight decay, a combination no case file holds, shows it)."""
    w, g = weight.float(), grad.float()
    decayed = g + weight_decay * w
    buf = momentum * momentum_buffer + (1.0 - dampening) * decayed
    direction = g + momentum * buf if nesterov else buf
    return (w - lr * direction).to(weight.dtype), buf


@verify.kernel("apply_adam_w_v2", backend="planted")
def adam_w_int16_step(weight, grad, m, v, *, beta1=0.9, beta2=0.999, lr=1e-3,
                      weight_decay=0.01, eps=1e-8, step=1):
    """the step counter kept in int16: the bias corrections go wrong past step 32767
    (late in training)."""
    if weight.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"apply_adam_w_v2: weight must be fp32 or bf16, got {weight.dtype}")
    t = torch.tensor(step).to(torch.int16).to(torch.float64)  # 100000 -> -31072
    bc1 = 1.0 - float(torch.pow(torch.tensor(beta1, dtype=torch.float64), t))
    bc2 = 1.0 - float(torch.pow(torch.tensor(beta2, dtype=torch.float64), t))
    w, g = weight.float(), grad.float()
    m_t = beta1 * m + (1.0 - beta1) * g
    v_t = beta2 * v + (1.0 - beta2) * g * g
    update = (m_t / bc1) / (torch.sqrt(v_t / bc2) + eps) + weight_decay * w
    return (w - lr * update).to(weight.dtype), m_t, v_t
