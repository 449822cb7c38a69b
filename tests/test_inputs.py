"""Inputs are deterministic: same case, bitwise the same tensors, on any machine."""
import torch

from verify.cases import case as cases
from verify.specs import inputs

from helpers import write_cases

DOC = {"op": "apply_adam_w_v2", "levels": {"L0": [
    {"id": "det", "shape": [17, 33], "dtype": ["fp32", "bf16"], "seed": 1234}]}}

# BLAKE3 fingerprints of the inputs of DOC, recorded once. They depend only on the case
# (NumPy's PCG64 stream and IEEE rounding), so a different value means the inputs changed.
EXPECTED = {"fp32": "9fb8a1a05eba7a96", "bf16": "963f29596aa3817d"}


def _cases(tmp_path):
    return {c.dtype: c for c in cases.load_file(write_cases(tmp_path, DOC))}


def test_same_case_gives_bitwise_same_inputs(tmp_path):
    for c in _cases(tmp_path).values():
        a, b = inputs.make_inputs(c), inputs.make_inputs(c)
        for name in a:
            bits_a = a[name].reshape(-1).view(torch.uint8)
            assert torch.equal(bits_a, b[name].reshape(-1).view(torch.uint8))
        assert inputs.fingerprint(a) == inputs.fingerprint(b)


def test_fingerprints_are_stable_across_machines(tmp_path):
    got = {d: inputs.fingerprint(inputs.make_inputs(c)) for d, c in _cases(tmp_path).items()}
    assert got == EXPECTED


def test_inputs_have_working_and_state_dtypes(tmp_path):
    c = _cases(tmp_path)["bf16"]
    t = inputs.make_inputs(c)
    assert t["weight"].dtype == torch.bfloat16 and t["grad"].dtype == torch.bfloat16
    assert t["m"].dtype == torch.float32 and t["v"].dtype == torch.float32
    assert (t["v"] >= 0).all()


def test_golden_sees_exactly_the_kernel_values(tmp_path):
    c = _cases(tmp_path)["bf16"]
    t = inputs.make_inputs(c)
    up = t["weight"].to(torch.float64)
    assert torch.equal(up.to(torch.bfloat16), t["weight"])  # upcast is exact


def test_each_step_draws_a_fresh_gradient(tmp_path):
    c = _cases(tmp_path)["fp32"]
    g0 = inputs.make_inputs(c, 0, ["grad"])["grad"]
    g1 = inputs.make_inputs(c, 1, ["grad"])["grad"]
    assert not torch.equal(g0, g1)


def test_special_distributions():
    rng_seed = 5
    d = {"dist": "special", "values": ["nan", "inf"], "fraction": 0.5}
    t = inputs.make_input("x", d, (1000,), torch.float16, rng_seed)
    assert t.isnan().any() and t.isinf().any() and t.isfinite().any()
    tiny = inputs.make_input("x", {"dist": "tiny"}, (100,), torch.float16, rng_seed)
    assert (tiny.abs() >= torch.finfo(torch.float16).tiny).all()
    sub = inputs.make_input("x", {"dist": "subnormal"}, (100,), torch.float32, rng_seed)
    assert (sub.abs() < torch.finfo(torch.float32).tiny).all()
    huge = inputs.make_input("x", {"dist": "huge"}, (100,), torch.bfloat16, rng_seed)
    assert huge.isfinite().all() and (huge.abs() > 1e37).all()
    const = inputs.make_input("x", {"dist": "constant", "value": -0.25}, (3,), torch.float32, 0)
    assert const.tolist() == [-0.25] * 3
