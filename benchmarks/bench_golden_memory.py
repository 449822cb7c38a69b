"""AdamW golden at [7168, 24576]: time against the memory floor and peak memory, fused vs
torch slices vs the plain formula.

All run in this process, one after the other, on the same float64 inputs. Peak memory is
sampled from /proc/self/statm by a background thread while each runs, and reported against
the float64 size of the inputs plus the outputs (target: at most 1.5x).
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import time

import torch

import verify

SHAPE = tuple(int(x) for x in os.environ.get("BENCH_SHAPE", "7168x24576").split("x"))
PAGE = os.sysconf("SC_PAGE_SIZE")
GB = 1024 ** 3


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRss:
    """Highest resident set size seen while the block runs."""

    def __enter__(self):
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def plain_adamw(weight, grad, m, v, beta1=0.9, beta2=0.999, lr=1e-3, weight_decay=0.01,
                eps=1e-8, step=1):
    """The textbook float64 formula on whole tensors."""
    m_t = beta1 * m + (1 - beta1) * grad
    v_t = beta2 * v + (1 - beta2) * grad * grad
    m_hat = m_t / (1 - beta1 ** step)
    v_hat = v_t / (1 - beta2 ** step)
    update = m_hat / (torch.sqrt(v_hat) + eps) + weight_decay * weight
    return weight - lr * update, m_t, v_t


def main() -> int:
    torch.set_num_threads(os.cpu_count() or 1)
    n = SHAPE[0] * SHAPE[1]
    gen = torch.Generator().manual_seed(0)
    base = rss()
    inputs = {
        "weight": torch.randn(SHAPE, generator=gen, dtype=torch.float64),
        "grad": torch.randn(SHAPE, generator=gen, dtype=torch.float64),
        "m": torch.randn(SHAPE, generator=gen, dtype=torch.float64).mul_(0.1),
        "v": torch.rand(SHAPE, generator=gen, dtype=torch.float64).mul_(0.01),
    }
    in_bytes = 4 * n * 8
    out_bytes = 3 * n * 8
    print(f"AdamW golden at {SHAPE[0]}x{SHAPE[1]} ({n / 1e6:.0f}M elements per tensor): "
          f"float64 inputs {in_bytes / GB:.2f} GiB + outputs {out_bytes / GB:.2f} GiB "
          f"= {(in_bytes + out_bytes) / GB:.2f} GiB")
    # the memory floor: one read of every input and one write of every (new) output,
    # measured by copying the same bytes into new tensors in this run
    floor = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        outs = [t.clone() for t in list(inputs.values())[:3]]
        inputs["v"].sum()
        floor = min(floor, time.perf_counter() - t0)
        del outs
    print(f"  memory floor (read the inputs, write new outputs) {floor:6.2f} s")
    spec = verify.op("apply_adam_w_v2")
    spec.golden_fn(**{k: v[:256] for k, v in inputs.items()}, **spec.params)  # compile
    from verify.goldens import chunked

    def torch_slices():  # the path before the fused one: torch ops slice by slice
        saved, chunked.FUSED_MIN_ELEMENTS = chunked.FUSED_MIN_ELEMENTS, 1 << 62
        try:
            return spec.golden_fn(**inputs, **spec.params)
        finally:
            chunked.FUSED_MIN_ELEMENTS = saved

    for name, fn in (("golden (fused, compiled)", lambda: spec.golden_fn(**inputs, **spec.params)),
                     ("golden on torch slices", torch_slices),
                     ("plain unchunked formula", lambda: plain_adamw(**inputs))):
        seconds, used = float("inf"), 0
        for _ in range(1 if name.startswith("plain") else 2):  # best of two: noisy machine
            gc.collect()
            t0 = time.perf_counter()
            with PeakRss() as peak:
                outs = fn()
            seconds = min(seconds, time.perf_counter() - t0)
            used = max(used, peak.peak - base)  # inputs + outputs + temporaries
            del outs
        print(f"  {name:28s} {seconds:6.2f} s = {seconds / floor:4.2f}x the memory floor "
              f"(target <= 2), peak {used / GB:6.2f} GiB = "
              f"{used / (in_bytes + out_bytes):4.2f}x of inputs + outputs (target <= 1.5)")
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
