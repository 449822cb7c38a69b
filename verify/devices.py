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
