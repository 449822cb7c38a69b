"""`exact` means equal (bitwise for floats, integer equality for integers), and the error
floor is the float64 golden rounded once into the output dtype, checked against exact
rational arithmetic (fractions) on random and edge values."""
import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import torch

import verify
from verify.comparator.metrics import round_once

FORMATS = {torch.float16: (11, -14, 65504.0), torch.bfloat16: (8, -126, 3.3895313892515355e38),
           torch.float32: (24, -126, 3.4028234663852886e38)}


def rational_round(x: float, dtype) -> float:
    """Round-to-nearest-even of the exact value of x into (bits, emin, max), by hand."""
    bits, emin, vmax = FORMATS[dtype]
    if math.isnan(x) or math.isinf(x):
        return x
    if x == 0:
        return x
    a = abs(Fraction(x))
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    quantum = Fraction(2) ** (max(e, emin) - bits + 1)
    q = a / quantum
    n = q.numerator // q.denominator
    rest = q - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    r = n * quantum
    if r > Fraction(vmax):
        return math.copysign(math.inf, x)
    return math.copysign(float(r), x)


def _edge_values(dtype) -> list[float]:
    bits, emin, vmax = FORMATS[dtype]
    ulp1 = 2.0 ** (1 - bits)
    tiny = 2.0 ** emin
    sub = 2.0 ** (emin - bits + 1)
    vals = [1 + ulp1 / 2, 1 + 3 * ulp1 / 2, 1 + ulp1 / 2 + 2 ** -40, 1 - ulp1 / 4,
            tiny, tiny * (1 - 2 ** -30), sub / 2, sub * 1.5, sub / 2 + 2 ** -200, sub * 0.49,
            vmax, vmax * (1 + ulp1 / 4), vmax * (1 + ulp1 / 2), vmax * 2, 5e-324, 1e308]
    return vals + [-v for v in vals]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_the_floor_rounds_once_like_exact_arithmetic(dtype):
    rng = np.random.default_rng(12)
    bits, emin, _ = FORMATS[dtype]
    # random significands across every binade of the format, subnormals and overflow
    # included, and values that are ties or just off ties at the format's precision
    exps = rng.integers(emin - bits - 2, 17 if dtype == torch.float16 else 128, 20000)
    randoms = rng.uniform(1, 2, 20000) * np.exp2(exps) * np.where(rng.random(20000) < .5, -1, 1)
    ties = (rng.integers(1 << bits, 1 << (bits + 1), 5000) + 0.5) * np.exp2(
        rng.integers(-10, 10, 5000) - bits)
    values = np.concatenate([randoms, ties, _edge_values(dtype)])
    got = round_once(torch.from_numpy(values), dtype).double().tolist()
    want = [rational_round(float(v), dtype) for v in values]
    wrong = [(v, g, w) for v, g, w in zip(values, got, want)
             if not (g == w and math.copysign(1, g) == math.copysign(1, w))]
    assert not wrong, wrong[:5]
    # torch's own conversion goes through float32 and rounds twice: the reason this exists
    via_torch = torch.from_numpy(values).to(dtype).double().tolist()
    if dtype == torch.float16:
        assert sum(a != b for a, b in zip(via_torch, want)) > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32],
                         ids=["fp16", "bf16", "fp32"])
def test_the_metrics_pass_rounds_the_floor_on_the_fly_like_exact_arithmetic(dtype):
    """The error floor is rounded inside the compiled metrics pass (no tensor of rounded
    values): every value, tie, subnormal and overflow as the rational reference rounds it,
    signed zeros included."""
    from verify.comparator import metrics
    rng = np.random.default_rng(7)
    bits, emin, vmax = FORMATS[dtype]
    top = int(math.log2(vmax)) + 2
    exps = rng.integers(emin - bits - 2, top, 20000)
    randoms = rng.uniform(1, 2, 20000) * np.exp2(exps) * np.where(rng.random(20000) < .5, -1, 1)
    ties = (rng.integers(1 << bits, 1 << (bits + 1), 5000) + 0.5) * np.exp2(
        rng.integers(-10, 10, 5000) - bits)
    # exact ties at the format's precision, and values just off them (float32 rounds a
    # value just under a tie up to it: the rounding to odd must take that back)
    halfway = (rng.integers(1 << (bits - 1), 1 << bits, 5000) + 0.5) * np.exp2(
        rng.integers(-10, 10, 5000) + 1 - bits)
    near_ties = np.concatenate([halfway, halfway * (1 - 2.0 ** -40),
                                halfway * (1 + 2.0 ** -40)])
    values = np.concatenate([randoms, ties, near_ties, _edge_values(dtype),
                             [0.0, -0.0, np.nan, np.inf, -np.inf]])
    want = [rational_round(float(v), dtype) for v in values]
    # the general rounding, and the one the block pass does as it goes (_rounded: float32
    # rounded to odd, then to the format)
    general, on_the_fly = np.empty_like(values), np.empty_like(values)
    metrics._round_range(values, values.view(np.int64), 0, len(values),
                         metrics._rounding_of(dtype), general)
    metrics._rounded_range(values, 0, len(values), metrics._FLOOR_KINDS[dtype], on_the_fly)
    for got in (general, on_the_fly):
        wrong = [(v, g, w) for v, g, w in zip(values, got.tolist(), want)
                 if not ((g == w and math.copysign(1, g) == math.copysign(1, w))
                         or (math.isnan(g) and math.isnan(w)))]
        assert not wrong, wrong[:5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("standard", ["cann_v1", "allclose"])
def test_a_correctly_rounded_block_is_its_own_floor(dtype, standard):
    """A block of an output that is the golden rounded, bit for bit, takes the floor's
    figures, histogram and error balance from its own (the pass measures nothing twice):
    they are the floor of the same golden under an output that is rounded nowhere, to
    the last bit. Blocks rounded exactly, off by an ulp once, holding +0 where the
    rounded golden is -0, holding NaN / Inf (a NaN of another sign too) and a finite
    golden that overflows, and a vector tail; then the reason it holds: every kernel
    block variant over the rounded golden gives the slots and cells of the floor's own
    variant (fp32: rounding as it goes; bf16 / fp16: over the rounded golden)."""
    from verify.comparator import metrics
    from verify.comparator.comparison import compare
    block = metrics.BLOCK
    gen = torch.Generator().manual_seed(21)
    g = torch.randn(5 * block + 333, generator=gen, dtype=torch.float64) * 3.0
    g[block + 5] = -1e-60  # rounds to -0.0
    # NaN / Inf in two blocks (through the masked twin), and a finite golden the rounding
    # overflows to Inf
    g[3 * block + 11::997] = float("nan")
    g[4 * block + 2::1999] = float("inf")
    g[4 * block + 3::1999] = -float("inf")
    g[4 * block + 9] = 1e6 if dtype == torch.float16 else 1e39
    exact = round_once(g, dtype)  # torch's own bf16 cast rounds twice, by float32
    other_nan = exact.clone()  # a NaN of another sign is NaN all the same
    other_nan[3 * block + 11] = -exact[3 * block + 11]
    nan_of_its_own = exact.clone()  # NaN where the rounded golden is finite: not it
    nan_of_its_own[3 * block + 12] = float("nan")
    mixed = exact.clone()
    mixed[2 * block + 7] = torch.nextafter(mixed[2 * block + 7].float(),
                                           torch.tensor(9.0)).to(dtype)
    mixed[block + 5] = 0.0  # +0 where the rounded golden is -0: not the rounded golden
    noise = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
    noisy = (g * (1 + noise * torch.randn(g.shape, generator=gen, dtype=torch.float64))
             ).to(dtype)
    want = compare(noisy.reshape(-1, 7), g.reshape(-1, 7), standard=standard)
    assert want.floor.nan_inf_mismatch == 1  # the golden that overflows
    for actual in (exact, other_nan, nan_of_its_own, mixed):
        got = compare(actual.reshape(-1, 7), g.reshape(-1, 7), standard=standard)
        assert repr(got.floor) == repr(want.floor)
        assert got.histogram["floor"] == want.histogram["floor"]
    own = compare(exact, g, standard=standard)  # the output is its floor
    assert repr(replace(own.metrics, argmax_abs=-1, argmax_rel=-1)) == repr(own.floor)

    g_np = g.numpy()[:block - 5]
    kind = metrics._FLOOR_KINDS[dtype]
    r = np.empty_like(g_np)
    metrics._rounded_range(g_np, 0, len(g_np), kind, r)
    x = torch.from_numpy(r).to(torch.float32).numpy()  # the output as the pass reads it
    gb = g_np.view(np.int64)
    half = "half_" if dtype == torch.float16 else ""
    for tols in (metrics.default_tolerances(dtype), (0.0, 0.0)):  # quiet, and loud
        c = metrics._constants(dtype, *tols)
        for keep in ("tols", "rels", "cells", "metrics"):
            kernel = getattr(metrics, f"_{half}block_{keep}")
            if dtype == torch.float32:  # the floor's variant rounds the golden itself
                kept_by_floor = "metrics" if keep == "metrics" else "cells"
                floor = getattr(metrics, f"_floor_f32_{kept_by_floor}")
                floor_args = (g_np, gb, metrics._F64_EXP, metrics._F64_MAN)
            else:
                floor = metrics._block_metrics if keep == "metrics" else metrics._block_cells
                floor_args = (r, r.view(np.int64), metrics._F64_EXP, metrics._F64_MAN)
            slots, cells = [], []
            for variant, args in ((kernel, (x,) + metrics._bits_of(x)), (floor, floor_args)):
                out = np.zeros(metrics.N_SLOTS)
                kept = np.zeros(len(g_np), np.uint32)
                scratch = np.zeros(len(g_np), np.uint32)  # the heat map's keys
                assert not variant(*args, g_np, gb, 0, len(g_np), c, out, scratch,
                                   scratch.copy(), kept)
                out[[metrics.EB_GT, metrics.EB_LT]] = 0  # counted against other casts
                slots.append(out.view(np.int64))
                cells.append(kept)
            assert (slots[0] == slots[1]).all() and (cells[0] == cells[1]).all(), keep



def test_an_fp32_block_is_its_own_floor_by_its_counts_as_by_its_bits():
    """A clean fp32 block is taken for the rounded golden from its error balance counts
    and its zeros' signs (_own_floor); that is the bitwise test's answer
    (_is_rounded_golden) on blocks that are the rounded golden, one ulp above or below it
    once, a tie rounded to odd (an ULP error of 0.5, as the even neighbour's), a zero of
    the other sign (+0 for -1e-60, -0 for a +0 golden and for +1e-60), a vector tail;
    and on bf16 / fp16 blocks read as float32 (an fp32 output judged as bf16 / fp16,
    whose values need not be the format's: one float32 ulp up or down), which take the
    bitwise test."""
    from verify.comparator import metrics
    n = 1000
    g = torch.randn(n, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    g[[3, 40, 41]] = torch.tensor([-1e-60, 0.0, 1e-60], dtype=torch.float64)
    answers = []
    ties = {torch.float32: 2 ** -24, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        exact = round_once(g, dtype).to(torch.float32)
        up, down, plus0, minus0, minus_tiny, odd = (exact.clone() for _ in range(6))
        up[7] = torch.nextafter(up[7], torch.tensor(9.0))
        down[n - 1] = torch.nextafter(down[n - 1], torch.tensor(-9.0))
        plus0[3], minus0[40], minus_tiny[41] = 0.0, -0.0, -0.0
        g_tie = g.clone()
        g_tie[9] = 1.0 + ties[dtype]  # halfway between 1 and the next: to even is 1
        odd[9] = 1.0 + 2 * ties[dtype]
        c = metrics._constants(dtype, *metrics.default_tolerances(dtype))
        eb_half = dtype == torch.float16
        block = metrics._half_block_metrics if eb_half else metrics._block_metrics
        for x_t, g_t in ((exact, g), (up, g), (down, g), (odd, g_tie), (plus0, g),
                         (minus0, g), (minus_tiny, g), (exact[:n - 3], g)):
            x, gn = x_t.numpy(), g_t.numpy()[:len(x_t)]
            xbits, xexp, xman = metrics._bits_of(x)
            ob = np.zeros(metrics.N_SLOTS)
            assert not block(x, xbits, xexp, xman, gn, gn.view(np.int64), 0, len(x), c, ob,
                             np.zeros(0), np.zeros(0), np.zeros(0, np.uint32))
            kind = metrics._FLOOR_KINDS[dtype]
            by_bits = ob[metrics.MAX_ULP] <= 0.5 and metrics._is_rounded_golden(x, gn, kind,
                                                                               False)
            for on_grid in (False, True) if dtype == torch.float32 else (False,):
                assert metrics._own_floor(ob, x, xbits, gn, gn.view(np.int64), kind, True,
                                          eb_half, on_grid) == by_bits
            answers.append(by_bits)
    assert answers[:8] == [True, False, False, False, False, False, False, True]  # fp32
    assert answers.count(True) == 6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_block_under_half_an_ulp_is_the_rounded_golden(dtype):
    """A clean bf16 / fp16 block whose every ULP error is under 0.5 is taken for the
    rounded golden (_own_floor) without the bitwise test: that holds where the spacing
    changes (goldens just under and over powers of two, rounding up into the next
    binade), in the subnormal range, next to the largest finite value and past it (the
    rounding overflows), at signed zeros, at a tie; each block the rounded golden, and the
    same with one value moved one step up or down (which the bitwise test refuses: the
    tie's odd neighbour too, an ULP error of 0.5 as the even one's)."""
    from verify.comparator import metrics
    gen = torch.Generator().manual_seed(11)
    bits, emin, vmax = FORMATS[dtype]
    n = 4096
    powers = 2.0 ** torch.randint(emin - bits, 15, (n,), generator=gen).double()
    shade = 1 + (torch.rand(n, generator=gen, dtype=torch.float64) - 0.5) * 2.0 ** (2 - bits)
    g = powers * shade * torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    g[:64] = vmax * (1 + (torch.rand(64, generator=gen, dtype=torch.float64) - 0.7)
                     * 2.0 ** (1 - bits))  # at the top: some round to max, some overflow
    g[64:128] = 2.0 ** (emin - bits) * torch.rand(64, generator=gen, dtype=torch.float64) * 4
    g[128:132] = torch.tensor([0.0, -0.0, -1e-300, 1e-300], dtype=torch.float64)
    g[132] = 1.0 + 2.0 ** -bits  # a tie, to even (1.0); one step up is as near: not it
    finite = torch.isfinite(round_once(g, dtype))
    g = g[finite]  # a clean block: the overflowing goldens go to a block of their own
    exact = round_once(g, dtype).to(torch.float32)
    c = metrics._constants(dtype, *metrics.default_tolerances(dtype))
    kind, eb_half = metrics._FLOOR_KINDS[dtype], dtype == torch.float16
    block = metrics._half_block_metrics if eb_half else metrics._block_metrics
    gn = g.numpy()

    def answers(x_t):
        x = x_t.numpy()
        xbits, xexp, xman = metrics._bits_of(x)
        ob = np.zeros(metrics.N_SLOTS)
        assert not block(x, xbits, xexp, xman, gn, gn.view(np.int64), 0, len(x), c, ob,
                         np.zeros(0), np.zeros(0), np.zeros(0, np.uint32))
        by_bits = bool(ob[metrics.MAX_ULP] <= 0.5
                       and metrics._is_rounded_golden(x, gn, kind, False))
        return metrics._own_floor(ob, x, xbits, gn, gn.view(np.int64), kind, True,
                                  eb_half, True), by_bits

    assert answers(exact) == (True, True)
    moved = 0
    tie = int((g == 1.0 + 2.0 ** -bits).nonzero()[0])
    for i in torch.randint(0, len(g), (24,), generator=gen).tolist() + [0, 1, 64, 65, tie]:
        for way in (1, -1):
            x = exact.clone()
            bits = x[i:i + 1].to(dtype).view(torch.int16)
            if (bits & 0x7FFF).item() == 0 and way < 0:
                continue  # no step down from a zero's magnitude
            x[i] = (bits + way).view(dtype).float()[0]  # the magnitude one step up / down
            if not torch.isfinite(x[i]):
                continue
            moved += 1
            assert answers(x) == (False, False), (i, way, g[i].item())
    assert moved >= 40
    signed = exact.clone()
    signed[(exact == 0).nonzero()[0]] *= -1  # a zero of the other sign
    assert answers(signed) == (False, False)


def test_exact_on_floats_is_exact():
    g = torch.tensor([1.0], dtype=torch.float64)
    for actual in (torch.tensor([1 + 2 ** -10], dtype=torch.float16),
                   torch.tensor([1 + 2 ** -23], dtype=torch.float32),
                   torch.tensor([1 + 2 ** -7], dtype=torch.bfloat16)):
        v = verify.compare(actual, g, standard="exact")
        assert v.verdict == "FAIL" and "1/1 elements differ" in v.reason
    same = verify.compare(torch.tensor([float("nan"), -0.0, 2.5], dtype=torch.float16),
                          torch.tensor([float("nan"), 0.0, 2.5], dtype=torch.float64),
                          standard="exact")
    assert same.verdict == "PASS"
    nan_vs_number = verify.compare(torch.tensor([float("nan")]), torch.tensor([1.0]),
                                   standard="exact")
    assert nan_vs_number.verdict == "FAIL"


def test_exact_on_integers_never_goes_through_a_float():
    assert verify.compare(torch.tensor([2 ** 53 + 1]), torch.tensor([2 ** 53])).verdict == "FAIL"
    assert verify.compare(torch.tensor([2 ** 62 + 1]), torch.tensor([2 ** 62 + 1])).verdict \
        == "PASS"
    assert verify.compare(torch.tensor([True, False]), torch.tensor([True, True])).verdict \
        == "FAIL"


def _recurrence(q, k, v, g, beta, scale):
    """An independent float64 NumPy gated delta rule for one sequence [T, K] / [T, V]."""
    state = np.zeros((k.shape[-1], v.shape[-1]))
    out = []
    for t in range(q.shape[0]):
        state = state * np.exp(g[t])
        u = beta[t] * (v[t] - k[t] @ state)
        state = state + np.outer(k[t], u)
        out.append(scale * q[t] @ state)
    return np.array(out).reshape(-1, v.shape[-1]), state


def test_an_empty_sequence_keeps_its_own_final_state():
    rng = np.random.default_rng(3)
    t, kd, vd = 9, 4, 3
    q, k = rng.normal(0, .3, (t, kd)), rng.normal(0, .3, (t, kd))
    v, g, beta = rng.normal(size=(t, vd)), -rng.uniform(0, .2, t), rng.uniform(0, 1, t)
    offsets = [0, 0, 4, 4, 9]
    as_t = lambda a: torch.from_numpy(a)[None, :, None]  # noqa: E731  [1, T, H=1, ...]
    o, final = verify.op("chunk_gated_delta_rule").golden(
        q=as_t(q), k=as_t(k), v=as_t(v), g=as_t(g), beta=as_t(beta), initial_state=None,
        cu_seqlens=torch.tensor(offsets))
    assert tuple(final.shape) == (4, 1, kd, vd)
    for i, (a, b) in enumerate(zip(offsets, offsets[1:])):
        want_o, want_s = _recurrence(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], kd ** -0.5)
        np.testing.assert_allclose(final[i, 0].numpy(), want_s, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(o[0, a:b, 0].numpy(), want_o, rtol=1e-12, atol=1e-14)


def _data_kinds(dtype, rng, n=4096):
    info = torch.finfo(dtype)
    signs = np.where(rng.random(n) < .5, -1.0, 1.0)
    return {
        "random": rng.normal(0, 1, n),
        "small": rng.normal(0, 1, n) * 2 ** -14,
        "subnormal": rng.uniform(-1, 1, n) * info.tiny,
        "huge": rng.uniform(0.25, 0.5, n) * info.max * signs,
        "mixed": np.concatenate([rng.normal(0, 1, n // 4), rng.normal(0, 1, n // 4) * 2 ** -14,
                                 rng.uniform(-1, 1, n // 4) * info.tiny,
                                 rng.normal(0, 1e3, n // 4)]),
    }


def test_the_correctly_rounded_golden_passes_every_standard_or_says_why():
    from verify.comparator import standards
    rng = np.random.default_rng(1)
    tried, silent = 0, []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for kind, values in _data_kinds(dtype, rng).items():
            g = torch.from_numpy(values)
            a = round_once(g, dtype)
            for name in sorted(set(standards.STANDARDS) - {"exact"}):
                tried += 1
                v = verify.compare(a, g, dtype=dtype, standard=name)
                if v.verdict != "PASS" and "cannot be met even by the correctly rounded" \
                        not in v.warning:
                    silent.append((str(dtype), kind, name, v.reason))
    assert tried >= 135 and not silent, silent


def test_correctly_rounded_bf16_small_values_pass_the_thousandth_family():
    g = torch.tensor([2 ** -12 * 1.3, 2 ** -11 * 1.77, -2 ** -13 * 1.1, 2 ** -10] * 32,
                     dtype=torch.float64)
    a = round_once(g, torch.bfloat16)
    for name in ("hundredth", "thousandth", "ten_thousandth"):
        v = verify.compare(a, g, standard=name)
        assert v.verdict == "PASS" and not v.warning, (name, v.reason, v.warning)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reading_a_block_touched_first_or_not_gives_the_same_figures(dtype, monkeypatch):
    """The pass may read each block's output and golden one word a line before its block
    loop does (on a machine whose prefetchers lag that loop), and a large pass times both
    ways on its first blocks and keeps the faster: every figure, both histograms and the
    heat map are the same to the bit either way, and when the pass picks (NaN / Inf in
    some blocks, a finite golden the rounding overflows, a tail block); the pass that
    timed leaves its pick, and one with a way fixed does not change it."""
    import numba
    from verify.comparator import metrics
    monkeypatch.setattr(metrics, "TOUCH_STATE", np.array([-1, 0], dtype=np.int64))
    block = metrics.BLOCK
    n = (metrics.TOUCH_MIN_BLOCKS + 2) * numba.get_num_threads() * block + 4096
    gen = torch.Generator().manual_seed(28)
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    g[5 * block + 11::99991] = float("nan")
    g[9 * block + 2::199999] = float("inf")
    g[12 * block + 9] = 1e6 if dtype == torch.float16 else 1e39
    noise = {torch.float32: 1e-7, torch.bfloat16: 1e-3, torch.float16: 1e-4}[dtype]
    a = (g * (1 + noise * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
    a[17 * block + 3] = float("nan")
    for heat in ("rel", "tol"):
        got = {}
        for way in ((0, 1), (1, 1), (-1, 0)):
            metrics.TOUCH_STATE[:] = way
            got[way] = metrics.measure_all(a.reshape(-1, 4096), g.reshape(-1, 4096),
                                           heat=heat)
            assert metrics.TOUCH_STATE[0] in ((way[0],) if way[1] else (0, 1))
        assert repr(got[(0, 1)]) == repr(got[(1, 1)]), heat  # repr: floats to the bit
        assert repr(got[(0, 1)]) == repr(got[(-1, 0)]), heat
        assert got[(0, 1)].metrics.nan_inf_mismatch > 0 and got[(0, 1)].heatmap
