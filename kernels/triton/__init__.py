"""The Triton backend: compiled on a GPU, the Triton interpreter on a CPU.

The backend sets the interpreter up itself (TRITON_INTERPRET=1 before any @triton.jit
runs) when no GPU is present, so users run Triton kernels anywhere with nothing to set.
"""
from __future__ import annotations

import os
import sys

import torch

from verify.specs.registry import Backend, register_backend

INTERPRETER_MAX_ELEMENTS = 1 << 21  # ~2M elements: seconds per case in the interpreter

ON_GPU = torch.cuda.is_available()
# Triton builds its own @jit library functions (tl.max, tl.sum, ...) when it is imported,
# so the interpreter must be chosen before anyone imports it
_LATE = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    IMPORT_ERROR = ""
except Exception as exc:  # not installed, or broken
    triton = None
    IMPORT_ERROR = f"triton cannot be imported ({type(exc).__name__}: {exc}); pip install triton"

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _check() -> tuple[bool, str]:
    if IMPORT_ERROR:
        return False, IMPORT_ERROR
    if _LATE and not ON_GPU:
        return False, ("triton was imported before the interpreter was set up: import "
                       "verify first, or set TRITON_INTERPRET=1")
    return True, ""


def _versions() -> dict:
    from verify.running import triton_probe
    out = {"triton": getattr(triton, "__version__", "not installed"),
           "mode": "interpreter" if INTERPRETED else "compiled"}
    if INTERPRETED and triton is not None:
        out["interpreter probe"] = triton_probe.summary()
    return out


BACKEND = register_backend(Backend(
    "triton", device="cuda" if ON_GPU and not INTERPRETED else "cpu", check=_check,
    versions=_versions, max_elements=INTERPRETER_MAX_ELEMENTS if INTERPRETED else None,
    triton=True,
    note="Triton interpreter on the CPU" if INTERPRETED else "compiled on the GPU"))


def block_size() -> int:
    """Large blocks in the interpreter (it costs ~5 ms per program), 1024 compiled."""
    return 4096 if INTERPRETED else 1024
