"""kernel-verify: prove a kernel precise enough against float64 goldens.

Python API:
    verify.ops()                                   names of the registered ops
    verify.op(name).golden(**inputs, **params)     the float64 golden
    verify.compare(actual, golden, dtype=..., standard=...)  -> Verdict
    verify.run(level="L0", ops=..., backends=...)  -> RunResult (.df is a DataFrame)
    @verify.kernel("apply_adam_w_v2", backend="mine")  register your kernel
    @verify.backward_kernel("mhc_post", backend="mine")  its separate backward (optional:
                                                   otherwise autograd through the kernel)
"""
from __future__ import annotations

from .api import RunResult, run
from .compare import Verdict, compare
from .errors import CaseFileError, ConfigError
from .registry import backward_kernel, kernel, op, ops

__all__ = ["ops", "op", "compare", "run", "kernel", "backward_kernel", "Verdict", "RunResult", "ConfigError",
           "CaseFileError"]
