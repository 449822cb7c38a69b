"""Spreading pytest-xdist workers over a machine's accelerators: worker i uses device
i mod N, by the visibility variable of the device kind, set before the worker touches it."""
from __future__ import annotations

import os

VISIBILITY = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}


def device_counts() -> dict[str, int]:
    """How many of each kind this machine has (VERIFY_DEVICE_COUNT_<KIND> overrides)."""
    counts = {}
    for kind in VISIBILITY:
        forced = os.environ.get(f"VERIFY_DEVICE_COUNT_{kind.upper()}")
        if forced is not None:
            counts[kind] = int(forced)
            continue
        try:
            if kind == "cuda":
                import torch
                counts[kind] = torch.cuda.device_count()  # NVML: no context is created
            else:
                import torch
                import torch_npu  # noqa: F401  (adds torch.npu)
                counts[kind] = torch.npu.device_count()
        except Exception:
            counts[kind] = 0
    return counts


def pin_worker(worker_id: str | None, env=os.environ) -> dict[str, str]:
    """For xdist worker 'gwI': make device I mod N the only visible one of each kind that
    has several, unless the user already chose. Returns what was set."""
    if not worker_id or not worker_id.startswith("gw"):
        return {}
    index = int(worker_id[2:])
    chosen = {}
    for kind, count in device_counts().items():
        var = VISIBILITY[kind]
        if count > 1 and var not in env:
            env[var] = str(index % count)
            chosen[var] = env[var]
    return chosen


def share_cpu(worker_count: int, env=os.environ) -> int | None:
    """Give each of ``worker_count`` xdist workers its share of the CPU cores for torch's
    and numba's thread pools (each would otherwise start one thread per core, and on a
    2-core machine two workers ran L0 at half the speed of one). Left alone when the user
    set OMP_NUM_THREADS. Returns the threads per worker, or None."""
    if worker_count < 2 or "OMP_NUM_THREADS" in env:
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    threads = max(1, cores // worker_count)
    import torch
    torch.set_num_threads(threads)
    try:
        import numba
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    except Exception:  # numba's pool cannot shrink once some backends started
        pass
    return threads
