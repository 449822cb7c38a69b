"""The metrics pass's threads: one call of a nogil compiled function a thread.

The pass walks thread t's blocks in a call of its own (metrics._make_pass), so its
threads are plain Python threads that release the GIL while numba's code runs, rather
than a parallel=True function: numba's parfor compilation of that function had cost a
fresh machine about 13 s a pass variant. The calling thread takes t = 0 itself; the
others come from one pool a process (made again after a fork, whose child has no
threads), so a call pays no thread start."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba

_LOCK = threading.Lock()
_POOL: dict = {}  # pid -> the pool's executor


def _pool() -> ThreadPoolExecutor:
    with _LOCK:
        pool = _POOL.get(os.getpid())
        if pool is None:
            _POOL.clear()  # a forked child's copy of its parent's pool has no threads
            pool = ThreadPoolExecutor(max_workers=max(1, numba.config.NUMBA_NUM_THREADS - 1),
                                      thread_name_prefix="verify-pass")
            _POOL[os.getpid()] = pool
        return pool


def run_per_thread(fn, n_threads: int, *args) -> None:
    """fn(t, *args) for t in 0 .. n_threads - 1, concurrently; returns when all have
    returned, raising an error when any raised one."""
    if n_threads <= 1:
        fn(0, *args)
        return
    others = [_pool().submit(fn, t, *args) for t in range(1, n_threads)]
    try:
        fn(0, *args)
    finally:
        for job in others:
            job.result()
