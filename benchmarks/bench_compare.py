"""Comparator throughput: all metrics in one pass vs torch.testing.assert_close, and vs
the memory floor (one read-only pass over the same actual and golden: their sums), timed
again before every other timing and taken at its best (the host's memory bandwidth varies).

All run in this process on the same [7168, 4096] fp32 output and float64 golden; the
figure that matters is the ratio, measured side by side (this machine's timings are noisy).
The output is the golden rounded to fp32 (a correctly rounded kernel, whose blocks are
their own error floor: the pass measures them once), and then one with computed error
(1e-7 relative, as a kernel that rounds intermediates has: the floor measured apart).
Then the same ratios for bf16 and fp16 outputs, an output with errors beyond the
tolerances' slopes (loud), one with a few such errors a block (few loud), rows 64 wide
(the heat map's windows 2 columns), rows 8 wide (column maxima over runs of whole rows),
a [4M, 1] and a [1, 4M] shape and NaN / Inf present,
and what a known floor (kept with the golden, verify/golden/floors.py) costs over a
compare without floors; what computing that floor once per golden costs (output_floor: the
golden rounded a block at a time in the pass). Last, what reading each block one word a
line before the block loop does (the pass's touch: metrics.TOUCH_STATE) buys on
this machine: each way fixed, and the pass timing both and picking.

torch's OpenMP threads wait for their next op asleep here (OMP_WAIT_POLICY=PASSIVE, unless
the caller sets the policy): the floor is torch's sum, timed right before every other
call, and libgomp's default has its threads spin for some ms after it on the cores the
timed call then runs on. That timed the contention rather than the call: metrics fp32
[7168, 4096] took 15.7 ms right after the sum against 10.2 ms alone (9.8 with the
threads asleep; best of 12). The pass's threads take blocks as they come, so a thread
that shares its core holds no call up alone (15.7 -> 12.2 ms). To time it with libgomp's
default: OMP_WAIT_POLICY= (empty; libgomp warns that it is invalid and keeps its default).
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch loads libgomp

import statistics  # noqa: E402
import time  # noqa: E402
from typing import Callable, NamedTuple  # noqa: E402

import torch  # noqa: E402

from verify.comparator import metrics  # noqa: E402
from verify.comparator.comparison import compare, output_floor  # noqa: E402
from verify.comparator.metrics import measure_all, round_once  # noqa: E402

SHAPE = (7168, 4096)
REPEATS = 7


def round_robin(fns, repeats=REPEATS, floor=None):
    """(best, median) seconds of each function, timed in turn within every round, so that
    a slow spell of this shared machine falls on all of them alike. With ``floor`` (a
    MemoryFloor of the same data), the floor is timed again right before every other
    function and comes first, its (best, median) over all those samples: the host's memory
    bandwidth varies about 2x over seconds while the compute-bound pass does not, so a
    floor timed only now and then can fall in a slow spell and flatter every ratio."""
    times = [[] for _ in fns]
    floors = []
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            if floor is not None:
                floors.append(_timed(floor.read))
            times[k].append(_timed(fn))
    if floor is not None:
        FLOOR_SAMPLES.setdefault(floor.key, []).extend(floors)
        times.insert(0, floors)
    return [(min(t), statistics.median(t)) for t in times]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


FLOOR_SAMPLES: dict = {}  # the floor's samples of the run per output (dtype, shape)


class MemoryFloor(NamedTuple):
    """Every byte of both tensors read once, nothing else (``read``: their sums), and the
    output's (dtype, shape) under which the run pools its samples (the goldens are all
    float64, so the same key reads as many bytes)."""
    key: tuple
    read: Callable[[], object]


def memory_floor_of(actual: torch.Tensor, golden: torch.Tensor) -> MemoryFloor:
    return MemoryFloor((str(actual.dtype).replace("torch.", ""), tuple(actual.shape)),
                       lambda: (actual.sum(), golden.sum()))


def floor_spread() -> None:
    """The floor of each output dtype and shape over the whole run: fastest, median,
    slowest (over every tensor of that dtype and shape the run made)."""
    print("the memory floor over the run (sampled before every timed call: the host's "
          "bandwidth varies)")
    for (dtype, shape), samples in FLOOR_SAMPLES.items():
        ms = sorted(t * 1e3 for t in samples)
        print(f"  {dtype:9s} {str(list(shape)):13s} {len(ms):4d} samples  fastest "
              f"{ms[0]:5.1f} ms  median {statistics.median(ms):5.1f} ms  slowest "
              f"{ms[-1]:5.1f} ms")


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    golden = torch.randn(SHAPE, generator=gen, dtype=torch.float64)
    actual = golden.to(torch.float32)
    computed = with_computed_error(golden, torch.float32, gen)
    n = golden.numel()
    metrics.measure(actual[:1], golden[:1])  # compile / load the cached kernel once

    def ours():
        metrics.measure(actual, golden)

    def ours_with_floor():
        metrics.measure_pair(actual, golden, floor=True)

    def ours_with_histograms():
        metrics.measure_all(actual, golden, floor=True, hist=True)

    def ours_with_plot_data():
        metrics.measure_all(actual, golden, floor=True, hist=True, heat="rel")

    def verdict():
        compare(actual, golden, standard="allclose")

    known = output_floor(golden, torch.float32, "allclose")

    def warm_verdict():  # the floors kept with the golden, as a warm run has them
        compare(actual, golden, standard="allclose", floor=known)

    def computed_verdict():  # an output that is not the rounded golden: floor apart
        compare(computed, golden, standard="allclose")

    def computed_warm():
        compare(computed, golden, standard="allclose", floor=known)

    def reference():
        torch.testing.assert_close(actual, golden, check_dtype=False)

    named = (("verify metrics (all, one pass)", ours),
             ("metrics + error floor (same pass)", ours_with_floor),
             ("metrics + floor + both histograms", ours_with_histograms),
             ("... + heat map: all the plot data", ours_with_plot_data),
             ("verify.compare (all that, and the verdict)", verdict),
             ("verify.compare, floors known (warm run)", warm_verdict),
             ("verify.compare, output with computed error", computed_verdict),
             ("... floors known (warm run)", computed_warm),
             ("torch.testing.assert_close", reference))
    floor = memory_floor_of(actual, golden)
    floor_timed, *timed = round_robin([fn for _, fn in named], floor=floor)
    rows = [(name, best, median) for (name, _), (best, median) in zip(named, timed)]
    rows.insert(2, ("read-only pass (memory floor)", *floor_timed))
    ref_best = rows[-1][1]
    ref_median = rows[-1][2]
    floor_best = rows[2][1]
    print(f"comparator on {SHAPE[0]}x{SHAPE[1]} fp32 vs float64 ({n / 1e6:.1f}M elements), "
          f"{metrics.numba_threads()} numba threads, best / median of {REPEATS}; torch's "
          f"idle OpenMP threads: OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    for name, best, median in rows:
        print(f"  {name:42s} {best * 1e3:8.1f} ms  {median * 1e3:8.1f} ms  "
              f"{n / best / 1e6:8.1f} M elem/s  speed-up vs assert_close "
              f"{ref_best / best:5.1f}x (median {ref_median / median:5.1f}x), "
              f"{best / floor_best:4.1f}x the memory floor")
    print(f"  error floor's cost (the golden rounded: its own floor): metrics with floor / "
          f"metrics alone = "
          f"{rows[1][1] / rows[0][1]:.2f} (target <= 1.2)")
    print(f"  histograms' cost: with both histograms / metrics with floor = "
          f"{rows[3][1] / rows[1][1]:.2f}")
    print(f"  plot data's cost: with both histograms and the heat map / metrics with floor = "
          f"{rows[4][1] / rows[1][1]:.2f} (target <= 1.1)")
    print(f"  the floor's cost in compare (computed in the call / known): the golden rounded "
          f"{rows[5][1] / rows[6][1]:.2f}, with computed error {rows[7][1] / rows[8][1]:.2f}")
    print(f"  targets: verify.compare <= 4x the memory floor (the golden rounded: floors "
          f"known {rows[6][1] / floor_best:.1f}x, computed in the call "
          f"{rows[5][1] / floor_best:.1f}x; with computed error: floors known "
          f"{rows[8][1] / floor_best:.1f}x, computed {rows[7][1] / floor_best:.1f}x), "
          f">= 10x faster than assert_close (the golden rounded: {ref_best / rows[6][1]:.1f}x"
          f" / {ref_best / rows[5][1]:.1f}x; computed error: {ref_best / rows[8][1]:.1f}x / "
          f"{ref_best / rows[7][1]:.1f}x); metrics alone <= 2.5x the floor "
          f"({rows[0][1] / floor_best:.1f}x)")
    variants()
    floors_once()
    touch_ways()
    floor_spread()
    against_fastest(rows, floor.key)


def with_computed_error(golden: torch.Tensor, dtype, gen, size: float = 1e-7) -> torch.Tensor:
    """The golden off by ``size`` relative before its rounding: at 1e-7, most elements a
    rounding away from the correctly rounded output, as a kernel that rounds
    intermediates; at 1e-4 (``loud``), errors beyond the tolerances' slopes, so every
    block counts its tolerances, and (fp32) ULP errors over 32."""
    noise = torch.randn(golden.shape, generator=gen, dtype=torch.float64)
    return (golden * (1 + size * noise)).to(dtype)


def with_few_loud(golden: torch.Tensor, dtype, every: int = 997) -> torch.Tensor:
    """The golden correctly rounded, but every ``every``-th value off by 1e-5 relative
    (loud: beyond msprobe's absolute threshold, 2^-20): about 66 loud elements a block,
    as torch's fp32 layer_norm has about 100, which a block counts alone."""
    out = golden.to(dtype)
    flat = out.view(-1)
    flat[::every] = (golden.view(-1)[::every] * (1 + 1e-5)).to(dtype)
    return out


ERROR_SIZE = {"computed": 1e-7, "loud": 1e-4}  # with_computed_error's size per variant
VARIANTS = (("fp32 [7168, 4096]", torch.float32, SHAPE, False),
            ("fp32 [7168, 4096], computed error", torch.float32, SHAPE, "computed"),
            ("bf16 [7168, 4096]", torch.bfloat16, SHAPE, False),
            ("fp16 [7168, 4096]", torch.float16, SHAPE, False),
            ("fp32 [7168, 4096], loud", torch.float32, SHAPE, "loud"),
            ("fp32 [7168, 4096], few loud", torch.float32, SHAPE, "few loud"),
            ("bf16 [458752, 64]", torch.bfloat16, (458752, 64), False),
            ("fp32 [524288, 8]", torch.float32, (1 << 19, 8), False),
            ("fp32 [4M, 1]", torch.float32, (1 << 22, 1), False),
            ("fp32 [1, 4M]", torch.float32, (1, 1 << 22), False),
            ("fp32 [7168, 4096], NaN / Inf", torch.float32, SHAPE, True),
            ("bf16 [7168, 4096], NaN / Inf", torch.bfloat16, SHAPE, True))


def variants() -> None:
    """Per output dtype and shape: metrics alone, compare with every floor computed,
    compare with the floors known and without floors, as multiples of the memory floor
    (best of 5, round robin)."""
    print("per dtype and shape (x the memory floor; known / none: compare with the floors "
          "kept with the golden over compare without floors, target <= 1.15)")
    for label, dtype, shape, special in VARIANTS:
        gen = torch.Generator().manual_seed(1)
        golden = torch.randn(shape, generator=gen, dtype=torch.float64)
        if special is True:
            flat = golden.view(-1)
            flat[::1009] = float("nan")
            flat[7::2003] = float("inf")
        actual = with_computed_error(golden, dtype, gen, ERROR_SIZE[special]) \
            if special in ERROR_SIZE else golden.to(dtype)
        if special == "few loud":
            actual = with_few_loud(golden, dtype)
        known = output_floor(golden, dtype, "cann_v1")
        fns = [lambda: metrics.measure(actual, golden),
               lambda: compare(actual, golden, standard="cann_v1"),
               lambda: compare(actual, golden, standard="cann_v1", floor=known),
               lambda: compare(actual, golden, standard="cann_v1", floor=False),
               lambda: torch.testing.assert_close(actual, golden, check_dtype=False,
                                                  equal_nan=True, atol=1e9, rtol=1e9)]
        (fl, _), (me, _), (co, _), (kn, _), (no, _), (ref, _) = round_robin(
            fns, 5, floor=memory_floor_of(actual, golden))
        print(f"  {label:34s} floor {fl * 1e3:5.1f} ms  metrics {me / fl:4.1f}x  compare "
              f"{co / fl:4.1f}x ({co * 1e3:5.1f} ms)  known floors {kn / fl:4.1f}x "
              f"({kn * 1e3:5.1f} ms)  none {no / fl:4.1f}x  "
              f"known / none {kn / no:4.2f}  assert_close / compare {ref / co:5.1f}x "
              f"(floors known {ref / kn:5.1f}x)")


def floors_once() -> None:
    """What a case's first kernel pays for the output floor that is then kept with the
    golden (output_floor, verify/golden/floors.py): the floor alone, each block of the
    golden rounded in cache (metrics.measure_floor), against the golden rounded whole
    first (round_once) and measured as an output, as output_floor did before; and a cold
    compare (output_floor, then compare with it known) against compare computing the floor
    in its own pass. The output has computed error: no block is its own floor."""
    print("the output floor, computed once per golden (x the memory floor of the output "
          "and golden; cold: output_floor + compare with it known)")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        gen = torch.Generator().manual_seed(3)
        golden = torch.randn(SHAPE, generator=gen, dtype=torch.float64)
        actual = with_computed_error(golden, dtype, gen)
        known = output_floor(golden, dtype, "allclose")

        def rounded_first():
            measure_all(round_once(golden, dtype), golden, dtype, floor=False)

        fns = [lambda: output_floor(golden, dtype, "allclose"), rounded_first,
               lambda: compare(actual, golden, standard="allclose", floor=known),
               lambda: compare(actual, golden, standard="allclose")]
        (fl, _), (alone, _), (first, _), (warm, _), (in_call, _) = round_robin(
            fns, 5, floor=memory_floor_of(actual, golden))
        print(f"  {str(dtype).replace('torch.', ''):9s} floor {fl * 1e3:5.1f} ms  "
              f"output_floor {alone / fl:4.1f}x ({alone * 1e3:5.1f} ms), rounded whole first "
              f"{first / fl:4.1f}x ({first * 1e3:5.1f} ms): {first / alone:4.2f}x faster;  "
              f"cold compare {(alone + warm) / fl:4.1f}x, floor in the call "
              f"{in_call / fl:4.1f}x, warm {warm / fl:4.1f}x")


def _with_touch(way, fn):
    """fn with the pass's touch fixed (0 off, 1 on), or timed by the pass (None)."""
    def run():
        metrics.TOUCH_STATE[:] = (-1, 0) if way is None else (way, 1)
        fn()
    return run


def touch_ways() -> None:
    """Metrics alone and compare (floors computed) with the touch off, on, and picked by
    the pass (timing both ways on each call's first blocks), x the memory floor."""
    print("the touch (each block read one word a line first): off / on / picked by the "
          "pass, x the memory floor")
    saved = metrics.TOUCH_STATE.copy()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        gen = torch.Generator().manual_seed(2)
        golden = torch.randn(SHAPE, generator=gen, dtype=torch.float64)
        actual = golden.to(dtype)
        fns = []
        for job in (lambda: metrics.measure(actual, golden),
                    lambda: compare(actual, golden, standard="cann_v1")):
            fns += [_with_touch(way, job) for way in (0, 1, None)]
        best = [b for b, _ in round_robin(fns, 5, floor=memory_floor_of(actual, golden))]
        fl = best[0]
        picked = "on" if metrics.TOUCH_STATE[0] == 1 else "off"
        print(f"  {str(dtype).replace('torch.', ''):9s} floor {fl * 1e3:5.1f} ms  metrics "
              f"{best[1] / fl:4.1f}x / {best[2] / fl:4.1f}x / {best[3] / fl:4.1f}x  compare "
              f"{best[4] / fl:4.1f}x / {best[5] / fl:4.1f}x / {best[6] / fl:4.1f}x  "
              f"(off / on {best[4] / best[5]:4.2f}; the pass's last pick: {picked})")
    metrics.TOUCH_STATE[:] = saved


def against_fastest(rows, key) -> None:
    """The first section's targets again, against the fastest floor of the same bytes that
    the whole run saw: the ratios a user of this machine's best memory bandwidth gets."""
    fastest = min(FLOOR_SAMPLES[key])
    by_name = {name: best for name, best, _ in rows}
    print(f"  against the run's fastest fp32 {list(SHAPE)} floor ({fastest * 1e3:.1f} ms): "
          f"metrics alone {by_name['verify metrics (all, one pass)'] / fastest:.1f}x, "
          f"verify.compare {by_name['verify.compare (all that, and the verdict)'] / fastest:.1f}x"
          f" (floors known "
          f"{by_name['verify.compare, floors known (warm run)'] / fastest:.1f}x), with computed "
          f"error {by_name['verify.compare, output with computed error'] / fastest:.1f}x "
          f"(floors known {by_name['... floors known (warm run)'] / fastest:.1f}x)")


if __name__ == "__main__":
    main()
