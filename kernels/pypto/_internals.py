"""Everything that touches PyPTO 0.2.0's private internals, in one place.

1. Real inputs for pass verification. In 0.2.0, SIM mode hands the pass-verify evaluator
   zero-filled host copies of the inputs (JitCallableWrapper._setup_verify_data copies
   "device" tensors to fresh host tensors, and on the CPU there is no device to copy from).
   Registering the caller's own tensors instead makes the evaluator compute with the real
   values and write the kernel's outputs into the output tensors.
2. The calculator library. PyPTO builds it with cmake and g++ in a temporary folder in every
   process (about 50-100 s). Here it is built once into a cache folder and loaded from
   there afterwards.
3. The cost model's "AICore End-to-End Time", which PyPTO prints rather than returns.
"""
from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

PINNED = "0.2.0"
AICORE_RE = re.compile(r"AICore End-to-End Time:\s*([0-9.eE+-]+)")


def cache_dir() -> Path:
    """Where the calculator is built once: per pypto and torch version
    (VERIFY_PYPTO_CACHE, default ~/.cache/kernel-verify/pypto)."""
    from importlib import metadata

    import torch
    base = os.environ.get("VERIFY_PYPTO_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "kernel-verify", "pypto")
    return Path(base) / f"calculator-pypto{metadata.version('pypto')}-torch{torch.__version__}"


def _cached_calculator(self) -> None:
    """BuildOnlineManager.build_and_load_calculator, with a persistent build folder."""
    if self.calculator_loaded:
        return
    from filelock import FileLock
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    so = None
    with FileLock(str(target) + ".lock"):  # xdist workers build it once between them
        found = list(target.rglob("libtile_fwk_calculator.so"))
        if found:
            so = found[0]
        else:
            torch_ctx = self._TorchContext()
            cmake_ctx = self._CMakeContext()
            ctx = self._CMakeContext.CompileContext(src_dir=Path(self.pkg_lib_dir, "calculator"),
                                                    tmp_dir=target)
            ctx.cfg_cmd_ext = (f"-DPY3_MOD_TORCH_VERSION={torch_ctx.torch_version}"
                               f" -DPY3_MOD_TORCH_ROOT_PATH={torch_ctx.torch_root_dir}"
                               f" -DPY3_MOD_TORCH_C_GLIBCXX_USE_CXX11_ABI="
                               f"{torch_ctx.torch_c_use_cxx11_abi}")
            so = Path(cmake_ctx.compile(ctx=ctx), "lib/libtile_fwk_calculator.so")
    if not so or not so.exists():
        raise RuntimeError(f"the PyPTO calculator was not built in {target}")
    ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)
    self.calculator_loaded = True


def _real_verify_inputs(pto_tensors) -> None:
    """JitCallableWrapper._setup_verify_data, registering the real tensors."""
    import pypto
    from pypto import pypto_impl
    from pypto._utils import BuildOnlineManager
    from pypto.frontend.parser import entry
    from pypto.runtime import _pto_verify_datas
    if not pypto.get_verify_options().get("enable_pass_verify"):
        return
    BuildOnlineManager().build_and_load_calculator()
    pypto_impl.SetVerifyData(entry._pto_to_tensor_data(pto_tensors), [],
                             _pto_verify_datas.get_data())


def install() -> None:
    """Apply both patches (idempotent)."""
    from pypto._utils import BuildOnlineManager
    from pypto.frontend.parser import entry
    BuildOnlineManager.build_and_load_calculator = _cached_calculator
    entry.JitCallableWrapper._setup_verify_data = staticmethod(_real_verify_inputs)


def aicore_time(text: str) -> float | None:
    """The last 'AICore End-to-End Time' in PyPTO's output (microseconds at 1800 MHz)."""
    found = AICORE_RE.findall(text)
    return float(found[-1]) if found else None
