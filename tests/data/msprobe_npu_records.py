"""NPU-named records in msprobe's dump format (no NPU here): the outputs of record .0 of
each API are what a correct NPU returns, computed with msprobe's own CPU bench functions
(msprobe/pytorch/bench_functions/) in fp32 and rounded to the record's dtype; record .1
of each API holds a planted bug's outputs on the same inputs.

usage (in a venv with mindstudio-probe): python msprobe_npu_records.py DUMP_DIR
"""
import json
import math
import sys
from pathlib import Path

import torch
from msprobe.pytorch.bench_functions.apply_adam_w import npu_apply_adam_w
from msprobe.pytorch.bench_functions.moe_gating_top_k_softmax import \
    npu_moe_gating_top_k_softmax
from msprobe.pytorch.bench_functions.rms_norm import npu_rms_norm
from msprobe.pytorch.bench_functions.rotary_mul import npu_rotary_mul
from msprobe.pytorch.bench_functions.swiglu import npu_swiglu

BF16, F32 = torch.bfloat16, torch.float32


class Dump:
    def __init__(self, folder):
        self.dir = Path(folder) / "step0" / "rank0"
        (self.dir / "dump_tensor_data").mkdir(parents=True, exist_ok=True)
        self.data = {}

    def _enc(self, name, value):
        if isinstance(value, torch.Tensor):
            torch.save(value.detach().clone(), self.dir / "dump_tensor_data" / f"{name}.pt")
            return {"type": "torch.Tensor", "dtype": str(value.dtype), "shape": list(value.shape),
                    "Max": 0.0, "Min": 0.0, "Mean": 0.0, "Norm": 0.0, "requires_grad": False,
                    "data_name": f"{name}.pt"}
        if isinstance(value, (list, tuple)):
            return [self._enc(f"{name}.{i}", v) for i, v in enumerate(value)]
        if value is None:
            return None
        return {"type": type(value).__name__, "value": value}

    def record(self, api, n, args, kwargs, outputs):
        rec = f"{api}.{n}.forward"
        self.data[rec] = {
            "input_args": [self._enc(f"{rec}.input.{i}", a) for i, a in enumerate(args)],
            "input_kwargs": {k: self._enc(f"{rec}.input.{k}", v) for k, v in kwargs.items()},
            "output": [self._enc(f"{rec}.output.{i}", o) for i, o in enumerate(outputs)]}

    def write(self):
        (self.dir / "dump.json").write_text(json.dumps(
            {"task": "tensor", "level": "L1", "framework": "pytorch",
             "dump_data_dir": "/npu-host/dump/step0/rank0/dump_tensor_data",
             "data": self.data}, indent=1))


def main():
    d = Dump(sys.argv[1])
    g = torch.Generator().manual_seed(7)
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731

    # npu_rms_norm(x, gamma, epsilon) -> (y, rstd)
    x, gamma = rn(4, 64).to(BF16), (1 + 0.1 * rn(64)).to(BF16)
    y, rstd = npu_rms_norm(x.float(), gamma.float(), epsilon=1e-6)
    d.record("NPU.npu_rms_norm", 0, [x, gamma], {"epsilon": 1e-6}, [y.to(BF16), rstd])
    y_bad, rstd_bad = npu_rms_norm(x.float(), torch.ones(64), epsilon=1e-6)  # gamma dropped
    d.record("NPU.npu_rms_norm", 1, [x, gamma], {"epsilon": 1e-6}, [y_bad.to(BF16), rstd_bad])

    # npu_swiglu(x, dim)
    x = rn(8, 96).to(BF16)
    d.record("NPU.npu_swiglu", 0, [x], {"dim": -1}, [npu_swiglu(x, dim=-1)])
    a, b = x.chunk(2, dim=-1)
    d.record("NPU.npu_swiglu", 1, [x], {"dim": -1},
             [npu_swiglu(torch.cat([b, a], -1), dim=-1)])  # halves swapped

    # npu_rotary_mul(x, r1, r2): x [B, S, N, D], tables [1, S, 1, D]
    s, dim = 8, 32
    inv = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[None, :, None, :].to(BF16), emb.sin()[None, :, None, :].to(BF16)
    x = rn(2, s, 4, dim).to(BF16)
    out = npu_rotary_mul(x.float(), cos.float(), sin.float()).to(BF16)
    d.record("NPU.npu_rotary_mul", 0, [x, cos, sin], {}, [out])
    d.record("NPU.npu_rotary_mul", 1, [x, cos, sin], {},
             [npu_rotary_mul(x.float(), cos.float(), -sin.float()).to(BF16)])  # sign flipped

    # npu_apply_adam_w(beta1_power, beta2_power, lr, wd, beta1, beta2, eps, grad,
    #                  max_grad_norm, amsgrad, maximize, out=(var, m, v)); step 3
    var, m, v = rn(16, 32), 0.01 * rn(16, 32), (0.001 * rn(16, 32)).abs()
    grad = 0.1 * rn(16, 32)
    args = [0.9 ** 2, 0.999 ** 2, 1e-3, 0.01, 0.9, 0.999, 1e-8, grad, None, False, False]
    outs = npu_apply_adam_w(*args, out=(var.clone(), m.clone(), v.clone()))
    d.record("NPU.npu_apply_adam_w", 0, args, {"out": [var, m, v]}, list(outs))
    bad = npu_apply_adam_w(*args[:6], 1e-1, *args[7:], out=(var.clone(), m.clone(), v.clone()))
    d.record("NPU.npu_apply_adam_w", 1, args, {"out": [var, m, v]}, list(bad))  # eps 1e-1

    # npu_moe_gating_top_k_softmax(x, finished, k) -> (y, expert_idx, row_idx)
    x = rn(8, 16).to(BF16)
    y, idx, row = npu_moe_gating_top_k_softmax(x, None, 2)
    d.record("NPU.npu_moe_gating_top_k_softmax", 0, [x, None], {"k": 2}, [y, idx, row])
    y2, idx2, row2 = npu_moe_gating_top_k_softmax(-x, None, 2)  # the smallest experts
    d.record("NPU.npu_moe_gating_top_k_softmax", 1, [x, None], {"k": 2}, [y2, idx2, row2])

    # npu_fusion_attention(q, k, v, head_num, input_layout, ..., scale): BSND, causal
    q, k, vv = (rn(1, 16, 2, 32).to(BF16) for _ in range(3))
    sc = 1 / math.sqrt(32)
    mask = torch.ones(16, 16, dtype=torch.bool).triu(1)
    o = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(1, 2), k.float().transpose(1, 2), vv.float().transpose(1, 2),
        is_causal=True, scale=sc).transpose(1, 2).to(BF16)
    kw = {"atten_mask": mask, "scale": sc, "sparse_mode": 0}
    stats = [torch.zeros(1, 2, 16, 8), torch.zeros(1, 2, 16, 8), torch.zeros(0)]
    d.record("NPU.npu_fusion_attention", 0, [q, k, vv, 2, "BSND"], kw, [o] + stats)
    o_bad = torch.nn.functional.scaled_dot_product_attention(  # the mask ignored
        q.float().transpose(1, 2), k.float().transpose(1, 2), vv.float().transpose(1, 2),
        scale=sc).transpose(1, 2).to(BF16)
    d.record("NPU.npu_fusion_attention", 1, [q, k, vv, 2, "BSND"], kw, [o_bad] + stats)
    d.write()


if __name__ == "__main__":
    main()
