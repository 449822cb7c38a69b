"""Deterministic inputs: the same case gives bitwise the same tensors on any machine.

Values are drawn in float64 by NumPy's PCG64 generator (a stream fixed by the seed, not by
the machine, thread count or torch build), seeded from a SHA-256 of (case seed, input name,
step), then rounded once to the working dtype on the CPU. Kernels get these tensors moved
to their device; the golden gets the very same values upcast to float64.
"""
from __future__ import annotations

import hashlib
from typing import Mapping

import numpy as np
import torch
from blake3 import blake3

SPECIAL_VALUES = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}


def derive_seed(seed: int, name: str, step: int = 0) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _value(v, dtype: torch.dtype) -> float:
    """A scalar from a case file: a number, 'nan', 'inf', '-inf', 'tiny', 'huge', 'max'."""
    if isinstance(v, str):
        if v in SPECIAL_VALUES:
            return SPECIAL_VALUES[v]
        info = torch.finfo(dtype)
        named = {"tiny": info.tiny, "-tiny": -info.tiny, "max": info.max, "-max": -info.max,
                 "huge": info.max / 2, "-huge": -info.max / 2, "eps": info.eps}
        return named[v]
    return float(v)


def _signs(rng, shape):
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def draw(dist: Mapping, shape: tuple[int, ...], dtype: torch.dtype,
         rng: np.random.Generator) -> np.ndarray:
    """float64 values for one input; ``dtype`` only sets the range of named extremes."""
    kind = dist["dist"]
    fdtype = dtype if dtype.is_floating_point else torch.float32
    if kind == "normal":
        out = rng.normal(float(dist.get("mean", 0.0)), float(dist.get("std", 1.0)), shape)
    elif kind == "uniform":
        out = rng.uniform(float(dist.get("low", -1.0)), float(dist.get("high", 1.0)), shape)
    elif kind == "randint":
        out = rng.integers(int(dist.get("low", 0)), int(dist.get("high", 10)), shape)
        out = out.astype(np.float64)
    elif kind == "constant":
        out = np.full(shape, _value(dist["value"], fdtype))
    elif kind == "zeros":
        out = np.zeros(shape)
    elif kind == "ones":
        out = np.ones(shape)
    elif kind == "tiny":  # just above the smallest normal of the working dtype
        out = torch.finfo(fdtype).tiny * rng.uniform(1.0, 4.0, shape) * _signs(rng, shape)
    elif kind == "subnormal":
        info = torch.finfo(fdtype)
        out = info.tiny * rng.uniform(0.0, 1.0, shape) * _signs(rng, shape)
    elif kind == "huge":
        info = torch.finfo(fdtype)
        out = info.max * rng.uniform(0.25, 0.5, shape) * _signs(rng, shape)
    elif kind == "nan":
        out = np.full(shape, np.nan)
    elif kind == "inf":
        out = np.inf * _signs(rng, shape)
    elif kind == "given":  # explicit values (cu_seqlens offsets, say)
        out = np.asarray([_value(v, fdtype) for v in dist["values"]], dtype=np.float64)
        out = out.reshape(shape)
    elif kind == "permutation":  # a random order of 0..n-1 along the last axis
        n = shape[-1] if shape else 1
        rows = max(1, int(np.prod(shape[:-1]))) if shape else 1
        out = np.stack([rng.permutation(n) for _ in range(rows)]).reshape(shape)
    elif kind == "partition":  # shape[-1] non-negative sizes summing to 'total'
        total, n = int(dist["total"]), shape[-1] if shape else 1
        cuts = np.sort(rng.integers(0, total + 1, n - 1)) if n > 1 else np.empty(0)
        out = np.diff(np.concatenate([[0], cuts, [total]])).reshape(shape)
    elif kind == "special":
        out = draw(dist.get("base", {"dist": "normal"}), shape, dtype, rng)
        values = [_value(v, fdtype) for v in dist.get("values", ["nan", "inf", "-inf"])]
        pick = rng.random(shape) < float(dist.get("fraction", 0.01))
        choice = rng.integers(0, len(values), shape)
        out = np.where(pick, np.asarray(values)[choice], out)
    else:
        raise ValueError(f"unknown distribution '{kind}'")
    out = np.asarray(out, dtype=np.float64)
    if dist.get("abs"):
        out = np.abs(out)
    if "scale" in dist:
        out = out * float(dist["scale"])
    return out


def resolve_dims(dist: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> Mapping:
    """A bound written as '<input>.<axis>' (ids below the rows of an embedding table)
    becomes that input's size along that axis."""
    out = dict(dist)
    for key in ("low", "high", "total"):
        v = out.get(key)
        if isinstance(v, str) and "." in v:
            other, axis = v.rsplit(".", 1)
            out[key] = shapes[other][int(axis)]
    if isinstance(out.get("base"), Mapping):  # a 'special' mix over a base distribution
        out["base"] = resolve_dims(out["base"], shapes)
    return out


def make_input(name: str, dist: Mapping, shape: tuple[int, ...], dtype: torch.dtype,
               seed: int, step: int = 0) -> torch.Tensor:
    rng = np.random.Generator(np.random.PCG64(derive_seed(seed, name, step)))
    values = draw(dist, tuple(shape), dtype, rng)
    return torch.from_numpy(values).to(dtype)


def make_inputs(case, step: int = 0, names=None) -> dict[str, torch.Tensor | None]:
    """All inputs of a case (or only ``names``) at a given step, on the CPU; an optional
    input the case leaves out ({"dist": "none"}) is None."""
    out = {}
    for name in names if names is not None else case.input_shapes:
        if case.dists[name]["dist"] == "none":
            out[name] = None
            continue
        dist = resolve_dims(case.dists[name], case.input_shapes)
        out[name] = make_input(name, dist, case.input_shapes[name],
                               case.input_dtypes[name], case.seed, step)
    return out


UPSTREAM_DIST = {"dist": "normal", "mean": 0.0, "std": 1.0}


def make_upstream(case, outputs: Mapping[str, tuple[tuple[int, ...], torch.dtype]]
                  ) -> dict[str, torch.Tensor]:
    """The upstream gradient of each output of a backward case, ``grad_<output>``: seeded
    like the inputs (by the case seed and the name), standard normal unless the case
    gives a distribution under that name, in the output's dtype."""
    out = {}
    for name, (shape, dtype) in outputs.items():
        key = f"grad_{name}"
        dist = case.dists.get(key, UPSTREAM_DIST)
        out[key] = make_input(key, dist, shape, dtype, case.seed)
    return out


def fingerprint(tensors: Mapping[str, torch.Tensor]) -> str:
    """BLAKE3 over names, dtypes, shapes and bytes: equal on every machine for a case."""
    h = blake3(max_threads=blake3.AUTO)
    for name in sorted(tensors):
        if tensors[name] is None:
            h.update(f"{name}|None|".encode())
            continue
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()[:16]
