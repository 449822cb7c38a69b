"""Metrics against NumPy written from the definitions in standards.md; standards at their
thresholds; the error floor."""
import math

import numpy as np
import pytest
import torch

import verify
from verify.comparator import dtypes as dt
from verify.comparator import metrics
from verify.comparator import standards

import masked_block


def numpy_reference(a, g, eps_ms, small, small_atol, mant, min_exp, device=np.float32):
    """The definitions written out in NumPy; EB is msprobe's get_error_balance: outputs
    against the golden cast to the output's NumPy dtype (``device``), over all n."""
    cast = g.astype(device).astype(np.float64)
    a = a.astype(np.float64)
    d = np.abs(a - g)
    rel = d / (np.abs(g) + 1e-7)
    e = np.where(g == 0, min_exp, np.maximum(np.floor(np.log2(np.abs(np.where(g == 0, 1, g)))), min_exp))
    ulp = d * 2.0 ** (mant - e)
    is_small = np.abs(g) <= small
    r2 = d / (np.abs(g) + eps_ms)
    ok3 = np.where(is_small, d <= small_atol, r2 < 1e-3)
    return {
        "mere": rel.mean(), "mare": rel.max(), "max_abs": d.max(),
        "rmse": math.sqrt((d ** 2).mean()),
        "cosine": float(a @ g / math.sqrt((a @ a) * (g @ g))),
        "eb": abs(int((a > cast).sum()) - int((a < cast).sum())) / a.size,
        "eb_mean": abs(((a - g) / np.maximum(1, np.abs(g))).mean()),
        "ulp_max": ulp.max(), "ulp_mean": ulp.mean(),
        "thousandth": ok3.mean(),
        "argmax_abs": int(d.argmax()),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_metrics_match_numpy_over_many_blocks(dtype):
    gen = torch.Generator().manual_seed(0)
    n = 3 * metrics.BLOCK + 12345  # several blocks and a tail
    g = torch.randn(n, generator=gen, dtype=torch.float64) * 3
    g[:100] = 0.0
    g[100:200] *= 1e-6  # the small-value domain
    a = (g * (1 + 1e-3 * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
    m = metrics.measure(a, g)
    t = dt.traits(dtype)
    ref = numpy_reference(a.to(torch.float64).numpy(), g.numpy(), t.msprobe_eps, t.small_value,
                          metrics.thousandth_small_atol(dtype), t.mantissa_bits, t.min_exp,
                          np.float16 if dtype == torch.float16 else np.float32)
    for key, want in ref.items():
        got = getattr(m, key)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-300), key
    assert m.n == n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("where", ["run start", "run end", "tail", "tie"])
def test_the_worst_elements_are_numpy_s_first_largest(dtype, where):
    """argmax_abs / argmax_rel: the first finite pair with the largest |a - g| and
    d / (|g| + 1e-7), as NumPy finds them, wherever they lie in the tensor (a NaN / Inf
    pair before them, whose error is not finite, is passed over)."""
    gen = torch.Generator().manual_seed(3)
    n = 2 * metrics.BLOCK + 1000
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    a = (g * (1 + 1e-4 * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
    at = {"run start": metrics.BLOCK + 512, "run end": metrics.BLOCK + 255,
          "tail": n - 1, "tie": 77}[where]
    a[at] = g[at] + 40.0  # the largest error
    g[at - 5] = 1e-9  # the largest relative error, beside it
    a[at - 5] = 0.5
    a[3] = float("nan")  # a NaN pair and an Inf pair before both
    g[9] = float("inf")
    if where == "tie":  # the same errors again, later: the first is the one
        a[at + 5000], g[at + 5000] = a[at], g[at]
        a[at + 4990], g[at + 4990] = a[at - 5], g[at - 5]
    m = metrics.measure(a, g)
    x, y = a.to(torch.float64).numpy(), g.numpy()
    finite = np.isfinite(x) & np.isfinite(y)
    with np.errstate(invalid="ignore"):
        d = np.where(finite, np.abs(x - y), -1.0)
        rel = np.where(finite, np.abs(x - y) / (np.abs(y) + 1e-7), -1.0)
    assert (m.argmax_abs, m.argmax_rel) == (int(d.argmax()), int(rel.argmax())) \
        == (at, at - 5)


def test_nan_inf_placement():
    g = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0], dtype=torch.float64)
    same = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0])
    m = metrics.measure(same, g)
    assert m.nan_inf_mismatch == 0 and m.n == 2 and m.max_abs == 0
    moved = torch.tensor([float("nan"), 1.0, -float("inf"), -float("inf"), 2.0])
    m = metrics.measure(moved, g)
    assert m.nan_inf_mismatch == 3
    ok, why = standards.judge("allclose", m, torch.float32)
    assert not ok and "NaN/Inf placement" in why


# the lean block variants (and their masked twins, for a block with NaN / Inf) against
# the masked reference (tests/masked_block.py), with what each keeps: (rels, tols, cells)
LEAN_AND_MASKED = ((metrics._block_tols, metrics._masked_tols, masked_block.masked_tols,
                    (False, True, True)),
                   (metrics._block_rels, metrics._masked_rels, masked_block.masked_rels,
                    (True, False, True)),
                   (metrics._half_block_rels, metrics._masked_half_rels,
                    masked_block.masked_half_rels, (True, False, True)))
HALF_VARIANTS = (metrics._half_block_rels,)
HALVES = (torch.bfloat16, torch.float16)  # measured as float32, as the pass upcasts them


def _variants_for(dtype):
    """LEAN_AND_MASKED less the half variants unless the actual is fp16's (their error
    balance counts hold for an actual on half's grid alone)."""
    return [v for v in LEAN_AND_MASKED if v[0] not in HALF_VARIANTS or dtype == torch.float16]


def _block_slots(variant, a_np, g_np, c, keep=None):
    """Every slot and kept error of one block variant over the whole of a_np / g_np; with
    ``keep`` (the variant's kept errors), as the pass takes a block with NaN / Inf: the
    variant (the masked twin) over it, then the NaN / Inf pairs settled."""
    n = len(g_np)
    abits, aexp, aman = metrics._bits_of(a_np)
    out = np.zeros(metrics.N_SLOTS)
    reference = variant in REFERENCES  # keeps its errors as float64, the pass as keys
    errors = np.float64 if reference else np.uint32
    rels, tols, cells = np.zeros(n, errors), np.zeros(n, errors), np.zeros(n, np.uint32)
    assert not variant(a_np, abits, aexp, aman, g_np, g_np.view(np.int64), 0, n, c, out,
                       rels, tols, cells)  # finite, or NaN / Inf masked
    if keep is not None:
        spots = np.empty(n, np.int64)
        k = metrics._special_spots(a_np, abits, aexp, aman, g_np, g_np.view(np.int64), spots)
        metrics._settle_specials(out, spots, k, *(x if kept else x[:0] for x, kept in
                                                  zip((rels, tols, cells), keep)))
    if reference:  # the keys of what it keeps (an array it does not write stays 0, as the
        # lean variant's does)
        if variant is masked_block.masked_tols:
            tols = heat_keys(tols)
        else:  # keeps the rels: their keys, the cells
            tols = tols.astype(np.uint32)
            assert (heat_keys(rels) == cells).all()
    # the pass's relative errors' keys are its cells (kept once, for both)
    return np.concatenate([out.view(np.int64), tols.astype(np.int64), cells.astype(np.int64)])


REFERENCES = (masked_block.masked_tols, masked_block.masked_rels, masked_block.masked_half_rels)


def heat_keys(errors: np.ndarray) -> np.ndarray:
    """The heat map's keys of errors 0 <= e <= 1e300, as the pass keeps them: the bits
    over 2^31, rounded up, plus 2^13 - 1 (so that a key's top 19 bits are its histogram
    cell, 0 for an error of 0)."""
    return (((errors.view(np.uint64) + np.uint64(2 ** 31 - 1)) >> np.uint64(31))
            + np.uint64(2 ** 13 - 1)).astype(np.uint32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64,
                                   torch.float16])
def test_the_lean_block_pass_is_the_masked_one_to_the_bit(dtype):
    """The pass's lean block variant and its masked twin give every slot and every kept
    error of the masked one-loop pass bit for bit: on finite data (zeros, subnormals,
    huge values), and (the twin, with the spots settled) on a block with every kind of
    NaN / Inf pair (the same NaN,
    the same signed Inf, Inf against -Inf, NaN against a number, a number against Inf).
    The half variants (fp16's error balance, counted for an actual on half's grid) over
    an fp16 output off by about an ULP, whose errors straddle half of one."""
    n = metrics.BLOCK - 3  # a vector tail too
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    g[:50] = 0.0
    g[50:100] = 1e-310 if dtype != torch.float16 else 1e-6  # half's subnormals
    g[100:150] *= 1e30 if dtype != torch.float16 else 1e3
    a = (g * (1 + 1e-3 * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
    a_np = a.to(torch.float32).numpy() if dtype in HALVES else a.numpy()
    g_np = g.numpy()
    c = metrics._constants(dtype, 1e-5, 1e-5)
    variants = _variants_for(dtype)
    for lean, twin, reference, _ in variants:
        want = _block_slots(reference, a_np, g_np, c)
        assert (_block_slots(lean, a_np, g_np, c) == want).all()
        assert (_block_slots(twin, a_np, g_np, c) == want).all()
    inf, nan = float("inf"), float("nan")
    pairs = [(nan, nan), (inf, inf), (-inf, -inf), (inf, -inf), (nan, 1.0), (1.0, nan),
             (2.0, inf), (-inf, 3.0), (nan, inf)]
    a_np, g_np = a_np.copy(), g_np.copy()
    for k, (x, y) in enumerate(pairs * 40):
        j = (k * 997) % n
        a_np[j], g_np[j] = x, y
    for _, twin, reference, keep in variants:
        got = _block_slots(twin, a_np, g_np, c, keep)
        assert (got == _block_slots(reference, a_np, g_np, c)).all()
        m = got[:metrics.N_SLOTS].view(np.float64)
        assert m[metrics.SPECIAL_EQ] == 3 * 40 and m[metrics.NONFINITE_BAD] == 6 * 40


@pytest.mark.parametrize("tols", [(None, None), (0.0, 0.0)], ids=["default", "zero"])
def test_the_floor_block_rounding_as_it_goes_is_the_one_over_the_rounded_golden(tols):
    """The fp32 floor's block variant that rounds the golden itself gives every slot and
    cell of the block variant over the golden rounded beforehand (by the general
    rounding, _round_range), to the bit: quiet blocks, and loud ones (zero tolerances)
    whose tolerance and ratio counts run in loops of their own, rounding too; goldens of
    0, subnormal, ties of the format and just under them, the largest finite; a golden
    the rounding overflows is reported as NaN / Inf, for the pass to take the rounded
    copy."""
    dtype = torch.float32
    rng = np.random.default_rng(3)
    n = 4096 + 7
    bits, emin, vmax = metrics._rounding_of(dtype)
    g = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)
    g[:40] = 0.0
    g[40:80] = 2.0 ** (emin - 3) * rng.uniform(-1, 1, 40)  # the format's subnormals
    ties = rng.integers(1 << int(bits - 1), 1 << int(bits), 40) + 0.5
    g[80:120] = ties * 2.0 ** (1 - bits)  # halfway between two floats of the format
    g[120:160] = g[80:120] * (1 - 2.0 ** -40)  # just under a tie: float32 rounds it up
    g[160:164] = vmax
    d_atol, d_rtol = metrics.default_tolerances(dtype)
    atol, rtol = (d_atol, d_rtol) if tols[0] is None else tols
    c = metrics._constants(dtype, atol, rtol)
    gbits = g.view(np.int64)
    r = np.empty_like(g)
    metrics._round_range(g, gbits, 0, n, metrics._rounding_of(dtype), r)
    exp, man = metrics._F64_EXP, metrics._F64_MAN
    for on_the_fly, over_rounded in ((metrics._floor_f32_cells, metrics._block_cells),
                                     (metrics._floor_f32_metrics, metrics._block_metrics)):
        slots = []
        for variant, x in ((on_the_fly, g), (over_rounded, r)):
            out, cells = np.zeros(metrics.N_SLOTS), np.zeros(n, dtype=np.uint32)
            assert not variant(x, x.view(np.int64), exp, man, g, gbits, 0, n, c, out,
                               np.zeros(n, np.uint32), np.zeros(n, np.uint32), cells)
            slots.append(np.concatenate([out, cells.astype(np.float64)]).view(np.int64))
        assert (slots[0] == slots[1]).all()
        loud = slots[0][:metrics.N_SLOTS].view(np.float64)[metrics.N_CASE] < n
        assert loud == (tols[0] is not None)
    over = g.copy()
    over[7] = vmax * 2
    assert metrics._floor_f32_cells(over, over.view(np.int64), exp, man, over,
                                      over.view(np.int64), 0, n, c, np.zeros(metrics.N_SLOTS),
                                      np.zeros(n, np.uint32), np.zeros(n, np.uint32),
                                      np.zeros(n, dtype=np.uint32))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16,
                                   torch.float16])
@pytest.mark.parametrize("tols", [(None, None), (0.0, 1e-3), (1e-5, 0.0), (0.0, 0.0)])
def test_a_quiet_block_s_known_counts_are_the_counted_ones(dtype, tols):
    """A block whose every error is within the quiet slope (d <= fl(q |g|)) takes its
    tolerance counts as known, without a test: they must be what the masked pass counts,
    element by element. Errors of exactly fl(q |g|), the next float above it (loud), half
    of it, none; goldens of 0, subnormal, in the small-value domain, at its bound,
    ordinary and huge; every standard's tolerances (atol or rtol 0 included, where the
    slope may be unusable and the counts always run). And small values off by the quiet
    offset (C_QUIET_ABS: quiet too, fp16's subnormals), by half and twice it, and a zero
    golden off by half of it (never quiet: an error at a zero golden is counted)."""
    atol, rtol = tols
    d_atol, d_rtol = metrics.default_tolerances(dtype)
    c = metrics._constants(dtype, d_atol if atol is None else atol,
                           d_rtol if rtol is None else rtol)
    q = c[metrics.C_QUIET]
    small = c[metrics.C_SMALL]
    gen = torch.Generator().manual_seed(5)
    n = 4096 + 5  # a vector tail too
    huge = 6e4 if dtype == torch.float16 else 1e30  # finite in the output dtype
    mags = [0.0, 1e-310, small / 3, small, np.nextafter(small, 1.0), 0.7, 3.0, huge]
    g = np.array([mags[k % len(mags)] for k in range(n)]) * \
        np.where(torch.rand(n, generator=gen).numpy() < 0.5, -1.0, 1.0)
    store = np.float64 if dtype == torch.float64 else np.float32  # bf16 / fp16: as upcast
    qa = c[metrics.C_QUIET_ABS]
    near = (np.abs(g) <= small) & (g != 0)
    seen = {}
    for step in ("none", "half", "at", "above", "abs_half", "abs_at", "abs_over", "abs_zero"):
        if step == "none":
            a = g.copy()
        elif step.startswith("abs"):  # small values off by (a part of) the quiet offset
            part = {"abs_half": 0.5, "abs_at": 1.0, "abs_over": 2.0, "abs_zero": 0.5}[step]
            bound = np.where(near, qa * part, np.abs(g) * max(q, 0.0) / 2)
            bound = np.where(g == 0, qa * part if step == "abs_zero" else 0.0, bound)
            a = g + np.where(g < 0, -bound, bound)
        else:
            bound = np.abs(g) * max(q, 0.0)
            bound = {"half": bound / 2, "at": bound, "above": np.nextafter(bound, np.inf)}[step]
            a = g + np.where(g < 0, -bound, bound)
        a_np = torch.from_numpy(a).to(dtype).to(torch.from_numpy(np.zeros(1, store)).dtype
                                                ).numpy()
        a = a_np.astype(np.float64)  # the stored actual's own error, as the pass sees it
        d = np.abs(a - g)
        loud = (d > np.maximum(np.abs(g) * q, np.where(near, qa, 0.0))).any() or q < 0
        seen[step] = "loud" if loud else "quiet"
        for lean, twin, reference, _ in _variants_for(dtype):
            want = _block_slots(reference, a_np, g, c)
            assert (_block_slots(lean, a_np, g, c) == want).all(), (step, lean)
            assert (_block_slots(twin, a_np, g, c) == want).all(), (step, twin)
    if q > 0 and dtype == torch.float64:  # the steps are what they say (exact errors)
        assert [seen[k] for k in ("none", "half", "above")] == ["quiet", "quiet", "loud"], seen
        if qa > 0:
            assert [seen[k] for k in ("abs_half", "abs_over", "abs_zero")] == \
                ["quiet", "loud", "loud"], seen


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_block_quiet_by_the_slope_knows_its_small_values_and_hundredth(dtype):
    """A bf16 / fp16 block quiet by the slope alone (every d <= fl(q |g|)) counts only
    the thousandth and the ten-thousandth (RATIOS_TRIMMED; fp16: the ten-thousandth, and
    by the offset too): the small values', the hundredth's (and fp16's thousandth's)
    counts it takes as known must be what the masked pass counts, element by element. The
    golden correctly rounded (quiet by the slope), with small values, zeros
    and values at the small bound; the ten-thousandth (and bf16's thousandth) not all."""
    d_atol, d_rtol = metrics.default_tolerances(dtype)
    c = metrics._constants(dtype, d_atol, d_rtol)
    assert c[metrics.C_RATIOS_TRIM] == (metrics.RATIOS_TRIMMED if dtype == torch.bfloat16
                                        else metrics.RATIOS_TEN_THOUSANDTH)
    small, q = c[metrics.C_SMALL], c[metrics.C_QUIET]
    gen = torch.Generator().manual_seed(9)
    n = 4096 + 5
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    spread = 0.1 + 0.9 * torch.rand(len(g[::7]), generator=gen, dtype=torch.float64)
    g[::7] = torch.sign(g[::7]) * small * spread  # small values, normal in either format
    g[3::11] = 0.0
    g[5::13] = small
    g_np = g.numpy()
    a_np = metrics.round_once(g, dtype).to(torch.float32).numpy()
    d = np.abs(a_np.astype(np.float64) - g_np)
    assert (d <= np.abs(g_np) * q).all()  # quiet by the slope
    small_ok = (np.abs(g_np) <= small) & (d <= c[metrics.C_THOU_ATOL])
    big = np.abs(g_np) > small
    rel = d / (np.abs(g_np) + c[metrics.C_EPS_MS])
    ratios = [int((small_ok | (big & (rel < t))).sum()) for t in (1e-2, 1e-3, 1e-4)]
    assert ratios[0] == n >= ratios[1] > ratios[2] and (np.abs(g_np) <= small).sum() > 500
    assert ratios[1] < n or dtype == torch.float16  # half's errors within the thousandth
    for lean, twin, reference, _ in _variants_for(dtype):
        want = _block_slots(reference, a_np, g_np, c)
        assert (_block_slots(lean, a_np, g_np, c) == want).all(), lean
        assert (_block_slots(twin, a_np, g_np, c) == want).all(), twin
        slots = want[:metrics.N_SLOTS].view(np.float64)
        assert [slots[k] for k in (metrics.N_OK_1E2, metrics.N_OK_1E3,
                                   metrics.N_OK_1E4)] == ratios
    # small values off by 2^-17 (on either grid): loud by the slope, quiet by the offset
    # (1e-5) alone; bf16's beyond their atol in the ratios (2^-18: counted), fp16's within
    # it (2^-16: known)
    near = (np.abs(g_np) <= small) & (np.abs(g_np) >= small / 4)
    off = a_np + np.where(near, np.sign(g_np) * 2.0 ** -17, 0.0).astype(np.float32)
    d = np.abs(off.astype(np.float64) - g_np)
    beyond = d[near] > c[metrics.C_THOU_ATOL]
    assert beyond.all() if dtype == torch.bfloat16 else not beyond.any()
    assert (d[near] <= c[metrics.C_QUIET_ABS]).all()
    assert (d[near] > np.abs(g_np[near]) * q).any()  # loud by the slope
    for lean, twin, reference, _ in _variants_for(dtype):
        want = _block_slots(reference, off, g_np, c)
        assert (_block_slots(lean, off, g_np, c) == want).all(), lean


def test_an_fp16_block_counts_the_ten_thousandth_strictly_in_its_own_loop():
    """A quiet fp16 block counts the ten-thousandth in its block loop
    (ten_thousandth_in_loop, not a loop of its own): d < 1e-4 (|g| + eps), strictly, as
    the masked pass tests it. Every pair found where d is exactly 1e-4 (|g| + eps) in
    float64 (an fp16 actual, the golden an ulp or so either side of the crossing) is put
    into a correctly rounded block (quiet by the slope), and must not be counted; a loud
    block (one element 2^-8 off) counts them in _block_counts, which must agree."""
    dtype = torch.float16
    c = metrics._constants(dtype, *metrics.default_tolerances(dtype))
    eps, q = c[metrics.C_EPS_MS], c[metrics.C_QUIET]
    assert c[metrics.C_RATIOS_TRIM] == metrics.RATIOS_TEN_THOUSANDTH
    a16 = np.arange(0x1400, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    tie_a, tie_g = [], []
    for side in (1.0, -1.0):  # golden above the actual's magnitude, or below
        g0 = (a16 + side * 1e-4 * eps) / (1.0 - side * 1e-4)
        for k in range(-4, 5):
            g = g0 + k * np.spacing(g0)
            at = np.abs(a16 - g) == 1e-4 * (np.abs(g) + eps)
            tie_a += list(a16[at]) + list(-a16[at])
            tie_g += list(g[at]) + list(-g[at])
    assert len(tie_a) >= 6
    gen = torch.Generator().manual_seed(12)
    g = torch.randn(2048, generator=gen, dtype=torch.float64)
    a_np = metrics.round_once(g, dtype).to(torch.float32).numpy()
    g_np = g.numpy()
    spots = np.arange(len(tie_a)) * 37 + 5
    a_np[spots], g_np[spots] = np.array(tie_a, np.float32), tie_g
    d = np.abs(a_np.astype(np.float64) - g_np)
    big = np.abs(g_np) > c[metrics.C_SMALL]
    within = big & (d < 1e-4 * (np.abs(g_np) + eps))
    assert not within[spots].any() and big[spots].all()
    for loud in (False, True):
        if loud:
            a_np[1] = np.float16(g_np[1] * (1 + 2.0 ** -8))  # on half's grid
        d = np.abs(a_np.astype(np.float64) - g_np)
        assert (d <= q * np.abs(g_np)).all() != loud
        small_ok = (np.abs(g_np) <= c[metrics.C_SMALL]) & (d <= c[metrics.C_THOU_ATOL])
        want = int((small_ok | big & (d < 1e-4 * (np.abs(g_np) + eps))).sum())
        for lean, twin, reference, _ in _variants_for(dtype):
            slots = _block_slots(lean, a_np, g_np, c)
            assert (slots == _block_slots(reference, a_np, g_np, c)).all(), (lean, loud)
            assert (_block_slots(twin, a_np, g_np, c) == slots).all(), (twin, loud)
            assert slots[:metrics.N_SLOTS].view(np.float64)[metrics.N_OK_1E4] == want


# per output dtype: the tolerances (atol, rtol: powers of two, so that allclose's and
# CANN v2's bounds are exact), the error unit and goldens at which an error lands exactly
# on them, loud relative errors, small goldens and their errors under / over the atol
FEW_LOUD = {torch.float32: dict(atol=2.0 ** -16, rtol=2.0 ** -12, unit=2.0 ** -20,
                                exact_g=lambda rng, k: rng.integers(256, 2048, k) * 2.0 ** -8,
                                rel=(-6.0, -1.0), small=(1e-7, 9e-7), off=(1e-10, 5e-9),
                                sparse=metrics.SPARSE_ALL),
            torch.float16: dict(atol=2.0 ** -7, rtol=2.0 ** -6, unit=2.0 ** -8,
                                exact_g=lambda rng, k: 2.0 * rng.integers(0, 4, k) + 1,
                                rel=(np.log10(3 * 2.0 ** -10), -1.0), small=(1e-4, 9e-4),
                                off=(4e-6, 5e-5), sparse=metrics.SPARSE_BUT_1E4)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n_loud", [1, 37, metrics.SPARSE_LOUD_MOST,
                                    metrics.SPARSE_LOUD_MOST + 1])
def test_a_block_with_few_loud_elements_counts_them_alone(dtype, n_loud):
    """A block with at most SPARSE_LOUD_MOST loud elements (d > fl(q |g|)) counts its
    tolerances, ratio family and ULP errors over 32 on those alone, the quiet ones passing
    every test (fp16: all but the ten-thousandth, which its block loop counts over every
    element): the lean variants' every slot and kept error must be the masked pass's,
    and _sparse_loud_counts' counts the loop's over every element (_block_counts). The
    loud elements straddle each bound: relative errors up to 0.1 (msprobe's absolute
    threshold, the ten-thousandth to the hundredth, CANN v2's, ULP errors over 32),
    errors at zero goldens, small values off by under and over their atol (the small part
    of each ratio count), and errors exactly at allclose's and CANN v2's bounds and the
    next float over (exact: the goldens on a grid, errors a multiple of a power of two,
    power-of-two tolerances); one more than the most takes the loop over every element."""
    setup = FEW_LOUD[dtype]
    store = np.float16 if dtype == torch.float16 else np.float32
    atol, rtol = setup["atol"], setup["rtol"]
    c = metrics._constants(dtype, atol, rtol)
    assert c[metrics.C_SPARSE] == setup["sparse"]
    v2_atol, v2_rtol = c[metrics.C_V2_ATOL], c[metrics.C_V2_RTOL]
    rng = np.random.default_rng(n_loud)
    n = metrics.BLOCK - 5  # a vector tail too
    g = rng.standard_normal(n) * 4.0
    g = np.copysign(np.maximum(np.abs(g), 1e-3), g)  # clear of the format's subnormals
    quiet_small = rng.choice(n, 300, replace=False)
    g[quiet_small] = rng.uniform(*setup["small"], 300) * rng.choice([-1.0, 1.0], 300)
    spots = np.sort(rng.choice(n, n_loud, replace=False))
    a = g.astype(store)
    k = len(spots)
    rel = 10.0 ** rng.uniform(*setup["rel"], k) * rng.choice([-1.0, 1.0], k)
    a[spots] = (g[spots] * (1 + rel)).astype(store)
    g[spots[::7]] = 0.0  # errors at a zero golden
    a[spots[::7]] = store(1e-6)
    for part, off in zip((spots[5::7], spots[6::7]), setup["off"]):  # small values off
        g[part] = rng.uniform(*setup["small"], part.size)  # by under / over their atol
        a[part] = (g[part] + off).astype(store)
    exact = spots[3::7]  # errors at allclose's / CANN v2's bound, and the float over
    gk = setup["exact_g"](rng, exact.size)
    unit = setup["unit"]
    bound = np.where(np.arange(exact.size) % 2 == 0, atol + rtol * gk, v2_atol + v2_rtol * gk)
    m = bound / unit + (np.arange(exact.size) // 2 % 2)  # at it, or the float over
    assert (m == np.round(m)).all()
    g[exact], a[exact] = gk, (gk + m * unit).astype(store)
    assert (a[exact].astype(np.float64) - gk == m * unit).all()
    d = np.abs(a.astype(np.float64) - g)
    loud = d > c[metrics.C_QUIET] * np.abs(g)
    assert loud.sum() == n_loud
    ulp_over = (d[loud] / np.spacing(np.abs(g[loud]).astype(store))) > 32
    assert n_loud < 30 or (ulp_over.any() and not ulp_over.all())
    a = a.astype(np.float32)  # fp16: as the pass upcasts it
    for lean, twin, reference, _ in _variants_for(dtype):
        want = _block_slots(reference, a, g, c)
        assert (_block_slots(lean, a, g, c) == want).all(), lean
    abits, aexp, _ = metrics._bits_of(a)
    gbits = g.view(np.int64)
    loop, alone = np.zeros(metrics.N_SLOTS), np.zeros(metrics.N_SLOTS)
    over = metrics._block_counts(a, abits, aexp, g, gbits, 0, n, c, loop, True,
                                 metrics.RATIOS_ALL, True, 0, False)
    small = np.abs(g) <= c[metrics.C_SMALL]
    ok4_big = -1.0
    if setup["sparse"] == metrics.SPARSE_BUT_1E4:
        ok4_big = float((~small & (d < 1e-4 * (np.abs(g) + c[metrics.C_EPS_MS]))).sum())
    assert metrics._sparse_loud_counts(a, g, gbits, 0, n, c, alone, ok4_big,
                                       float(small.sum())) == over
    assert (alone.view(np.int64) == loop.view(np.int64)).all()


@pytest.mark.parametrize("where", ["actual", "golden"])
def test_one_nan_or_inf_anywhere_in_a_block_is_seen(where):
    """The pass's lean variant only notes a NaN / Inf and then takes the block through its
    masked twin: one NaN or Inf at a block's first or last element,
    or in the tail, must still be a placement mismatch, and leave every other element's
    figures as NumPy computes them without it."""
    n = 2 * metrics.BLOCK + 77
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    a = (g * (1 + 1e-4 * torch.randn(n, generator=gen, dtype=torch.float64))).to(torch.float32)
    for pos in (0, metrics.BLOCK - 1, metrics.BLOCK, 2 * metrics.BLOCK + 5, n - 1):
        for bad in (float("nan"), float("inf"), -float("inf")):
            aa, gg = a.clone(), g.clone()
            (aa if where == "actual" else gg)[pos] = bad
            m = metrics.measure(aa, gg)
            keep = np.ones(n, dtype=bool)
            keep[pos] = False
            d = np.abs(aa.numpy()[keep].astype(np.float64) - gg.numpy()[keep])
            assert m.nan_inf_mismatch == 1 and m.n == n - 1, (pos, bad)
            assert m.max_abs == d.max(), (pos, bad)
            assert m.rmse == pytest.approx(math.sqrt((d ** 2).mean()), rel=1e-12), (pos, bad)


@pytest.mark.parametrize("share", [0.0, 0.003, 0.5, 1.0])
@pytest.mark.parametrize("width", [np.float32, np.float64])
def test_the_special_spots_are_numpy_s(share, width):
    """_special_spots finds every pair that holds NaN or Inf, in order, and tells the same
    NaN / the same signed Inf from a mismatch, as NumPy's isnan / isinf / sign say: none,
    a few, half of the pairs (whole runs of 64 full of them) and all of them; at a run's
    first and 64th element and in a block's tail of 7."""
    rng = np.random.default_rng(int(share * 1000) + (width == np.float64))
    n = 64 * 9 + 7
    specials = np.array([np.nan, np.inf, -np.inf])
    a = rng.standard_normal(n).astype(width)
    g = rng.standard_normal(n)
    for arr in (a, g):
        pick = rng.random(n) < share
        pick[[63, 64, n - 1]] = share > 0
        arr[pick] = rng.choice(specials, pick.sum())
    spots = np.full(n, -1, np.int64)
    bits, xexp, xman = metrics._bits_of(a)
    k = metrics._special_spots(a, bits, xexp, xman, g, g.view(np.int64), spots)
    a64 = a.astype(np.float64)
    where = np.nonzero(~np.isfinite(a64) | ~np.isfinite(g))[0]
    same = (np.isnan(a64) & np.isnan(g)) | (np.isinf(a64) & np.isinf(g)
                                             & (np.sign(a64) == np.sign(g)))
    assert k == len(where)
    assert (spots[:k] == 2 * where + np.where(same[where], 0, 1)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_error_balance_counts_nan_and_inf_as_numpy_compares_them(dtype):
    """msprobe's EB compares the output with the golden cast to its NumPy dtype as NumPy
    does: an Inf is larger or smaller by its sign, a NaN neither, and a finite golden that
    overflows the cast is an Inf. Planted in several blocks of the pass (one whose finite
    pairs are inside the cast's range, where the pass takes its own counts and the NaN /
    Inf pairs' apart); the floor's EB (the correctly rounded golden) likewise."""
    gen = torch.Generator().manual_seed(7)
    n = 2 * metrics.BLOCK + 999
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    g[5], g[70000], g[9] = float("inf"), float("-inf"), float("nan")
    g[11] = 1e39 if dtype != torch.float16 else 1e5  # overflows the cast
    a = (g * (1 + 1e-2 * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
    a[1], a[66000], a[130000], a[3] = float("inf"), float("-inf"), float("nan"), 2.0
    a[5], a[9] = float("-inf"), float("inf")
    # in a block whose finite pairs are in range: goldens beyond it at NaN / Inf pairs
    g[131000], g[131001] = 1e39 if dtype != torch.float16 else 1e5, -3e39
    a[131000], a[131001] = float("inf"), float("nan")
    g[131002], a[131002] = float("inf"), 1.0
    device = np.float16 if dtype == torch.float16 else np.float32
    with np.errstate(over="ignore"):
        cast = g.numpy().astype(device).astype(np.float64)
    a64 = a.to(torch.float64).numpy()
    with np.errstate(invalid="ignore"):
        want = abs(int((a64 > cast).sum()) - int((a64 < cast).sum())) / n
    m, f = metrics.measure_pair(a, g)
    assert m.eb == want
    r = metrics.round_once(g, dtype).to(torch.float64).numpy()
    with np.errstate(invalid="ignore"):
        assert f.eb == abs(int((r > cast).sum()) - int((r < cast).sum())) / n


@pytest.mark.parametrize("ties", [True, False])
def test_fp16_error_balance_in_the_pass_is_numpy_s_at_every_rounding_tie(ties):
    """For fp16 outputs the pass counts msprobe's EB against the golden cast to half on
    its own (an output on half's grid is above half(g) where it is above g by more than
    half an ULP): goldens at every half value, every midpoint between two (the ties,
    ``ties``: their blocks are counted exactly) and one float64 ulp either side of it,
    subnormal halves, and goldens past half's largest value in a block of their own
    (counted exactly), give NumPy's float16 cast's counts; so does a float32 output
    measured as fp16 (not on half's grid: counted exactly)."""
    halves = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    v = halves.view(torch.float16).to(torch.float64).numpy()
    v = np.unique(v[np.isfinite(v)])
    mids = (v[:-1] + v[1:]) / 2
    g = np.concatenate([v, mids if ties else v, np.nextafter(mids, np.inf),
                        np.nextafter(mids, -np.inf)])
    gen = torch.Generator().manual_seed(2)
    g = g[torch.randperm(len(g), generator=gen).numpy()]
    n = (len(g) // metrics.BLOCK) * metrics.BLOCK
    g = np.concatenate([g[:n], [65504.0, 65519.0, 65520.0, 1e5, -7e4] * 20])  # a tail block
    gt = torch.from_numpy(g)
    with np.errstate(over="ignore"):
        cast = g.astype(np.float16).astype(np.float64)
    outs = [(gt * (1 + noise * torch.randn(len(g), generator=gen, dtype=torch.float64))
             ).to(torch.float16) for noise in (0.0, 1e-3)] + [gt.to(torch.float32)]
    for k, out in enumerate(outs):
        a64 = out.to(torch.float64).numpy()
        want = abs(int((a64 > cast).sum()) - int((a64 < cast).sum())) / len(g)
        assert want > 0 or k == 0  # the golden rounded to half: balanced
        for floor in (False, True):  # without its floor and with it (the cast)
            m = metrics.measure_pair(out, gt, dtype=torch.float16, floor=floor)[0]
            assert m.eb == want, (k, floor, out.dtype)


def test_ulp_of_one_fp16_step():
    g = torch.tensor([1.0, 1024.0], dtype=torch.float64)
    a = torch.tensor([1.0 + 2 ** -10, 1025.0], dtype=torch.float16)
    m = metrics.measure(a, g)
    assert m.ulp_max == 1.0 and m.ulp_mean == 1.0


def _judge(name, actual, golden, **spec):
    v = verify.compare(actual, golden, standard={"name": name, **spec})
    return v.passed


def test_cann_v1_thresholds_fp32():
    g = torch.ones(1000, dtype=torch.float64)
    t = 2 ** -13
    assert _judge("cann_v1", (g * (1 + 0.5 * t)).float(), g)
    assert not _judge("cann_v1", (g * (1 + 1.5 * t)).float(), g)   # MERE over T
    spike = g.clone()
    spike[0] = 1 + 11 * t                                         # MARE over 10 T
    assert not _judge("cann_v1", spike.float(), g)


def test_cann_v2_ratio_and_limit():
    g = torch.linspace(1, 2, 1000, dtype=torch.float64)
    a = g.clone()
    a[:5] += 0.005  # 0.5 % of elements out of tolerance, max abs 5e-3 < 1e-2
    assert _judge("cann_v2", a.float(), g)
    a[:20] += 0.005  # 2 % out
    assert not _judge("cann_v2", a.float(), g)


def test_allclose_uses_case_tolerances_or_torch_defaults():
    g = torch.ones(10, dtype=torch.float64)
    a = (g + 1e-4).float()
    assert not _judge("allclose", a, g)               # torch fp32 defaults are tighter
    assert _judge("allclose", a, g, atol=1e-4, rtol=0.0078125)


def test_thousandth_ulp_abs_threshold_cosine():
    g = torch.linspace(1, 2, 10000, dtype=torch.float64)
    rounded = g.half()
    for name in ("thousandth", "ulp", "abs_threshold", "cosine", "cann_v1", "cann_v2"):
        assert _judge(name, rounded, g), name  # the correctly rounded result passes all
    bad = rounded.clone()
    bad[:50] = bad[:50] * 1.01
    for name in ("thousandth", "ulp", "abs_threshold", "cann_v1"):
        assert not _judge(name, bad, g), name
    assert not _judge("cosine", -rounded, g)


def test_integer_outputs_compare_exactly():
    g = torch.tensor([1, 2, 3])
    assert verify.compare(torch.tensor([1, 2, 3], dtype=torch.int32), g).passed
    v = verify.compare(torch.tensor([1, 2, 4], dtype=torch.int32), g)
    assert not v.passed and v.standard == "exact"


def test_error_floor_and_unmeetable_standard_warning():
    """Known weakness of CANN v1: fp16 goldens in the subnormal range fail MARE even when
    correctly rounded. The floor shows it and the verdict warns."""
    g = torch.tensor([1e-6, 3.3e-6, 1.0, 2.0], dtype=torch.float64)
    best = g.half()
    v = verify.compare(best, g, standard="cann_v1")
    assert not v.passed
    assert "cannot be met even by the correctly rounded golden" in v.warning
    assert v.floor.mare == v.metrics.mare
    ok = verify.compare(torch.tensor([1.0, 2.0], dtype=torch.float16),
                        torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert ok.passed and ok.warning == "" and ok.floor.max_abs == 0


def test_floor_is_golden_rounded_to_output_dtype():
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(5000, generator=gen, dtype=torch.float64)
    v = verify.compare(g.bfloat16(), g)
    assert v.metrics.max_abs == v.floor.max_abs
    assert v.floor.ulp_max <= 0.5 + 1e-12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_width_output_upcast_in_the_pass_measures_as_its_float32_copy(dtype):
    """The pass upcasts a bf16 / fp16 output's blocks itself: every figure, the floor's,
    the histograms and the heat map are those of the same values upcast by torch first,
    NaN / Inf included."""
    gen = torch.Generator().manual_seed(2)
    g = torch.randn(2 * metrics.BLOCK + 8 * 9, generator=gen, dtype=torch.float64) * 300
    g[::997] = float("nan")
    g[5::1999] = float("inf")
    a = (g + 1e-3 * torch.randn(g.shape, generator=gen, dtype=torch.float64)).to(dtype)
    a[11::1501] = float("-inf")
    a, g = a.reshape(-1, 8), g.reshape(-1, 8)
    mine = metrics.measure_all(a, g, floor=True, hist=True, heat="rel")
    upcast = metrics.measure_all(a.float(), g, dtype, floor=True, hist=True, heat="rel")
    assert repr(mine) == repr(upcast)  # to the last bit (repr round-trips a float), NaN too
    assert mine.metrics.nan_inf_mismatch > 0 and mine.metrics.argmax_rel >= 0
    assert sum(mine.histogram["floor"]["counts"]) > 0


@pytest.mark.parametrize("dtype", [torch.int32, torch.float8_e4m3fn, torch.uint8])
def test_an_output_of_another_width_measures_as_its_float32_copy(dtype):
    """fp8 and integer outputs judged as floats (dtype=fp32) are measured on their
    float32 values, not on their bits read as bf16 / fp16."""
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(4099, generator=gen, dtype=torch.float64).abs() * 3
    a = g.to(dtype)
    mine = metrics.measure_all(a, g, torch.float32, floor=True, hist=True)
    upcast = metrics.measure_all(a.float(), g, torch.float32, floor=True, hist=True)
    assert repr(mine) == repr(upcast)
    assert mine.metrics.n == 4099 and mine.metrics.max_abs < 1.0


def test_the_float32_floor_by_conversion_rounds_as_the_software_rounding():
    """The pass rounds an fp32 output's golden by the hardware conversion: the same bits
    as its own IEEE rounding everywhere (ties, subnormals, overflow, NaN / Inf)."""
    rng = np.random.default_rng(0)
    v = np.concatenate([
        rng.normal(size=20000) * 10.0 ** rng.uniform(-50, 45, 20000),
        (rng.integers(1, 1 << 24, 5000) + 0.5) * 2.0 ** rng.integers(-160, 110, 5000),
        [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4028235677973366e38, 1e-45, 7e-46]])
    from verify.comparator import metrics as M
    soft, hard = np.empty_like(v), np.empty_like(v)
    M._round_range(v, v.view(np.int64), 0, v.size, M._rounding_of(torch.float32), soft)
    M._rounded_range(v, 0, v.size, M.ROUND_F32, hard)
    assert (soft.view(np.int64) == hard.view(np.int64)).all()
