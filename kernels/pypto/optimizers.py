"""PyPTO kernels as harness kernels: each call runs kernels/pypto/worker.py in a subprocess
and records the cost model's AICore End-to-End Time beside the outputs."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import verify
from verify.goldens import optimizer_checks as checks
from verify.running import runner
from verify.specs.registry import kernel

from ._internals import aicore_time

# the folder that holds the verify package, so the worker imports the same harness
REPO = Path(verify.__file__).resolve().parent.parent
TIMEOUT_S = 900


def run_mode() -> str:
    """NPU where torch_npu sees one; elsewhere SIM with pass verification on the CPU."""
    from verify.kernels.npu import BACKEND as NPU
    return "npu" if NPU.available()[0] else "sim"


def run_worker(op: str, inputs: dict, params: dict, dtype: str, bug: str | None = None):
    with tempfile.TemporaryDirectory(prefix="verify-pypto-") as tmp:
        src, dst = Path(tmp, "in.pt"), Path(tmp, "out.pt")
        torch.save({"op": op, "inputs": {k: v.cpu() for k, v in inputs.items()},
                    "params": params, "dtype": dtype, "bug": bug, "run_mode": run_mode()}, src)
        env = {**os.environ, "TILE_FWK_OUTPUT_DIR": str(Path(tmp, "output")),
               "ASCEND_WORK_PATH": str(Path(tmp, "work")),
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.run([sys.executable, "-m", "verify.kernels.pypto.worker", str(src), str(dst)],
                              cwd=tmp, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        if proc.returncode != 0 or not dst.exists():
            tail = (proc.stderr or proc.stdout)[-2000:]
            raise RuntimeError(f"PyPTO worker failed (exit {proc.returncode}): {tail}")
        runner.note("aicore_time_us", aicore_time(proc.stdout))
        return torch.load(dst)


def _adamw(weight, grad, m, v, params, bug=None):
    checks.check_adam_w_v2(weight, grad, m, v, step=params["step"])
    dtype = "bf16" if weight.dtype == torch.bfloat16 else "fp32"
    return tuple(run_worker("apply_adam_w_v2", dict(weight=weight, grad=grad, m=m, v=v),
                            params, dtype, bug))


_DEFAULTS = dict(beta1=0.9, beta2=0.999, lr=1e-3, weight_decay=0.01, eps=1e-8, step=1)


@kernel("apply_adam_w_v2", backend="pypto", name="apply_adam_w_v2")
def apply_adam_w_v2(weight, grad, m, v, **params):
    """ApplyAdamWV2 in PyPTO (kernels/pypto/adamw.py)."""
    return _adamw(weight, grad, m, v, {**_DEFAULTS, **params})


@kernel("apply_adam_w_v2", backend="mutants", name="pypto_wrong_assemble_offset")
def pypto_wrong_assemble_offset(weight, grad, m, v, **params):
    """PyPTO AdamW assembling v_new without its M offset: every row tile lands on row 0."""
    return _adamw(weight, grad, m, v, {**_DEFAULTS, **params}, bug="wrong_assemble_offset")


@kernel("apply_adam_w_v2", backend="mutants", name="pypto_missing_cast")
def pypto_missing_cast(weight, grad, m, v, **params):
    """PyPTO AdamW for bf16 weights without the cast up to fp32: the math runs in bf16."""
    return _adamw(weight, grad, m, v, {**_DEFAULTS, **params}, bug="missing_cast")


@kernel("apply_rms_prop", backend="pypto", name="apply_rms_prop")
def apply_rms_prop(var, ms, mom, grad, *, lr=0.001, rho=0.9, momentum=0.9, epsilon=1e-7):
    """ApplyRMSProp in PyPTO (kernels/pypto/elementwise.py)."""
    checks.check_rms_prop(var, ms, mom, grad)
    return tuple(run_worker("apply_rms_prop", dict(var=var, ms=ms, mom=mom, grad=grad),
                            dict(lr=lr, rho=rho, momentum=momentum, epsilon=epsilon), "fp32"))


@kernel("apply_proximal_gradient_descent", backend="pypto",
        name="apply_proximal_gradient_descent")
def apply_proximal_gradient_descent(var, alpha, l1, l2, delta):
    """ApplyProximalGradientDescent in PyPTO: any rank, flattened to rows x last dim; the
    scalars become host-side constants of the kernel."""
    checks.check_proximal_gd(var, alpha, l1, l2, delta)
    if var.numel() == 0:
        return var.clone()
    cols = var.shape[-1] if var.dim() else 1
    flat = dict(var=var.reshape(-1, cols), delta=delta.reshape(-1, cols))
    params = {k: float(s.reshape(())) for k, s in dict(alpha=alpha, l1=l1, l2=l2).items()}
    dtype = "fp16" if var.dtype == torch.float16 else "fp32"
    (out,) = run_worker("apply_proximal_gradient_descent", flat, params, dtype)
    return out.reshape(var.shape)
