"""The metrics pass runs a call per thread (verify.comparator.block_threads): its figures
do not depend on how many threads run it, a thread's error reaches the caller, and a
forked child (a Ray or multiprocessing worker) gets threads of its own."""
import math
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest
import torch

from verify.comparator import block_threads, metrics
from verify.running import isolation


def _figures(m: metrics.Measured):
    """Every field of both metrics, the histograms and the heat map, NaN-aware."""
    def same(x):
        return "nan" if isinstance(x, float) and math.isnan(x) else x
    fields = [tuple(same(v) for v in part.as_dict().values()) for part in (m.metrics, m.floor)]
    return fields, repr(m.histogram), repr(m.heatmap)


def _pair(dtype):
    gen = torch.Generator().manual_seed(7)
    golden = torch.randn(5 * metrics.BLOCK // 64 + 37, 64, generator=gen,
                         dtype=torch.float64)
    actual = (golden * (1 + 3e-3 * torch.randn(golden.shape, generator=gen,
                                               dtype=torch.float64))).to(dtype)
    actual.view(-1)[[11, 3 * metrics.BLOCK + 5]] = float("nan")
    actual.view(-1)[2 * metrics.BLOCK + 9] = float("inf")
    return actual, golden


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_figures_do_not_depend_on_the_thread_count(dtype):
    actual, golden = _pair(dtype)
    before = numba.get_num_threads()
    try:
        results = []
        for n in (1, max(2, before)):
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
            results.append(_figures(metrics.measure_all(actual, golden, heat="rel")))
    finally:
        numba.set_num_threads(before)
    assert results[0] == results[1]
    kernel = dict(zip(metrics.Metrics.names(), results[0][0][0]))
    assert kernel["n"] == golden.numel() - 3 and kernel["nan_inf_mismatch"] == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_thread_held_up_leaves_its_blocks_to_the_others(dtype, monkeypatch):
    """The pass's threads claim blocks as they go: where the pass is made for three
    threads and one of them runs it all before the others come (their cores busy), the
    others find nothing left to take. They are handed an actual of NaN, which changes no
    figure; a pass that dealt every third block to each thread would read it."""
    actual, golden = _pair(dtype)
    n = golden.numel()
    monkeypatch.setattr(numba, "get_num_threads", lambda: 3)
    everyone = _figures(metrics.measure_all(actual, golden, heat="rel"))

    def nan_actual(args):  # the output's values and bits, all ones (NaN) in every bit
        return [np.full_like(x, -1) if isinstance(x, np.ndarray) and x.size == n
                and x.dtype in (np.float32, np.int32, np.int16) else x for x in args]

    came = []

    def one_runs_first(fn, n_threads, *args):
        assert n_threads == 3
        fn(2, *args)
        for t in (1, 0):
            came.append(t)
            fn(t, *nan_actual(args))

    monkeypatch.setattr(metrics, "run_per_thread", one_runs_first)
    assert _figures(metrics.measure_all(actual, golden, heat="rel")) == everyone
    assert came == [1, 0]


def test_a_threads_error_reaches_the_caller():
    seen = []

    def fn(t, box):
        seen.append(t)
        if t == 2:
            raise ValueError(f"thread {t} of {box}")

    with pytest.raises(ValueError, match="thread 2 of box"):
        block_threads.run_per_thread(fn, 3, "box")
    assert sorted(seen) == [0, 1, 2]


def _child(queue, actual, golden):  # no torch kernels here: torch's own pool is not
    # fork-safe, the pass's is
    queue.put(_figures(metrics.measure_all(actual, golden, heat="rel")))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                    reason="no fork on this platform")
def test_a_forked_child_runs_the_pass_on_threads_of_its_own():
    actual, golden = _pair(torch.float32)
    here = _figures(metrics.measure_all(actual, golden, heat="rel"))  # the pool exists now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue, actual, golden))
    child.start()
    there = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert there == here


def test_the_pools_threads_are_not_a_kernels_leftovers():
    """The pool's threads outlive a call (idle, not daemon): the run's check for threads
    kernels left running must not count them, but still counts any other."""
    before = {t.ident for t in threading.enumerate()}
    block_threads.run_per_thread(lambda t: None, 2)
    assert block_threads.own_threads()
    assert isolation.lingering_threads(before - block_threads.own_threads()) == []
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="a-kernels-thread")
    other.start()
    try:
        assert [t.name for t in isolation.lingering_threads(before)] == ["a-kernels-thread"]
    finally:
        stop.set()
        other.join()


def test_compares_from_several_threads_at_once_get_their_own_figures():
    """A user's threaded harness: each thread's compare gets the figures it gets alone
    (the pass's buffers are the calling thread's, the pool is shared)."""
    pairs = [_pair(dtype) for dtype in (torch.float32, torch.bfloat16, torch.float16)]
    alone = [_figures(metrics.measure_all(a, g, heat="rel")) for a, g in pairs]
    with ThreadPoolExecutor(max_workers=3) as callers:
        for _ in range(2):
            together = list(callers.map(lambda p: _figures(metrics.measure_all(*p, heat="rel")),
                                        pairs))
            assert together == alone
