"""The strategy guide's ops: goldens against independent float64 references, top-k with
ties, masked attention, and the strategy comparisons that separate routes."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import verify
from verify.running import strategies
from verify.comparator.comparison import compare_topk

D64 = torch.float64


def rand(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D64) * scale


def close(a, b, rtol=1e-12):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(np.abs(b).max(), 1e-300))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch(approximate):
    x = rand(1000, seed=1, scale=3)
    (y,) = verify.op("gelu").golden(x=x, approximate=approximate)
    close(y, F.gelu(x, approximate=approximate))


def test_softmax_matches_torch():
    x = rand(7, 300, seed=2, scale=4)
    close(verify.op("softmax").golden(x=x)[0], torch.softmax(x, dim=-1))


@pytest.mark.parametrize("nq,nkv,sq,skv,causal", [(4, 4, 16, 16, False), (8, 2, 16, 16, True),
                                                   (8, 2, 1, 40, False), (4, 2, 6, 20, True)])
def test_attention_matches_torch_sdpa(nq, nkv, sq, skv, causal):
    q, k, v = rand(2, nq, sq, 32, seed=3), rand(2, nkv, skv, 32, seed=4), rand(2, nkv, skv, 32, seed=5)
    (o,) = verify.op("attention").golden(q=q, k=k, v=v, causal=causal)
    mask = None
    if causal:  # bottom-right aligned, written out independently of the golden
        mask = torch.ones(sq, skv, dtype=torch.bool).tril(diagonal=skv - sq)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    close(o, ref)


def test_fully_masked_rows_give_zero_not_nan():
    q, k, v = rand(1, 2, 12, 16, seed=6), rand(1, 2, 8, 16, seed=7), rand(1, 2, 8, 16, seed=8)
    (o,) = verify.op("attention").golden(q=q, k=k, v=v, causal=True)
    assert torch.equal(o[:, :, :4], torch.zeros_like(o[:, :, :4])) and not o.isnan().any()
    from verify.kernels.strategies import routes
    for fn in (routes.attention_whole_row, routes.attention_online, routes.attention_bf16_pv_split):
        out = fn(q.float(), k.float(), v.float(), causal=True, block_size=3)
        assert not out.isnan().any() and torch.equal(out[:, :, :4], torch.zeros(1, 2, 4, 16))


def numpy_rope(x, cos, sin, layout):
    x, cos, sin = (np.asarray(t, dtype=np.float64) for t in (x, cos, sin))
    out = np.empty_like(x)
    d = x.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    for i in range(d):
        if layout == "rotate_half":
            partner, sign = (i + d // 2, -1.0) if i < d // 2 else (i - d // 2, 1.0)
        else:
            partner, sign = (i + 1, -1.0) if i % 2 == 0 else (i - 1, 1.0)
        out[..., i] = x[..., i] * c[..., i] + sign * x[..., partner] * s[..., i]
    return out


@pytest.mark.parametrize("layout", ["rotate_half", "interleaved"])
def test_rope_matches_written_out_rotation(layout):
    x, cos, sin = rand(2, 5, 3, 8, seed=9), rand(5, 8, seed=10), rand(5, 8, seed=11)
    (y,) = verify.op("rope").golden(x=x, cos=cos, sin=sin, layout=layout)
    close(y, numpy_rope(x, cos, sin, layout))


def test_rms_norm_rope_matches_torch_rms_norm_then_rope():
    x, w = rand(2, 5, 3, 8, seed=12), rand(8, seed=13)
    cos, sin = rand(5, 8, seed=14), rand(5, 8, seed=15)
    (y,) = verify.op("rms_norm_rope").golden(x=x, weight=w, cos=cos, sin=sin, eps=1e-6,
                                             layout="rotate_half")
    n = F.rms_norm(x, (8,), weight=w, eps=1e-6)
    close(y, numpy_rope(n, cos, sin, "rotate_half"))


@pytest.mark.parametrize("gating", ["sigmoid", "softmax"])
def test_moe_routing_matches_numpy(gating):
    logits = rand(20, 16, seed=16).numpy()
    w, idx, _ = verify.op("moe_routing").golden(logits=torch.from_numpy(logits), top_k=4,
                                                gating=gating, normalize=True)
    scores = 1 / (1 + np.exp(-logits)) if gating == "sigmoid" else \
        np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    ref_idx = np.argsort(-scores, axis=-1)[:, :4]
    ref_w = np.take_along_axis(scores, ref_idx, -1)
    assert np.array_equal(idx.numpy(), ref_idx)
    close(w, ref_w / ref_w.sum(-1, keepdims=True))


def test_linear_embedding_repeat_kv_mean_match_torch():
    x, w, b = rand(6, 10, seed=17), rand(4, 10, seed=18), rand(4, seed=19)
    close(verify.op("linear").golden(x=x, weight=w, bias=b, use_bias=True)[0], F.linear(x, w, b))
    table = rand(50, 8, seed=20)
    ids = torch.tensor([[0, 49, 7], [3, 3, 1]])
    close(verify.op("embedding").golden(weight=table, ids=ids)[0], F.embedding(ids, table))
    kv = rand(2, 3, 5, 4, seed=21)
    assert torch.equal(verify.op("repeat_kv").golden(x=kv, n_rep=3)[0],
                       kv.repeat_interleave(3, dim=1))
    m = rand(5, 1000, seed=22).abs()
    close(verify.op("mean").golden(x=m)[0], m.numpy().mean(axis=-1))


def test_topk_sets_tolerate_ties_and_name_a_wrong_expert():
    scores = torch.tensor([[0.9, 0.5, 0.5, 0.1], [0.8, 0.7, 0.2, 0.1]], dtype=D64)
    golden = torch.tensor([[0, 1], [0, 1]])
    tied = torch.tensor([[0, 2], [1, 0]])  # the other of a tie; same set in another order
    assert compare_topk(tied, golden, scores).passed
    wrong = torch.tensor([[0, 1], [0, 2]])
    v = compare_topk(wrong, golden, scores)
    assert not v.passed and "row 1" in v.reason and "expert 2" in v.reason
    dup = torch.tensor([[0, 0], [0, 1]])
    assert "distinct" in compare_topk(dup, golden, scores).reason


def _by_strategy(comparison):
    out = {}
    for r in comparison["table"]:
        out.setdefault(r["strategy"], []).append(r)
    return out


def test_mean_bf16_accumulation_fails_long_rows_fp32_accumulation_passes():
    _, comp = strategies.run("mean", level="L1", repeats=1)
    rows = _by_strategy(comp)
    long_bf16 = [r for r in rows["bf16_accumulation"] if "long_rows" in r["case"]]
    assert long_bf16 and all(r["verdict"] == "FAIL" for r in long_bf16)
    assert all(r["verdict"] == "PASS" for r in rows["fp32_accumulation"])
    assert comp["ranking"][-1]["strategy"] == "bf16_accumulation"


def test_gelu_tanh_passes_bf16_and_fp16_but_not_fp32_against_exact():
    _, comp = strategies.run("gelu", level="L0", repeats=1)
    tanh = _by_strategy(comp)["tanh"]
    exact_cases = [r for r in tanh if "approximate=tanh" not in r["case"]]
    assert all(r["verdict"] == "PASS" for r in tanh if r["dtype"] in ("bf16", "fp16"))
    assert all(r["verdict"] == "FAIL" for r in exact_cases if r["dtype"] == "fp32")


def test_attention_bf16_pv_needs_the_split_in_fp32():
    _, comp = strategies.run("attention", level="L0", repeats=1)
    rows = _by_strategy(comp)
    assert all(r["verdict"] == "FAIL" for r in rows["bf16_pv"] if r["dtype"] == "fp32")
    for name in ("bf16_pv_split", "online_softmax", "whole_row"):
        assert all(r["verdict"] == "PASS" for r in rows[name]), name
    assert all(r["median_ms"] is not None and r["median_ms"] > 0 for r in comp["table"])


def test_strategies_command_writes_table_and_report(tmp_path):
    from helpers import run_cli
    out = run_cli("strategies", "linear", "--level", "L0", "--repeats", "2",
                  "--reports", tmp_path, "--run-id", "s")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ranking" in out.stdout and "matmul_then_add" in out.stdout
    assert (tmp_path / "s" / "strategies.csv").exists()
    assert 'id="strategy-ranking"' in (tmp_path / "s" / "report.html").read_text()
