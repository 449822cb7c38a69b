"""The float64 goldens of rms_norm, silu, swiglu, layer_norm and matmul against
independent references: torch's own functional ops in float64 (values and autograd
gradients) and NumPy's matmul."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import verify

F64 = torch.float64


def _x(*shape, seed=0, std=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * std


def _grads(fn, inputs, upstream):
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, upstream)


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 17), (1, 1)])
def test_rms_norm_and_layer_norm_equal_torchs_in_float64(shape):
    x, w, b = _x(*shape), 1 + 0.1 * _x(shape[-1], seed=1), _x(shape[-1], seed=2)
    up = _x(*shape, seed=3)
    d = shape[-1]
    ours = verify.op("rms_norm").golden(x=x, weight=w, eps=1e-6)[0]
    theirs = F.rms_norm(x, (d,), w, eps=1e-6)
    assert torch.allclose(ours, theirs, rtol=1e-13, atol=1e-14)
    g_ours = _grads(lambda a, c: verify.op("rms_norm").golden_fn(a, c, eps=1e-6,
                                                                  with_rstd=False)[0], (x, w), up)
    g_theirs = _grads(lambda a, c: F.rms_norm(a, (d,), c, eps=1e-6), (x, w), up)
    for a, c in zip(g_ours, g_theirs):
        assert torch.allclose(a, c, rtol=1e-12, atol=1e-13)
    y, rstd = verify.op("rms_norm").golden(x=x, weight=None, eps=1e-5, with_rstd=True)
    assert torch.allclose(rstd, 1 / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5))
    ours = verify.op("layer_norm").golden(x=x, weight=w, bias=b, eps=1e-5)[0]
    assert torch.allclose(ours, F.layer_norm(x, (d,), w, b, 1e-5), rtol=1e-12, atol=1e-13)
    g_ours = _grads(lambda a, c, e: verify.op("layer_norm").golden_fn(a, c, e, eps=1e-5)[0],
                    (x, w, b), up)
    g_theirs = _grads(lambda a, c, e: F.layer_norm(a, (d,), c, e, 1e-5), (x, w, b), up)
    for a, c in zip(g_ours, g_theirs):
        assert torch.allclose(a, c, rtol=1e-10, atol=1e-12)


def test_silu_and_swiglu_equal_torchs_in_float64():
    x = _x(6, 40, std=8.0)
    up = _x(6, 40, seed=4)
    assert torch.allclose(verify.op("silu").golden(x=x)[0], F.silu(x), rtol=1e-14, atol=0)
    g1 = _grads(lambda a: verify.op("silu").golden_fn(a)[0], (x,), up)[0]
    g2 = _grads(F.silu, (x,), up)[0]
    assert torch.allclose(g1, g2, rtol=1e-12, atol=1e-14)
    for dim in (-1, 0):
        a, b = x.chunk(2, dim=dim)
        ours = verify.op("swiglu").golden(x=x, dim=dim)[0]
        assert torch.allclose(ours, F.silu(a) * b, rtol=1e-14, atol=1e-15)


def test_matmul_equals_numpys_in_float64():
    a, b = _x(2, 3, 8, 16), _x(2, 3, 16, 5, seed=5)
    ours = verify.op("matmul").golden(a=a, b=b)[0]
    assert np.allclose(ours.numpy(), np.matmul(a.numpy(), b.numpy()), rtol=1e-13, atol=1e-13)
    b2 = _x(16, 5, seed=6)
    assert np.allclose(verify.op("matmul").golden(a=a, b=b2)[0].numpy(),
                       np.matmul(a.numpy(), b2.numpy()), rtol=1e-13, atol=1e-13)
