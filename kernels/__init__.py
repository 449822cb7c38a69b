"""The built-in kernels, one package per backend: torch, mutants and strategies always;
triton, pypto and npu (torch_npu) only when a run uses them and their dependency is
installed (``pip install kernel-verify[triton]`` / ``[pypto]``, torch_npu from Ascend)."""
from __future__ import annotations

import importlib.util
import os
import sys

from verify.specs.registry import Backend


def _installed(dist: str, extra: str):
    def check() -> tuple[bool, str]:
        if importlib.util.find_spec(dist) is None:
            return False, f"{dist} is not installed ({extra})"
        return True, ""
    return check


# Announced without importing them; each package registers its real Backend on import.
OPTIONAL_BACKENDS = (
    Backend("triton", check=_installed("triton", "pip install 'kernel-verify[triton]'"),
            module="verify.kernels.triton", note="Triton kernels (imported when used)"),
    Backend("pypto", check=_installed("pypto", "pip install 'kernel-verify[pypto]'"),
            default=False, module="verify.kernels.pypto",
            note="PyPTO kernels (imported when used)"),
    Backend("npu", device="npu",
            check=_installed("torch_npu", "torch_npu needs an Ascend NPU and the CANN toolkit"),
            module="verify.kernels.npu", note="torch_npu fused operators"),
)


def prepare_optional_backends() -> None:
    """Triton builds its library functions when it is imported, so on a machine without a
    GPU the interpreter must be chosen before anything imports triton (a user's module
    included)."""
    if "triton" in sys.modules:
        return
    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
