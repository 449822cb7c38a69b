"""Is the Triton interpreter faithful here? A probe of its low-precision arithmetic.

Triton's CPU interpreter (TRITON_INTERPRET=1) has had defects that look like kernel bugs:
triton 3.9.0 keeps bf16 values as uint16 and computes on the bit patterns, and converts
fp32 to bf16 by truncation. Before any Triton row is judged, three tiny kernels are run
once per process (a*b + a in bf16 and in fp16, and an fp32 -> bf16 store) and compared
with torch's correctly rounded results. Each defect found becomes a warning on every row
of a Triton kernel whose case works in that dtype, naming the interpreter, not the kernel.
"""
from __future__ import annotations

import functools
import os
import sys
import types

import torch

_A = [1.5, -2.25, 3.0, 0.1, 100.0, 7.0, -0.5, 2.0]
_B = [2.0, 0.5, -1.25, 3.0, 0.01, 1.0, 4.0, 2.0]
_TO_BF16 = [1.00390625 + 2 ** -10, -3.0 - 3 * 2 ** -9, 0.3, -0.7]  # round up in magnitude


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=1)
def probe() -> dict[str, str]:
    """dtype -> the defect found ('' when the interpreter computed it right). Empty when
    Triton is not interpreted here or cannot be imported."""
    if not interpreted():
        return {}
    try:
        import triton
        import triton.language as tl
    except Exception:  # not installed or broken: no Triton rows to warn about either
        return {}

    @triton.jit
    def fma_like(a_ptr, b_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        m = offs < n
        a = tl.load(a_ptr + offs, mask=m)
        b = tl.load(b_ptr + offs, mask=m)
        tl.store(o_ptr + offs, a * b + a, mask=m)

    @triton.jit
    def store_as(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        m = offs < n
        tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m).to(o_ptr.dtype.element_ty),
                 mask=m)

    found = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        a, b = torch.tensor(_A, dtype=dtype), torch.tensor(_B, dtype=dtype)
        out = torch.empty_like(a)
        try:
            fma_like[(1,)](a, b, out, len(_A), BLOCK=8)
            want = a * b + a
            found[name] = "" if torch.equal(out, want) else (
                f"{name} arithmetic is wrong (a*b + a gave {out[:3].tolist()} for "
                f"{want[:3].tolist()})")
        except Exception as exc:
            found[name] = f"{name} arithmetic raised {type(exc).__name__}: {exc}"
    x = torch.tensor(_TO_BF16, dtype=torch.float32)
    out = torch.empty(len(_TO_BF16), dtype=torch.bfloat16)
    try:
        store_as[(1,)](x, out, len(_TO_BF16), BLOCK=4)
        want = x.to(torch.bfloat16)
        if not torch.equal(out, want):
            found["bf16"] = "; ".join(filter(None, [found.get("bf16"), (
                f"fp32 -> bf16 conversion does not round to nearest even "
                f"({x[0].item():.10g} became {out[0].item():.10g}, not {want[0].item():.10g})")]))
    except Exception as exc:
        found["bf16"] = "; ".join(filter(None, [found.get("bf16"), f"fp32 -> bf16 conversion "
                                                f"raised {type(exc).__name__}: {exc}"]))
    return found


def summary() -> str:
    """One line for the report's environment section."""
    result = probe()
    if not result:
        return "not run (Triton compiled or absent)"
    return "; ".join(f"{k}: {v or 'correct'}" for k, v in result.items())


def is_triton_kernel(fn) -> bool:
    """A kernel that launches Triton code: its module (or a closure) holds the triton
    package, triton.language or a @triton.jit function."""
    fn = getattr(fn, "__wrapped__", fn)
    names = dict(getattr(fn, "__globals__", {}))
    for var, cell in zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()),
                         getattr(fn, "__closure__", None) or ()):
        try:
            names[var] = cell.cell_contents
        except ValueError:
            pass
    for value in names.values():
        module = value.__name__ if isinstance(value, types.ModuleType) else \
            getattr(type(value), "__module__", "") or ""
        if module == "triton" or module.startswith("triton."):
            return True
    return False


def warning_for(dtypes: set[str], triton_kernel: bool) -> str:
    """The interpreter's defects that touch these dtypes, as a row warning ('' if none)."""
    if not triton_kernel or "triton" not in sys.modules or not interpreted():
        return ""
    defects = [v for k, v in probe().items() if v and k in dtypes]
    if not defects:
        return ""
    return ("Triton interpreter defect (start-up probe): " + "; ".join(defects)
            + ": a FAIL in this dtype may be the interpreter's, not the kernel's")
