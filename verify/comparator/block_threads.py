"""The metrics pass's threads: one call of a nogil compiled function a thread.

The pass runs a call a thread, each claiming the next block no thread has taken
(metrics._make_pass), so its threads are plain Python threads that release the GIL
while numba's code runs, rather than a parallel=True function: numba's parfor
compilation of that function had cost a fresh machine about 13 s a pass variant. The
calling thread takes t = 0 itself; the others come from one pool a process (made again
after a fork, whose child has no threads), so a call pays no thread start. They are the
comparator's, not a kernel's: own_threads() names them, so a run that reports the
threads its kernels left running (isolation.lingering_threads) leaves these out."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_LOCK = threading.Lock()
_POOL: dict = {}  # pid -> the pool's executor
_OWN: set[int] = set()  # the idents of this process's pool threads


def _started() -> None:
    """The pool's initializer: each of its threads records itself as it starts."""
    _OWN.add(threading.get_ident())


def own_threads() -> set[int]:
    """The idents of the pool's threads in this process (none before its first use)."""
    return set(_OWN) if os.getpid() in _POOL else set()


def _pool() -> ThreadPoolExecutor:
    with _LOCK:
        pool = _POOL.get(os.getpid())
        if pool is None:
            import numba  # here: own_threads() alone (a run's end) imports no numba
            _POOL.clear()  # a forked child's copy of its parent's pool has no threads
            _OWN.clear()
            pool = ThreadPoolExecutor(max_workers=max(1, numba.config.NUMBA_NUM_THREADS - 1),
                                      thread_name_prefix="verify-pass",
                                      initializer=_started)
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
