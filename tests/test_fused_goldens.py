"""Large element-wise optimizer goldens run compiled and fused (one read of the inputs,
one write of the outputs); they must equal the torch evaluation of the same formula to
the last bit, special values included."""
import pytest
import torch

import verify
from verify.goldens import chunked

OPS = [("apply_adam_w_v2", {"step": 3}), ("apply_rms_prop", {}),
       ("sgd_momentum", {"nesterov": True, "weight_decay": 0.01, "dampening": 0.1}),
       ("sgd_momentum", {}), ("adagrad", {"step": 4, "lr_decay": 0.01, "weight_decay": 0.1}),
       ("lion", {"weight_decay": 0.1})]


def _inputs(spec, n, gen):
    out = {}
    for i in spec.inputs:
        t = torch.randn(n, generator=gen, dtype=torch.float64)
        if i.name in ("v", "ms", "state_sum"):
            t = t.abs() * 0.01
        t[:6] = torch.tensor([0.0, -0.0, 1e-300, -1e-310, 3e38, -2.5])
        out[i.name] = t
    return out


@pytest.mark.parametrize("name,params", OPS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPS)])
def test_fused_and_torch_goldens_agree_to_the_last_bit(name, params, monkeypatch):
    spec = verify.op(name)
    ins = _inputs(spec, 4099, torch.Generator().manual_seed(3))
    kw = {**spec.params, **params}
    monkeypatch.setattr(chunked, "FUSED_MIN_ELEMENTS", 1 << 62)
    by_torch = spec.golden_fn(**ins, **kw)
    monkeypatch.setattr(chunked, "FUSED_MIN_ELEMENTS", 1)
    monkeypatch.setattr(chunked, "_COMPILED", {})  # empty: the check below sees this op
    fused = spec.golden_fn(**ins, **kw)
    assert chunked._COMPILED, "the fused path did not run"
    for a, b in zip(by_torch, fused):
        same_nan = a.isnan() & b.isnan()  # sqrt of a negative input: NaN either way
        bits_a, bits_b = a.view(torch.int64)[~same_nan], b.view(torch.int64)[~same_nan]
        assert torch.equal(bits_a, bits_b), name


def test_golden_sqrt_is_correctly_rounded():
    """The goldens' sqrt against exact integer arithmetic: r = sqrt(x) correctly rounded
    means (r - ulp/2)^2 <= x <= (r + ulp/2)^2, checked with fractions."""
    import math
    from fractions import Fraction
    gen = torch.Generator().manual_seed(8)
    x = torch.rand(3000, generator=gen, dtype=torch.float64) * torch.exp2(
        torch.randint(-60, 60, (3000,), generator=gen).double())
    for v, r in zip(x.tolist(), chunked.sqrt(x).tolist()):
        half = Fraction(math.ulp(r)) / 2
        assert (Fraction(r) - half) ** 2 <= Fraction(v) <= (Fraction(r) + half) ** 2, v


def test_the_new_goldens_are_within_1e_15_normwise_of_the_old_torch_formula():
    """Only the sqrt changed (torch's SLEEF sqrt -> IEEE): AdamW against its former
    torch evaluation, normwise."""
    spec = verify.op("apply_adam_w_v2")
    gen = torch.Generator().manual_seed(11)
    w, g, m = (torch.randn(20000, generator=gen, dtype=torch.float64) for _ in range(3))
    v = torch.rand(20000, generator=gen, dtype=torch.float64) * 0.01
    p = {**spec.params, "step": 5}
    bc1, bc2 = 1.0 - p["beta1"] ** 5, 1.0 - p["beta2"] ** 5
    m_t = p["beta1"] * m + (1.0 - p["beta1"]) * g
    v_t = p["beta2"] * v + (1.0 - p["beta2"]) * g * g
    upd = (m_t / bc1) / (torch.sqrt(v_t / bc2) + p["eps"]) + p["weight_decay"] * w
    old = w - p["lr"] * upd
    new = spec.golden_fn(w, g, m, v, **p)[0]
    assert float((new - old).norm() / old.norm()) <= 1e-15
