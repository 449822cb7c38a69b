"""Goldens agree with independent float64 references to 1e-12 relative.

References: PyTorch's own optimizers (AdamW, RMSprop, Adagrad, SGD, Adafactor) stepped in
float64 from the same state, and the published formulas (TensorFlow's proximal gradient
descent, Lion, LAMB) written out in NumPy here, independently of goldens/.
"""
import numpy as np
import pytest
import torch

import verify

RTOL = 1e-12


def close(actual, ref):
    actual = np.asarray(actual, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(float(np.abs(ref).max()), 1e-300) if ref.size else 1.0
    np.testing.assert_allclose(actual, ref, rtol=RTOL, atol=RTOL * scale)


def rand(*shape, seed=0, positive=False, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    return t.abs() if positive else t


def torch_step(opt_cls, weight, grad, state, **kw):
    p = torch.nn.Parameter(weight.clone())
    opt = opt_cls([p], foreach=False, **kw)
    p.grad = grad.clone()
    opt.state[p] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    opt.step()
    return p.detach(), opt.state[p]


@pytest.mark.parametrize("step", [1, 10])
def test_adamw_matches_torch_adamw(step):
    w, g = rand(37, 53, seed=1), rand(37, 53, seed=2)
    m, v = rand(37, 53, seed=3, scale=0.1), rand(37, 53, seed=4, positive=True, scale=0.01)
    p = dict(beta1=0.9, beta2=0.999, lr=1e-3, weight_decay=0.01, eps=1e-8, step=step)
    w_new, m_new, v_new = verify.op("apply_adam_w_v2").golden(weight=w, grad=g, m=m, v=v, **p)
    ref_w, st = torch_step(torch.optim.AdamW, w, g,
                           {"step": torch.tensor(float(step - 1), dtype=torch.float64),
                            "exp_avg": m, "exp_avg_sq": v},
                           lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    close(w_new, ref_w)
    close(m_new, st["exp_avg"])
    close(v_new, st["exp_avg_sq"])


def test_rmsprop_matches_torch_rmsprop():
    """TF ApplyRMSProp and torch RMSprop agree when eps = 0 and torch's buffer is mom / lr."""
    var, g = rand(19, 23, seed=5), rand(19, 23, seed=6)
    ms, mom = rand(19, 23, seed=7, positive=True), rand(19, 23, seed=8, scale=0.01)
    lr, rho, momentum = 0.01, 0.9, 0.9
    var_new, ms_new, mom_new = verify.op("apply_rms_prop").golden(
        var=var, ms=ms, mom=mom, grad=g, lr=lr, rho=rho, momentum=momentum, epsilon=0.0)
    ref_var, st = torch_step(torch.optim.RMSprop, var, g,
                             {"step": torch.tensor(0.0), "square_avg": ms,
                              "momentum_buffer": mom / lr},
                             lr=lr, alpha=rho, eps=0.0, momentum=momentum)
    close(var_new, ref_var)
    close(ms_new, st["square_avg"])
    close(mom_new, st["momentum_buffer"] * lr)


@pytest.mark.parametrize("step,lr_decay,wd", [(1, 0.0, 0.0), (4, 0.1, 0.01)])
def test_adagrad_matches_torch_adagrad(step, lr_decay, wd):
    w, g = rand(31, 17, seed=9), rand(31, 17, seed=10)
    s = rand(31, 17, seed=11, positive=True)
    w_new, s_new = verify.op("adagrad").golden(weight=w, grad=g, state_sum=s, lr=0.01,
                                               lr_decay=lr_decay, weight_decay=wd, eps=1e-10,
                                               step=step)
    ref_w, st = torch_step(torch.optim.Adagrad, w, g,
                           {"step": torch.tensor(float(step - 1)), "sum": s},
                           lr=0.01, lr_decay=lr_decay, weight_decay=wd, eps=1e-10)
    close(w_new, ref_w)
    close(s_new, st["sum"])


@pytest.mark.parametrize("nesterov,dampening,wd", [(False, 0.0, 0.0), (True, 0.0, 0.01),
                                                   (False, 0.3, 0.01)])
def test_sgd_momentum_matches_torch_sgd(nesterov, dampening, wd):
    w, g, buf = rand(13, 29, seed=12), rand(13, 29, seed=13), rand(13, 29, seed=14)
    w_new, buf_new = verify.op("sgd_momentum").golden(
        weight=w, grad=g, momentum_buffer=buf, lr=0.05, momentum=0.9, dampening=dampening,
        weight_decay=wd, nesterov=nesterov)
    ref_w, st = torch_step(torch.optim.SGD, w, g, {"momentum_buffer": buf}, lr=0.05,
                           momentum=0.9, dampening=dampening, weight_decay=wd,
                           nesterov=nesterov)
    close(w_new, ref_w)
    close(buf_new, st["momentum_buffer"])


@pytest.mark.parametrize("step,wd", [(1, 0.0), (7, 0.01)])
def test_adafactor_matches_torch_adafactor(step, wd):
    w, g = rand(24, 40, seed=15), rand(24, 40, seed=16)
    row, col = rand(24, seed=17, positive=True), rand(40, seed=18, positive=True)
    eps1 = 2.0 ** -23
    w_new, row_new, col_new = verify.op("adafactor").golden(
        weight=w, grad=g, row_var=row, col_var=col, lr=1e-2, beta2_decay=-0.8, eps1=eps1,
        eps2=1e-3, d=1.0, weight_decay=wd, step=step)
    ref_w, st = torch_step(torch.optim.Adafactor, w, g,
                           {"step": torch.tensor(float(step - 1)),
                            "row_var": row.reshape(24, 1), "col_var": col.reshape(1, 40)},
                           lr=1e-2, beta2_decay=-0.8, eps=(eps1, 1e-3), d=1.0,
                           weight_decay=wd)
    close(w_new, ref_w)
    close(row_new, st["row_var"].reshape(-1))
    close(col_new, st["col_var"].reshape(-1))


def tf_proximal_gd(var, alpha, l1, l2, delta):
    """TensorFlow ApplyProximalGradientDescent as documented, in NumPy."""
    prox_v = var - alpha * delta
    return np.sign(prox_v) / (1 + alpha * l2) * np.maximum(np.abs(prox_v) - alpha * l1, 0)


@pytest.mark.parametrize("alpha,l1,l2", [(0.01, 0.001, 0.01), (0.1, 0.0, 0.0),
                                         (0.5, 0.3, 0.0), (0.2, 0.0, 1.0)])
def test_proximal_gd_matches_tensorflow_semantics(alpha, l1, l2):
    var, delta = rand(3, 4, 5, seed=19), rand(3, 4, 5, seed=20)
    out = verify.op("apply_proximal_gradient_descent").golden(
        var=var, delta=delta, alpha=torch.tensor(alpha, dtype=torch.float64),
        l1=torch.tensor(l1, dtype=torch.float64), l2=torch.tensor(l2, dtype=torch.float64))
    ref = tf_proximal_gd(var.numpy(), alpha, l1, l2, delta.numpy())
    close(out[0], ref)


def test_proximal_gd_sample_from_the_seed():
    """The seed's sample: var, delta [2, 3], alpha 0.01, l1 0.001, l2 0.01."""
    var = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -0.25]], dtype=torch.float64)
    delta = torch.tensor([[0.1, 0.2, -0.3], [0.4, -0.5, 0.6]], dtype=torch.float64)
    (out,) = verify.op("apply_proximal_gradient_descent").golden(
        var=var, delta=delta, alpha=torch.tensor(0.01, dtype=torch.float64), l1=torch.tensor(0.001, dtype=torch.float64),
        l2=torch.tensor(0.01, dtype=torch.float64))
    # by hand: prox = var - 0.01*delta; shrink |prox| by 1e-5, divide by 1.0001
    prox = var.numpy() - 0.01 * delta.numpy()
    expected = np.sign(prox) * (np.abs(prox) - 1e-5) / 1.0001
    close(out, expected)


def numpy_lion(w, g, m, lr, b1, b2, wd):
    c = b1 * m + (1 - b1) * g
    return w * (1 - lr * wd) - lr * np.sign(c), b2 * m + (1 - b2) * g


def test_lion_matches_paper_algorithm():
    w, g, m = (rand(16, 24, seed=s).numpy() for s in (21, 22, 23))
    g[0, :4] = 0
    m[0, :4] = 0  # sign(0) = 0: no move
    out = verify.op("lion").golden(weight=torch.from_numpy(w), grad=torch.from_numpy(g),
                                   exp_avg=torch.from_numpy(m), lr=1e-3, beta1=0.9,
                                   beta2=0.99, weight_decay=0.1)
    ref_w, ref_m = numpy_lion(w, g, m, 1e-3, 0.9, 0.99, 0.1)
    close(out[0], ref_w)
    close(out[1], ref_m)
    assert np.array_equal(out[0].numpy()[0, :4], w[0, :4] * (1 - 1e-4))


def numpy_lamb(w, g, m, v, lr, b1, b2, eps, wd, step):
    m_t = b1 * m + (1 - b1) * g
    v_t = b2 * v + (1 - b2) * g * g
    r = (m_t / (1 - b1 ** step)) / (np.sqrt(v_t / (1 - b2 ** step)) + eps) + wd * w
    wn, rn = np.linalg.norm(w), np.linalg.norm(r)
    trust = wn / rn if wn > 0 and rn > 0 else 1.0
    return w - lr * trust * r, m_t, v_t


@pytest.mark.parametrize("step,zero_w", [(1, False), (5, False), (3, True)])
def test_lamb_matches_paper_algorithm(step, zero_w):
    w = np.zeros((20, 30)) if zero_w else rand(20, 30, seed=24).numpy()
    g = rand(20, 30, seed=25).numpy()
    m = rand(20, 30, seed=26, scale=0.1).numpy()
    v = rand(20, 30, seed=27, positive=True, scale=0.01).numpy()
    out = verify.op("lamb").golden(weight=torch.from_numpy(w), grad=torch.from_numpy(g),
                                   m=torch.from_numpy(m), v=torch.from_numpy(v), lr=1e-3,
                                   beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01,
                                   step=step)
    for got, ref in zip(out, numpy_lamb(w, g, m, v, 1e-3, 0.9, 0.999, 1e-6, 0.01, step)):
        close(got, ref)


def test_adamw_analytic_smoke():
    """m = v = 0, step 1: update = g / (sqrt(g^2) + eps) + wd * w, exactly."""
    w, g = rand(8, 8, seed=28), rand(8, 8, seed=29)
    z = torch.zeros(8, 8, dtype=torch.float64)
    w_new, _, _ = verify.op("apply_adam_w_v2").golden(weight=w, grad=g, m=z, v=z, lr=1e-3,
                                                      weight_decay=0.01, eps=1e-8, step=1)
    expected = w - 1e-3 * (g / (g.abs() + 1e-8) + 0.01 * w)
    close(w_new, expected)


def test_chunked_golden_equals_plain_formula(monkeypatch):
    """Chunking changes nothing: a tiny chunk size gives bitwise the same AdamW golden."""
    from verify.goldens import chunked
    w, g = rand(70, 90, seed=30), rand(70, 90, seed=31)
    m, v = rand(70, 90, seed=32, scale=0.1), rand(70, 90, seed=33, positive=True)
    whole = verify.op("apply_adam_w_v2").golden(weight=w, grad=g, m=m, v=v)
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 1000)
    parts = verify.op("apply_adam_w_v2").golden(weight=w, grad=g, m=m, v=v)
    for a, b in zip(whole, parts):
        assert torch.equal(a, b)
