"""Runs one PyPTO kernel call in its own process: ``python -m verify.kernels.pypto.worker IN OUT``.

IN is a torch.save'd dict (op, inputs, params, dtype, bug, run_mode); OUT receives the
outputs. PyPTO's memory grows with loop iterations and it writes output folders, so each
case runs here, in a folder of its own, and its process ends with the case.
"""
from __future__ import annotations

import sys

import torch


def main(src: str, dst: str) -> int:
    import pypto

    from verify.kernels.pypto import _internals, adamw, elementwise
    _internals.install()
    job = torch.load(src, weights_only=False)
    run_mode = pypto.RunMode.NPU if job["run_mode"] == "npu" else pypto.RunMode.SIM
    x = {k: v.contiguous() for k, v in job["inputs"].items()}
    p = job["params"]
    if job["op"] == "apply_adam_w_v2":
        kernel = adamw.build(*x["weight"].shape, job["dtype"], p["beta1"], p["beta2"], p["lr"],
                             p["weight_decay"], p["eps"], p["step"], run_mode, job.get("bug"))
        args = [x["weight"], x["grad"], x["m"], x["v"]]
        like = [x["weight"], x["m"], x["v"]]
    elif job["op"] == "apply_rms_prop":
        kernel = elementwise.build_rms_prop(*x["var"].shape, p["lr"], p["rho"], p["momentum"],
                                            p["epsilon"], run_mode)
        args = [x["var"], x["ms"], x["mom"], x["grad"]]
        like = [x["var"], x["ms"], x["mom"]]
    elif job["op"] == "apply_proximal_gradient_descent":
        kernel = elementwise.build_proximal(*x["var"].shape, job["dtype"], p["alpha"], p["l1"],
                                            p["l2"], run_mode)
        args = [x["var"], x["delta"]]
        like = [x["var"]]
    else:
        raise SystemExit(f"no PyPTO kernel for {job['op']}")
    # outputs shaped and typed like the inputs they update (the kernel writes their bytes)
    outs = [torch.zeros_like(t) for t in like]
    kernel(*args, *outs)
    torch.save(outs, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
