"""The torch_npu backend: torch_npu's fused operators on an Ascend NPU.

torch_npu imports only where the CANN toolkit is installed. Elsewhere this backend is
unavailable and its rows SKIP with the reason; asked for by name it is a usage error.
Nothing here pretends to run when it did not.
"""
from __future__ import annotations

from verify.specs.registry import Backend, register_backend

try:
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)
    _NPU = torch.npu.is_available()
    REASON = "" if _NPU else "torch_npu imported but no NPU device is visible"
except ImportError as exc:
    torch_npu = None
    _NPU = False
    REASON = f"torch_npu is not installed or needs the CANN toolkit ({exc})"
except Exception as exc:  # CANN libraries missing or broken
    torch_npu = None
    _NPU = False
    REASON = f"torch_npu cannot be imported: {type(exc).__name__}: {exc}"


def _versions() -> dict:
    return {"torch_npu": getattr(torch_npu, "__version__", "not installed")}


BACKEND = register_backend(Backend("npu", device="npu", check=lambda: (_NPU, REASON),
                                   versions=_versions, note="torch_npu fused operators"))
