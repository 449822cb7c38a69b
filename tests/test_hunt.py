"""verify hunt and verify shrink: planted bugs that L0 and L1 miss are found at the
default budget, their found cases fail again, their reproducers fail standalone and are
small; the torch kernels of those ops hunt clean; a seed gives the same found cases."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import verify
from verify.errors import ConfigError
from helpers import REPO, run_cli

PLANTED = str(REPO / "tests" / "data" / "planted_kernels.py")
# a scale (softmax), a large mean (layer_norm), rows past a block (rms_norm), a param
# combination (sgd_momentum: nesterov with weight decay), a late step (AdamW at 1e5)
OPS = ["softmax", "layer_norm", "rms_norm", "sgd_momentum", "apply_adam_w_v2"]
SMALL = 1 << 19  # elements: the hunt's inputs stay cheap on a 2-core runner
# the fewest elements each planted bug can fail with (rms_norm's drops the tail of rows
# longer than 512): a reproducer is at most 1% of the hunted case, or within 2x of this
FEWEST = {"softmax": 1, "layer_norm": 2, "rms_norm": 513, "sgd_momentum": 1,
          "apply_adam_w_v2": 1}


def test_the_planted_kernels_pass_every_l0_and_l1_case():
    result = verify.run(level="L0,L1", ops=OPS, backends=["planted"], kernels=[PLANTED],
                        reports=False)
    assert result.rows and {r["verdict"] for r in result.rows} == {"PASS"}


@pytest.mark.parametrize("op", OPS)
def test_a_planted_bug_is_found_fails_again_and_shrinks_to_a_failing_reproducer(op, tmp_path):
    found = verify.hunt(op, "planted", kernels=[PLANTED], dtypes=["fp32"], seed=0,
                        max_elements=SMALL, reports=tmp_path / "r")
    assert found.found and found.exit_status == 1
    cases = found.run_dir / "found_cases.json"
    again = verify.run(level="L0", cases=str(cases), backends=["planted"], kernels=[PLANTED],
                       reports=False)
    assert any(r["verdict"] == "FAIL" for r in again.rows)
    # the largest of the found cases written (the claim: shrinking cuts it to 1%)
    written = json.loads(cases.read_text())["levels"]["L0"]
    biggest = max(written, key=lambda e: math.prod(e["shape"]))
    shrunk = verify.shrink(found.run_dir, case=biggest["id"], out=tmp_path / "s")
    (s,) = shrunk
    before, after = s["elements"]
    assert after <= max(before / 100, 2 * FEWEST[op]), s
    proc = subprocess.run([sys.executable, s["repro"]], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "still wrong" in proc.stdout, proc.stdout + proc.stderr
    doc = json.loads(open(s["case_file"]).read())
    assert doc["levels"]["L0"][0]["shape"] == s["entry"]["shape"]


@pytest.mark.parametrize("op", OPS)
def test_the_torch_kernels_hunt_clean(op):
    result = verify.hunt(op, "torch", dtypes=["fp32"], seed=0, max_elements=SMALL,
                         reports=False)
    if op == "layer_norm":
        # explained weaknesses (README "Hunting") of PyTorch's layer_norm: rows of one
        # element (whose normalised values and gradients are exactly 0), and rows holding
        # a value near fp32's largest (its variance overflows: NaN)
        for t in result.found:
            fails = [r for r in t.rows if r["verdict"] == "FAIL"]
            extreme = "huge" in json.dumps(t.entry.get("inputs", {}).get("x", {}))
            if extreme and all(r.get("nan_inf_mismatch") for r in fails):
                continue
            assert t.entry["shape"][-1] == 1, t.entry
            assert {r["output"] for r in fails} <= {"y", "grad_x", "grad_weight"}, t.entry
    elif op == "softmax":
        # the other (README "Hunting"): PyTorch's fp32 CPU softmax sums a long row in
        # fp32, so its error grows with the row (mean ULP ~270 at 32,000, ~950 at 131,072)
        for t in result.found:
            fails = [r for r in t.rows if r["verdict"] == "FAIL"]
            assert t.entry["shape"][-1] >= 16384 and {r["output"] for r in fails} == {"y"}, \
                t.entry
    else:
        assert result.found == [], [t.entry for t in result.found]
    assert result.tried >= 50


def test_the_explained_weaknesses_of_pytorch_hold():
    """README "Hunting" explains two findings on built-in kernels by PyTorch's own
    arithmetic; both still hold, measured against float64: layer_norm's CPU backward on a
    row far from 0 with no spread (uncentred sums), and an fp32 einsum over 65,536 terms
    (the mhc_post backward's grad_h_post) against a pairwise sum."""
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(0)
    n = 4093
    x = torch.full((2, n), 9984.0)
    w = torch.rand(n, generator=gen) * 1e4 + 1.05e5
    dy = torch.randn(2, n, generator=gen)
    x64 = x.double().requires_grad_(True)
    F.layer_norm(x64, (n,), w.double(), None, eps=1e-5).backward(dy.double())
    x32 = x.clone().requires_grad_(True)
    F.layer_norm(x32, (n,), w, None, eps=1e-5).backward(dy)
    wd = w * dy  # the same gradient, centred: rstd (w dy - mean(w dy)), as x_hat = 0
    centred = (wd - wd.mean(-1, keepdim=True)) / torch.sqrt(torch.tensor(1e-5))
    torch_err = (x32.grad.double() - x64.grad).abs().max()
    assert torch_err > 100 * (centred.double() - x64.grad).abs().max()
    assert torch_err > 1e-3 * x64.grad.abs().mean()
    d = 65536
    xs = torch.randn(1, 5, d, generator=gen, dtype=torch.float64) * 10 + 1e4
    go = torch.randn(1, 5, 4, d, generator=gen, dtype=torch.float64)
    exact = torch.einsum("bsid,bsd->bsi", go, xs)
    einsum_err = (torch.einsum("bsid,bsd->bsi", go.float(), xs.float()).double() - exact)
    pairwise_err = ((go.float() * xs.float()[..., None, :]).sum(-1).double() - exact)
    assert einsum_err.abs().max() > 3 * pairwise_err.abs().max()


def test_the_chunked_gated_delta_rule_leaves_rounding_noise_where_grad_g_is_exactly_0():
    """README "Hunting": chunk_gated_delta_rule's grad_g at a sequence's first token is
    exactly 0 without an initial state (the outputs depend on g only through g_t - g_s,
    s < t), which the token-by-token golden and its fp32 evaluation give exactly; the
    chunked kernel's reverse cumsum leaves fp32 rounding there, as large as its error on
    every other token. With v scaled up that noise exceeds the standard's atol."""
    from verify.goldens import gated_delta as gold
    from verify.kernels.torch.gated_delta import chunk_gated_delta_rule as kernel
    gen = torch.Generator().manual_seed(0)
    shape = (2, 9, 4, 8)
    q, k = (torch.randn(shape, generator=gen, dtype=torch.float64) * 0.1 for _ in range(2))
    v = torch.randn(shape, generator=gen, dtype=torch.float64) * 1e4
    g = -torch.rand(shape[:3], generator=gen, dtype=torch.float64) * 0.1
    beta = torch.rand(shape[:3], generator=gen, dtype=torch.float64)
    do = torch.randn(shape, generator=gen, dtype=torch.float64)

    def grad_g(fn, dtype):
        xs = [t.to(dtype).detach().requires_grad_(True) for t in (q, k, v, g, beta)]
        fn(*xs).backward(do.to(dtype))
        return xs[3].grad.double()

    exact = grad_g(lambda *x: gold.chunk_gated_delta_rule(
        *x, None, None, scale=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, chunk_size=64)[0], torch.float64)
    chunked = grad_g(lambda *x: kernel(*x, output_final_state=False), torch.float32)
    assert exact[:, 0].abs().max() == 0.0
    noise = chunked[:, 0].abs().max()
    elsewhere = (chunked - exact)[:, 1:].abs().max()
    assert 1.5e-5 < noise <= 4 * elsewhere  # over the atol, and the kernel's usual error
    assert elsewhere < 1e-6 * exact.abs().max()  # fp32 rounding of grad_g's scale


def test_the_gated_delta_floor_takes_its_decays_from_the_chunk_local_cumsum(tmp_path):
    """The op's compute-precision floor leaves the same kind of rounding at the first
    token's grad_g as a chunked kernel (its decays come from g's chunk-local cumsum), so
    the kernel stays within a few times that floor there: no finding."""
    path = tmp_path / "chunk_gated_delta_rule.json"
    path.write_text(json.dumps({"op": "chunk_gated_delta_rule", "levels": {"L0": [
        {"id": "v-scaled", "shape": [8, 9, 61, 8], "dtype": "fp32", "seed": 5,
         "inputs": {"v": {"dist": "normal", "mean": 0.0, "std": 1e4}}}]}}))
    result = verify.run(level="L0", cases=str(path), backends=["torch"], reports=False)
    (row,) = [r for r in result.rows if r["output"] == "grad_g"]
    assert row["cfloor_max_abs"] > 0 and row["cfloor_ratio"] < 4, row
    assert all(r["cfloor_ratio"] < 1 for r in result.rows if r["output"] != "grad_g")


def test_the_same_seed_gives_the_same_found_cases():
    def found(seed):
        r = verify.hunt("softmax", "planted", kernels=[PLANTED], dtypes=["fp32"], seed=seed,
                        budget=24, max_elements=SMALL, reports=False)
        return [t.entry for t in r.found]
    first = found(5)
    assert first and found(5) == first


def test_verify_hunt_cli_exits_1_with_found_cases_and_2_on_a_bad_op(tmp_path):
    proc = run_cli("hunt", "--op", "softmax", "--backend", "planted", "--kernels", PLANTED,
                   "--dtype", "fp32", "--budget", "8", "--max-elements", str(SMALL),
                   "--reports", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failed" in proc.stdout and list(tmp_path.glob("*/found_cases.json"))
    proc = run_cli("hunt", "--op", "no_such_op", "--backend", "torch")
    assert proc.returncode == 2 and "no_such_op" in proc.stderr


def test_a_hunt_keeps_its_candidates_within_the_memory_available(monkeypatch):
    """A --max-elements beyond what memory allows (half of what is available, over the
    processes) is lowered, with a warning in the summary and the run's meta."""
    from verify.running import hunt
    monkeypatch.setattr(hunt, "available_memory", lambda: 64 << 20)  # 64 MiB
    spaces = []
    real = hunt.Space.of
    monkeypatch.setattr(hunt.Space, "of", classmethod(
        lambda cls, *a: spaces.append(real(*a)) or spaces[-1]))
    result = verify.hunt("silu", "torch", dtypes=["fp32"], budget=4, max_elements=1 << 24,
                         reports=False)
    most = (64 << 20) // 2 // hunt.BYTES_PER_ELEMENT
    assert spaces[0].max_elements == most and result.tried == 4
    assert "does not fit in memory" in hunt.summary(result)
    assert hunt.memory_bound(1 << 10, 2) == (1 << 10, None)  # what fits is left alone


def test_max_elements_takes_l2_sizes():
    """--max-elements above the default 2^21 (an L2-sized hunt) parses, as digits or 2^N;
    0 and words are usage errors naming the flag."""
    from verify import cli
    parser = cli._parser()
    for text, n in (("33554432", 1 << 25), ("2^27", 1 << 27)):
        a = parser.parse_args(["hunt", "--op", "softmax", "--backend", "torch",
                               "--max-elements", text])
        assert a.max_elements == n
    for text in ("0", "lots", "2^"):
        with pytest.raises(SystemExit):
            parser.parse_args(["hunt", "--op", "softmax", "--backend", "torch",
                               "--max-elements", text])


def test_the_space_covers_param_combinations_late_steps_and_value_families(tmp_path):
    """What the hunt draws from an op's declaration: params over their natural ranges
    (bools both ways, the step up to 1e5, decades of a float, never eps -> 0.9) and the
    value families, each loading through the case loader with the values it names."""
    import numpy as np
    import torch
    from verify.cases.case import load_file
    from verify.running import hunt
    from verify.specs import inputs, registry
    registry.load_builtin()
    sgd = hunt.param_values(registry.op("sgd_momentum"))
    assert sgd["nesterov"] == ["false", "true"]
    assert {"0.01", "0.1"} <= set(sgd["weight_decay"])
    adam = hunt.param_values(registry.op("apply_adam_w_v2"))
    assert "100000" in adam["step"] and "0.99" in adam["beta1"]
    assert all(float(v) < 0.5 for v in adam["eps"]), adam["eps"]
    # an op whose shape rule fixes its last dim (hunt['last_dim']): every candidate and
    # every mutation keeps it, the leading dims still vary
    space = hunt.Space.of(registry.op("sinkhorn"), ["fp32"], 1 << 18)
    rng = np.random.default_rng(0)
    shapes = [space.random(rng, i).shape for i in range(40)]
    shapes += [space.mutate(space.random(rng, i), rng).shape for i in range(40)]
    assert {s[-1] for s in shapes} == {24} and len({s[:-1] for s in shapes}) > 5
    with pytest.raises(ConfigError, match="last_dim"):
        registry._check_hunt("x", "here", {"last_dim": []}, [], {})
    # the chunked ops' declared contracts: solve_tril's block sizes; the gated delta
    # rule's head dims, searched inputs (q, v), families (no extremes) and element budget
    space = hunt.Space.of(registry.op("solve_tril"), ["fp32"], 1 << 21)
    assert {space.random(rng, i).shape[-1] for i in range(40)} == {16, 32, 64}
    space = hunt.Space.of(registry.op("chunk_gated_delta_rule"), ["fp32"], 1 << 21)
    cands = [space.random(rng, i) for i in range(60)]
    cands += [space.mutate(c, rng) for c in cands]
    assert space.max_elements == 1 << 18
    assert all(16 <= c.shape[-1] <= 128 for c in cands)
    assert {n for c in cands for n, _ in c.scale + c.offset + c.family} == {"q", "v"}
    assert not any(f.startswith("extreme") for c in cands for _, f in c.family)
    spec = registry.op("apply_adam_w_v2")
    seen = {}
    for label in [f"{f}:{v}" for f, vs in hunt.VARIANTS.items() for v in vs]:
        cand = hunt.Candidate("fp32", (64, 256), family=(("grad", label), ("v", label)))
        entry = cand.entry(spec, "c", 3)
        path = tmp_path / label.replace(":", "-") / "apply_adam_w_v2.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"op": spec.name, "levels": {"L0": [entry]}}))
        (case,) = load_file(path)
        x = inputs.make_inputs(case)
        g, v = x["grad"].double().numpy(), x["v"].double().numpy()
        assert (v >= 0).all(), label  # a non-negative state stays non-negative
        seen[label] = g
    tiny = torch.finfo(torch.float32).tiny
    assert (np.abs(seen["subnormal:all"]) < tiny).all()
    assert ((np.abs(seen["subnormal:quarter"]) < tiny) & (seen["subnormal:quarter"] != 0)).mean() > 0.2
    assert (seen["zeros:half"] == 0).mean() > 0.4 and (seen["zeros:all"] == 0).all()
    assert np.abs(seen["extreme:few"]).max() > 1e37
    rows = np.sort(seen["peaked:m100"].reshape(64, 256), -1)  # one confident entry a row
    assert ((rows[:, -1] - rows[:, -2]) > 50 * rows[:, :-1].std(-1)).all()
    heavy, plain = seen["heavy:df1.5"], np.random.default_rng(0).normal(size=64 * 256)
    assert np.abs(heavy).max() / np.abs(heavy).std() > 3 * np.abs(plain).max() / plain.std()
    out = seen["outliers:x1e4"]
    assert np.abs(out).max() > 1e3 * np.median(np.abs(out))


def test_workers_spread_a_hunt_without_changing_what_it_finds_and_a_crash_is_a_finding(
        tmp_path):
    """-n 2 gives the found cases of a serial hunt; a kernel that ends its process is a
    finding ('kernel crashed its process'), and the hunt goes on."""
    def found(**kw):
        r = verify.hunt("softmax", "planted", kernels=[PLANTED], dtypes=["fp32"], seed=2,
                        budget=16, max_elements=SMALL, reports=False, **kw)
        return [t.entry for t in r.found]
    assert found(workers=2) == found()
    crashy = tmp_path / "crashy.py"
    crashy.write_text(
        "import os, torch, verify\n"
        "@verify.kernel('silu', backend='crashy')\n"
        "def silu_dies_on_long_rows(x):\n"
        "    if x.shape[-1] > 1000:\n"
        "        os._exit(3)\n"
        "    return torch.nn.functional.silu(x)\n")
    r = verify.hunt("silu", "crashy", kernels=[str(crashy)], dtypes=["fp32"], budget=16,
                    max_elements=SMALL, reports=False, workers=2)
    assert r.tried == 16 and r.found
    for t in r.found:
        assert t.entry["shape"][-1] > 1000
        assert any("kernel crashed its process" in x["reason"] for x in t.rows)


def test_verify_run_shrink_shrinks_a_failing_case_of_a_run(tmp_path):
    """verify run --shrink: a case that FAILed in a run, shrunk, with a reproducer that
    fails standalone."""
    cases = tmp_path / "softmax.json"
    cases.write_text(json.dumps({"op": "softmax", "levels": {"L0": [
        {"id": "big-logits", "shape": [64, 1000], "dtype": "fp32",
         "inputs": {"x": {"dist": "normal", "std": 100.0}}}]}}))
    proc = run_cli("run", "--level", "L0", "--cases", cases, "--backend", "planted",
                   "--kernels", PLANTED, "--reports", tmp_path / "r", "--run-id", "one",
                   "--store", tmp_path / "s", "--shrink", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    shrunk = tmp_path / "r" / "one" / "shrunk"
    (script,) = shrunk.glob("repro_softmax_*.py")
    (case_file,) = shrunk.glob("shrunk_softmax_*.json")
    entry = json.loads(case_file.read_text())["levels"]["L0"][0]
    assert math.prod(entry["shape"]) <= 64 * 1000 // 100, entry
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert run.returncode == 1 and "still wrong" in run.stdout, run.stdout + run.stderr
