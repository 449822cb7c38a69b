"""Bit-for-bit parity of the metrics pass across a rewrite of it.

    python benchmarks/parity_metrics.py save REF.pkl    # with the code before the change
    python benchmarks/parity_metrics.py check REF.pkl   # with the code after it

240 seeded pairs (fp32 / bf16 / fp16 / fp64 outputs; 1 to 9M elements, so several chunks
and partial blocks; NaN / Inf / zeros / subnormals / huge values; every heat-map measure;
with and without the error floor; widened tolerances) go through ``measure_all``; every
field of both metrics, both histograms and the heat map is kept, and of the floor kept
with the golden (``output_floor``: its metrics and histogram, allclose at the pair's
scale). ``check`` prints each pair that differs in any field (compared as IEEE bits, NaN
equal to NaN) and exits 1 on any.
"""
from __future__ import annotations

import math
import pickle
import sys

import numpy as np
import torch

from verify.comparator import metrics
from verify.comparator.comparison import output_floor

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SHAPES = ((1,), (7,), (65535,), (65537,), (3, 1000), (257, 1021), (2048, 2049),
          (1 << 22, 1), (1, (1 << 22) + 3), (3, 3000000))


def _pair(k: int):
    gen = torch.Generator().manual_seed(k)
    dtype = DTYPES[k % len(DTYPES)]
    shape = SHAPES[(k // len(DTYPES)) % len(SHAPES)]
    if math.prod(shape) > (1 << 20) and k % 3:  # the big shapes a third of the time
        shape = SHAPES[k % 7]
    scale = 10.0 ** ((k % 13) - 6)
    g = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    if k % 5 == 1:
        g += 1e3 * scale  # ill-conditioned: a large mean
    a = g.to(dtype)
    noise = torch.randn(shape, generator=gen, dtype=torch.float64)
    a = (a.to(torch.float64) * (1 + noise * 10.0 ** -(k % 7 + 1))).to(dtype)
    flat_a, flat_g = a.reshape(-1), g.reshape(-1)
    n = flat_a.numel()
    idx = torch.randint(0, n, (max(1, n // 97),), generator=gen)
    kind = k % 11
    if kind == 1:
        flat_a[idx] = float("nan")
    elif kind == 2:
        flat_g[idx] = float("inf")
        flat_a[idx[: len(idx) // 2]] = float("inf")
    elif kind == 3:
        flat_g[idx] = 0.0
    elif kind == 4:
        flat_g[idx] = 1e-42
        flat_a[idx] = 0.0
    elif kind == 5:
        flat_g[idx] = 3e38 if dtype != torch.float64 else 1e300
    elif kind == 6:
        flat_a[idx] = -flat_a[idx]
    elif kind == 7:
        flat_g[idx] = float("nan")
        flat_a[idx] = float("nan")
    heat = (None, "rel", "tol")[k % 3]
    return a, g, dict(floor=k % 4 != 3, scale=(1.0, 4.0)[k % 2], heat=heat, hist=k % 8 != 7)


def _bits(x):
    """A hashable, bit-exact form of a result (floats by their IEEE bits)."""
    if isinstance(x, float):
        return ("f", "nan" if math.isnan(x) else np.float64(x).view(np.int64).item())
    if isinstance(x, dict):
        return tuple(sorted((k, _bits(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_bits(v) for v in x)
    if hasattr(x, "_asdict"):
        return _bits(x._asdict())
    if hasattr(x, "__dataclass_fields__"):
        return _bits({f: getattr(x, f) for f in x.__dataclass_fields__})
    return x


def _fields_apart(got, ref) -> list[str]:
    """The fields of one pair's result that differ, as part.field (metrics, floor,
    histogram, heatmap)."""
    out = []
    for part, x, y in zip(("metrics", "floor", "histogram", "heatmap", "output_floor"), got,
                          ref):
        if x == y:
            continue
        if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y) \
                and all(isinstance(v, tuple) and len(v) == 2 for v in x + y):
            out += [f"{part}.{u[0]}" for u, v in zip(x, y) if u != v]
        else:
            out.append(part)
    return out


def results() -> list:
    out = []
    for k in range(240):
        a, g, kw = _pair(k)
        kept = output_floor(g, a.dtype, {"name": "allclose", "scale": kw["scale"]},
                            plots=kw["hist"])
        out.append(_bits(metrics.measure_all(a, g, **kw))
                   + (_bits((kept.metrics, kept.histogram)) if kept else None,))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("save", "check"):
        print(__doc__)
        return 2
    got = results()
    if argv[1] == "save":
        with open(argv[2], "wb") as f:
            pickle.dump(got, f)
        print(f"saved {len(got)} results to {argv[2]}")
        return 0
    with open(argv[2], "rb") as f:
        ref = pickle.load(f)
    bad = [k for k, (x, y) in enumerate(zip(got, ref)) if x != y]
    for k in bad:
        print(f"pair {k} differs: {_pair(k)[2]}: {', '.join(_fields_apart(got[k], ref[k]))}")
    print(f"{len(got) - len(bad)}/{len(got)} pairs equal to the last bit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
