"""The fused training ops' goldens, forward and backward, against independent float64
references: NumPy loops written from the documents' formulas, closed-form gradients,
torch's own cross entropy, and finite differences."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import verify

D64 = torch.float64


def rand(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D64) * scale


def close(a, b, rtol=1e-10):
    a = np.asarray(a.detach() if isinstance(a, torch.Tensor) else a, dtype=np.float64)
    b = np.asarray(b.detach() if isinstance(b, torch.Tensor) else b, dtype=np.float64)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(np.abs(b).max(), 1e-300))


def golden_grads(op_name, inputs, upstream, **params):
    """Gradients of the golden by autograd (the harness's own route, used as the thing
    under test here)."""
    spec = verify.op(op_name)
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()
              if k in spec.grads.wrt and v is not None}
    outs = spec.golden_fn(**{**inputs, **leaves}, **{**spec.params, **params})
    names = spec.active_outputs({**spec.params, **params})
    pairs = [(outs[names.index(n)], g) for n, g in upstream.items()]
    grads = torch.autograd.grad([p[0] for p in pairs], list(leaves.values()),
                                [p[1] for p in pairs], allow_unused=True)
    return outs, dict(zip(leaves, grads))


def test_add_rms_norm_bias_multi_dim_gamma_and_closed_form_grads():
    x1, x2 = rand(2, 4, 8, 16, seed=1), rand(2, 4, 8, 16, seed=2)
    gamma, beta = rand(8, 16, seed=3), rand(8, 16, seed=4)
    dy, dx = rand(2, 4, 8, 16, seed=5), rand(2, 4, 8, 16, seed=6)
    (y, rstd, x), grads = golden_grads("add_rms_norm_bias",
                                       dict(x1=x1, x2=x2, gamma=gamma, beta=beta),
                                       {"y": dy, "x": dx}, epsilon=1e-5)
    xs = (x1 + x2).numpy().reshape(8, 128)
    r = 1 / np.sqrt((xs ** 2).mean(axis=1, keepdims=True) + 1e-5)
    assert tuple(rstd.shape) == (2, 4, 1, 1)
    close(rstd.reshape(8, 1), r)
    g, b = gamma.numpy().reshape(128), beta.numpy().reshape(128)
    close(y.reshape(8, 128), xs * r * g + b)
    close(x, x1 + x2)
    # closed form: dx = r * (dyg - xhat * mean(dyg * xhat)) + dx_out
    d, xhat = dy.numpy().reshape(8, 128), xs * r
    dyg = d * g
    want_dx = r * (dyg - xhat * (dyg * xhat).mean(axis=1, keepdims=True)) + dx.numpy().reshape(8, 128)
    close(grads["x1"].reshape(8, 128), want_dx)
    close(grads["x2"].reshape(8, 128), want_dx)
    close(grads["gamma"].reshape(128), (d * xhat).sum(axis=0))
    close(grads["beta"].reshape(128), d.sum(axis=0))


def test_rmsnorm_without_weight_gradient_closed_form():
    x, up = rand(5, 33, seed=7), rand(5, 1, seed=8)
    (rstd,), grads = golden_grads("rmsnorm_without_weight", {"x": x}, {"rstd": up}, eps=1e-6)
    xn = x.numpy()
    r = 1 / np.sqrt((xn ** 2).mean(axis=1, keepdims=True) + 1e-6)
    close(rstd, r)
    close(grads["x"], -up.numpy() * r ** 3 * xn / 33)


@pytest.mark.parametrize("activation", ["swish", "silu", "sigmoid"])
def test_rms_norm_gated_forward_and_prenorm(activation):
    x, g, res = rand(3, 7, 32, seed=9), rand(3, 7, 32, seed=10), rand(3, 7, 32, seed=11)
    w, b = rand(32, seed=12), rand(32, seed=13)
    y, res_out = verify.op("rms_norm_gated").golden(x=x, g=g, weight=w, bias=b, residual=res,
                                                   activation=activation, prenorm=True)
    h = (x + res).numpy()
    norm = h / np.sqrt((h ** 2).mean(-1, keepdims=True) + 1e-6) * w.numpy() + b.numpy()
    gn = g.numpy()
    sig = 1 / (1 + np.exp(-gn))
    close(y, norm * (gn * sig if activation != "sigmoid" else sig))
    close(res_out, h)


def test_clipped_swiglu_matches_gpt_oss_formula_and_clamp_gradients():
    gu = rand(6, 40, seed=14, scale=6)
    (y,), grads = golden_grads("clipped_swiglu", {"gate_up": gu}, {"y": torch.ones(6, 20, dtype=D64)})
    a = gu.numpy()
    gate, up = np.minimum(a[:, :20], 7.0), np.clip(a[:, 20:], -7.0, 7.0)
    close(y, gate / (1 + np.exp(-1.702 * gate)) * (up + 1))
    d = grads["gate_up"].numpy()
    assert (d[:, :20][a[:, :20] > 7.0] == 0).all()
    assert (d[:, 20:][np.abs(a[:, 20:]) > 7.0] == 0).all()
    assert (d[:, 20:][np.abs(a[:, 20:]) < 7.0] != 0).all()


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_cross_entropy_matches_torch_with_ignore_index(reduction):
    logits, w = rand(12, 30, seed=15, scale=3), rand(12, seed=16).abs()
    labels = torch.randint(0, 30, (12,), generator=torch.Generator().manual_seed(17))
    labels[[2, 7]] = -100
    up = rand(12, seed=18) if reduction == "none" else torch.tensor(1.5, dtype=D64)
    (loss,), grads = golden_grads("fused_cross_entropy",
                                  dict(logits=logits, weight=w, labels=labels.to(D64)),
                                  {"loss": up}, reduction=reduction)
    lt = logits.clone().requires_grad_(True)
    ref = F.cross_entropy(lt, labels, ignore_index=-100, reduction="none") * w
    ref = ref.sum() if reduction == "sum" else ref
    close(loss, ref)
    (want,) = torch.autograd.grad(ref, lt, up)
    close(grads["logits"], want)
    assert torch.equal(grads["logits"][[2, 7]], torch.zeros(2, 30, dtype=D64))


@pytest.mark.parametrize("big", [1e4, 1e17, 1.7e38])
def test_cross_entropy_gradient_is_the_softmax_at_any_magnitude(big):
    """k tied logits at the row's max each get weight * (1/k) (minus the label's one), the
    softmax, however large they are: torch.logsumexp's gradient exp(x - lse) gave 1 to
    each once log(k) fell under lse's ulp (a hunt found it at 1.7e38)."""
    logits = torch.zeros(3, 10, dtype=D64)
    logits[:, :7] = big  # seven tied maxima per row
    w = torch.tensor([1.0, 2.0, 1e8], dtype=D64)
    labels = torch.tensor([0.0, 8.0, 9.0], dtype=D64)
    (loss,), grads = golden_grads("fused_cross_entropy",
                                  dict(logits=logits, weight=w, labels=labels),
                                  {"loss": torch.ones(3, dtype=D64)}, reduction="none")
    want = torch.zeros(3, 10, dtype=D64)
    want[:, :7] = w[:, None] / 7  # exp(x - max) / sum: 1/7 each, e^-big ~ 0 elsewhere
    want[torch.arange(3), labels.long()] -= w
    close(grads["logits"], want, rtol=1e-14)


def test_mhc_post_forward_and_gradients_match_the_document_formulas():
    b, s, n, d = 2, 3, 4, 5
    x, res = rand(b, s, d, seed=19), rand(b, s, n, d, seed=20)
    hp, hr = rand(b, s, n, seed=21), rand(b, s, n, n, seed=22)
    go = rand(b, s, n, d, seed=23)
    (out,), grads = golden_grads("mhc_post", dict(x=x, residual=res, h_post=hp, h_res=hr),
                                 {"out": go})
    X, R, HP, HR, G = (t.numpy() for t in (x, res, hp, hr, go))
    want = np.zeros((b, s, n, d))
    gx, gr, ghp, ghr = np.zeros_like(X), np.zeros_like(R), np.zeros_like(HP), np.zeros_like(HR)
    for bi in range(b):
        for si in range(s):
            for i in range(n):
                want[bi, si, i] = HP[bi, si, i] * X[bi, si] + sum(
                    HR[bi, si, j, i] * R[bi, si, j] for j in range(n))
                ghp[bi, si, i] = (G[bi, si, i] * X[bi, si]).sum()
                gx[bi, si] += G[bi, si, i] * HP[bi, si, i]
                for j in range(n):
                    gr[bi, si, j] += G[bi, si, i] * HR[bi, si, j, i]
                    ghr[bi, si, i, j] = (G[bi, si, j] * R[bi, si, i]).sum()
    close(out, want)
    close(grads["x"], gx)
    close(grads["residual"], gr)
    close(grads["h_post"], ghp)
    close(grads["h_res"], ghr)


def test_sinkhorn_comb_is_doubly_stochastic_and_pre_post_match():
    mixes, scale, base = rand(2, 5, 24, seed=24), rand(3, seed=25), rand(24, seed=26)
    pre, post, comb = verify.op("sinkhorn").golden(mixes=mixes, hc_scale=scale, hc_base=base,
                                                   iters=200)
    m, s, bb = mixes.numpy(), scale.numpy(), base.numpy()
    close(pre, 1 / (1 + np.exp(-(m[..., :4] * s[0] + bb[:4]))) + 1e-6)
    close(post, 2 / (1 + np.exp(-(m[..., 4:8] * s[1] + bb[4:8]))))
    c = comb.numpy()
    np.testing.assert_allclose(c.sum(-2), 1.0, atol=1e-5)
    np.testing.assert_allclose(c.sum(-1), 1.0, atol=1e-4)


def test_sinkhorn_gradient_matches_finite_differences():
    mixes, scale, base = rand(1, 2, 24, seed=27), rand(3, seed=28), rand(24, seed=29)
    spec = verify.op("sinkhorn")
    args = tuple(t.clone().requires_grad_(True) for t in (mixes, scale, base))
    assert torch.autograd.gradcheck(
        lambda m, sc, b: spec.golden_fn(m, sc, b, **spec.params), args, eps=1e-6, atol=1e-6)


def test_moe_sort_chunks_is_a_permutation_of_chunks():
    inp = rand(10, 3, seed=30)
    sizes = torch.tensor([3, 0, 5, 2], dtype=torch.int32)
    order = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    out, probs = verify.op("moe_sort_chunks_by_index_with_probs").golden(
        inp=inp, split_sizes=sizes, sorted_index=order, probs=torch.arange(10, dtype=D64))
    rows = [3, 4, 5, 6, 7, 0, 1, 2, 8, 9]  # chunk 2 (rows 3..7), 0 (0..2), 3 (8, 9), 1 (none)
    close(out, inp.numpy()[rows])
    assert probs.tolist() == rows


def numpy_cumsum(g, chunk, reverse, offsets):
    out = np.zeros_like(g)
    for b in range(g.shape[0]):
        for a, e in offsets(b):
            for s in range(a, e, chunk):
                piece = g[b, s:min(s + chunk, e)]
                out[b, s:min(s + chunk, e)] = (np.cumsum(piece[::-1], 0)[::-1] if reverse
                                               else np.cumsum(piece, 0))
    return out


@pytest.mark.parametrize("reverse", [False, True])
def test_chunk_local_cumsum_varlen_and_4d(reverse):
    g = rand(1, 50, 3, 2, seed=31)
    cu = torch.tensor([0, 7, 30, 50], dtype=torch.int32)
    (out,) = verify.op("chunk_local_cumsum").golden(g=g, cu_seqlens=cu, chunk_size=8,
                                                   reverse=reverse, scale=0.5)
    want = numpy_cumsum(g.numpy(), 8, reverse, lambda b: [(0, 7), (7, 30), (30, 50)])
    close(out, 0.5 * want)


def test_chunk_local_cumsum_rejects_what_the_document_rejects():
    spec = verify.op("chunk_local_cumsum")
    with pytest.raises(ValueError, match="power of 2"):
        spec.golden(g=rand(1, 8, 2), cu_seqlens=None, chunk_size=48)
    with pytest.raises(ValueError, match="batch size 1"):
        spec.golden(g=rand(2, 8, 2), cu_seqlens=torch.tensor([0, 4, 8]), chunk_size=4)


def numpy_gated_delta(q, k, v, g, beta, scale, h0=None):
    """The recurrence written from the document's formulas, one head at a time."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    o = np.zeros((B, T, H, V))
    finals = np.zeros((B, H, K, V))
    for b in range(B):
        for h in range(H):
            S = np.zeros((K, V)) if h0 is None else h0[b, h].copy()
            for t in range(T):
                S = S * np.exp(g[b, t, h])
                u = beta[b, t, h] * (v[b, t, h] - k[b, t, h] @ S)
                S = S + np.outer(k[b, t, h], u)
                o[b, t, h] = scale * (q[b, t, h] @ S)
            finals[b, h] = S
    return o, finals


def test_gated_delta_rule_golden_is_the_recurrence():
    B, T, H, K = 2, 20, 2, 4
    q, k, v = rand(B, T, H, K, seed=32), rand(B, T, H, K, seed=33, scale=0.3), rand(B, T, H, 3, seed=34)
    g = -rand(B, T, H, seed=35).abs() * 0.3
    beta = torch.rand(B, T, H, generator=torch.Generator().manual_seed(36), dtype=D64)
    h0 = rand(B, H, K, 3, seed=37)
    o, final = verify.op("chunk_gated_delta_rule").golden(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, cu_seqlens=None, chunk_size=16)
    want_o, want_f = numpy_gated_delta(*(t.numpy() for t in (q, k, v, g, beta)), K ** -0.5,
                                       h0.numpy())
    close(o, want_o)
    close(final, want_f)


def test_chunked_sub_steps_compose_to_the_recurrence():
    """cumsum -> kkt -> solve_tril -> recompute_w_u, run as goldens in float64, give the
    WY factors of the recurrence: the first chunk's u equals the recurrence's v_new."""
    B, T, H, K = 1, 16, 1, 4
    k, v = rand(B, T, H, K, seed=38, scale=0.3), rand(B, T, H, 3, seed=39)
    g = -rand(B, T, H, seed=40).abs() * 0.2
    beta = torch.rand(B, T, H, generator=torch.Generator().manual_seed(41), dtype=D64)
    (gc,) = verify.op("chunk_local_cumsum").golden(g=g, cu_seqlens=None, chunk_size=16)
    (A,) = verify.op("chunk_scaled_dot_kkt").golden(k=k, g=gc, beta=beta, cu_seqlens=None,
                                                   chunk_size=16)
    (Ai,) = verify.op("solve_tril").golden(A=A, cu_seqlens=None)
    w, u = verify.op("recompute_w_u").golden(k=k, v=v, beta=beta, A=Ai, g=gc, cu_seqlens=None)
    # with a zero initial state, v_new = u; check it against the recurrence's u_t
    kn, vn, gn, bn = (t.numpy()[0, :, 0] for t in (k, v, g, beta))
    S = np.zeros((K, 3))
    for t in range(T):
        S = S * np.exp(gn[t])
        u_t = bn[t] * (vn[t] - kn[t] @ S)
        S = S + np.outer(kn[t], u_t)
        close(u[0, t, 0], u_t, rtol=1e-9)
    A_np = A.numpy()[0, :, 0]
    close(Ai.numpy()[0, :, 0] @ (np.eye(16) + A_np), np.eye(16), rtol=1e-9)


def test_solve_tril_rejects_other_block_sizes():
    with pytest.raises(ValueError, match="16, 32, 64"):
        verify.op("solve_tril").golden(A=rand(1, 16, 1, 8), cu_seqlens=None)
