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
    """A scalar from a case file: a number, 'nan', 'inf', '-inf', 'tiny', 'huge', 'max',
    'subnormal' (a quarter of the smallest normal: below it, of the dtype named)."""
    if isinstance(v, str):
        if v in SPECIAL_VALUES:
            return SPECIAL_VALUES[v]
        info = torch.finfo(dtype)
        named = {"tiny": info.tiny, "-tiny": -info.tiny, "max": info.max, "-max": -info.max,
                 "huge": info.max / 2, "-huge": -info.max / 2, "eps": info.eps,
                 "subnormal": info.tiny / 4, "-subnormal": -info.tiny / 4}
        return named[v]
    return float(v)


def _signs(rng, shape):
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def _given(values, dtype) -> np.ndarray:
    """Explicit values, nested lists for several dims, each a number or a named value."""
    if isinstance(values, (list, tuple)):
        parts = [_given(v, dtype) for v in values]
        return np.stack(parts) if parts else np.empty(0)
    return np.asarray(_value(values, dtype), dtype=np.float64)


def given_shape(dist: Mapping) -> tuple[int, ...]:
    """The shape of explicit values: ``shape`` when given (the values are then flat or
    already of that shape), else the nesting of ``values``."""
    if "shape" in dist:
        return tuple(int(n) for n in dist["shape"])
    return tuple(np.shape(np.asarray(dist["values"], dtype=object)))


def rotary_table(shape: tuple[int, ...], part: str, theta: float = 10000.0,
                 layout: str = "rotate_half", offset: int = 0, scaling: str = "none",
                 factor: float = 1.0) -> np.ndarray:
    """cos or sin of rotary position embeddings, [..., S, D], as models build them:
    angle(p, i) = p * theta^(-2i/D) for positions p = offset.. and i < D/2, laid out as
    cat(f, f) (rotate_half: Hugging Face Llama) or repeat_interleave(f, 2) (interleaved:
    GPT-J). Scaled variants: 'linear' divides positions by ``factor`` (position
    interpolation); 'ntk' raises theta to theta * factor^(D / (D - 2)) (NTK-aware)."""
    seq, dim = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[-1] if shape else 0)
    if dim % 2:
        raise ValueError(f"rotary tables need an even last dim, got {dim}")
    if scaling == "ntk" and dim > 2:
        theta = theta * factor ** (dim / (dim - 2))
    inv_freq = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    pos = np.arange(offset, offset + seq, dtype=np.float64)
    if scaling == "linear":
        pos = pos / factor
    angles = np.outer(pos, inv_freq)
    emb = (np.repeat(angles, 2, axis=-1) if layout == "interleaved"
           else np.concatenate([angles, angles], axis=-1))
    table = np.cos(emb) if part == "cos" else np.sin(emb)
    return np.broadcast_to(table.reshape((seq, dim)[-len(shape):] if len(shape) < 2
                                         else (seq, dim)), shape).copy()


def draw(dist: Mapping, shape: tuple[int, ...], dtype: torch.dtype,
         rng: np.random.Generator, params: Mapping | None = None) -> np.ndarray:
    """float64 values for one input; ``dtype`` only sets the range of named extremes;
    ``params`` are the case's (a rotary table follows its ``layout``)."""
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
    elif kind == "given":  # explicit values (cu_seqlens offsets, a table), any shape
        out = _given(dist["values"], fdtype).reshape(shape)
    elif kind == "rotary":
        layout = dist.get("layout") or (params or {}).get("layout", "rotate_half")
        out = rotary_table(shape, dist["part"], float(dist.get("theta", 10000.0)), layout,
                           int(dist.get("offset", 0)), dist.get("scaling", "none"),
                           float(dist.get("factor", 1.0)))
    elif kind == "permutation":  # a random order of 0..n-1 along the last axis
        n = shape[-1] if shape else 1
        rows = max(1, int(np.prod(shape[:-1]))) if shape else 1
        out = np.stack([rng.permutation(n) for _ in range(rows)]).reshape(shape)
    elif kind == "partition":  # shape[-1] non-negative sizes summing to 'total'
        total, n = int(dist["total"]), shape[-1] if shape else 1
        cuts = np.sort(rng.integers(0, total + 1, n - 1)) if n > 1 else np.empty(0)
        out = np.diff(np.concatenate([[0], cuts, [total]])).reshape(shape)
    elif kind == "student_t":  # heavy tails: Student's t with 'df' degrees of freedom
        out = float(dist.get("mean", 0.0)) + float(dist.get("std", 1.0)) * \
            rng.standard_t(float(dist.get("df", 2.0)), shape)
    elif kind == "outliers":  # a 'fraction' of the base's values times 'factor'
        out = draw(dist.get("base", {"dist": "normal"}), shape, dtype, rng, params)
        pick = _picked(dist, shape, rng, 0.001)
        out = np.where(pick, out * float(dist.get("factor", 100.0)), out)
    elif kind == "peaked":  # one random entry per row raised by 'margin': confident logits
        out = rng.normal(float(dist.get("mean", 0.0)), float(dist.get("std", 1.0)), shape)
        if out.size:
            rows = out.reshape(-1, shape[-1])
            rows[np.arange(rows.shape[0]), rng.integers(0, shape[-1], rows.shape[0])] += \
                float(dist.get("margin", 10.0))
    elif kind == "chunk_cumsum":  # gates as chunk_local_cumsum leaves them: monotone
        out = _chunk_cumsum(rng, shape, dist, params)
    elif kind == "chunk_tril":  # solve_tril's output: unit lower triangular per chunk
        out = _chunk_tril(rng, shape, dist)
    elif kind == "doubly_stochastic":  # Sinkhorn's output: rows and columns sum to 1
        out = _doubly_stochastic(rng, shape, dist)
    elif kind == "special":
        out = draw(dist.get("base", {"dist": "normal"}), shape, dtype, rng, params)
        values = [_value(v, fdtype) for v in dist.get("values", ["nan", "inf", "-inf"])]
        pick = _picked(dist, shape, rng, 0.01)
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


def _picked(dist: Mapping, shape, rng, fraction: float) -> np.ndarray:
    """Which elements a sprinkled distribution changes: every ``every``-th element in
    order (0, every, 2 every, ...: the same places whatever the shape, so a shrunk case
    keeps them), else a random ``fraction`` of them."""
    if "every" in dist:
        n = int(np.prod(shape)) if shape else 1
        return (np.arange(n) % int(dist["every"]) == 0).reshape(shape)
    return rng.random(shape) < float(dist.get("fraction", fraction))


def _chunk_size(dist: Mapping, params: Mapping | None, default: int) -> int:
    size = dist.get("chunk", "chunk_size")
    if isinstance(size, str):  # a param of the case (chunk_size), else the default
        size = (params or {}).get(size, default)
    return max(1, int(size))


def _chunk_cumsum(rng, shape, dist, params) -> np.ndarray:
    """Per-token log decays in [low, high] (<= 0), summed within each chunk of the time
    axis (axis 1 of [B, T, H]): g is non-increasing inside a chunk, as fla's
    chunk_local_cumsum hands it to the chunked kernels, so exp(g_i - g_j) <= 1 for i >= j."""
    step = rng.uniform(float(dist.get("low", -0.1)), float(dist.get("high", 0.0)), shape)
    if len(shape) < 2 or not step.size:
        return step
    chunk = _chunk_size(dist, params, 64)
    t = shape[1]
    bounds = [int(b) for b in dist.get("_segments") or (0, t)]  # chunks restart per sequence
    out = np.empty_like(step)
    for seg_start, seg_end in zip(bounds[:-1], bounds[1:]):
        for start in range(seg_start, seg_end, chunk):
            end = min(start + chunk, seg_end)
            out[:, start:end] = np.cumsum(step[:, start:end], axis=1)
    return out


def _chunk_tril(rng, shape, dist) -> np.ndarray:
    """[B, T, H, BT]: row t holds row (t mod BT) of its chunk's matrix, unit lower
    triangular (strict lower part normal with std ``std``), as solve_tril returns
    (I + A)^-1."""
    out = rng.normal(0.0, float(dist.get("std", 0.1)), shape)
    if len(shape) != 4 or not out.size:
        return out
    bt = shape[-1]
    # a row's place in its chunk; chunks restart at every sequence ("segments": cu_seqlens)
    bounds = [int(b) for b in dist.get("_segments") or (0, shape[1])]
    pos = np.arange(shape[1])
    for a, b in zip(bounds, bounds[1:]):
        pos[a:b] = np.arange(b - a) % bt
    i = pos[:, None]
    j = np.arange(bt)[None, :]
    keep = (j < i)[None, :, None, :]
    diag = (j == i)[None, :, None, :]
    return np.where(keep, out, 0.0) + np.where(diag, float(dist.get("diag", 1.0)), 0.0)


def _doubly_stochastic(rng, shape, dist) -> np.ndarray:
    """[..., N, N] non-negative matrices whose rows and columns sum to 1 (Sinkhorn
    iterations on exp of normal logits, as mHC's h_res comes out of sinkhorn)."""
    out = np.exp(rng.normal(0.0, float(dist.get("std", 1.0)), shape))
    if len(shape) < 2 or not out.size:
        return out
    for _ in range(int(dist.get("iterations", 50))):
        out = out / out.sum(axis=-1, keepdims=True)
        out = out / out.sum(axis=-2, keepdims=True)
    return out


def resolve_dims(dist: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> Mapping:
    """A bound written as '<input>.<axis>' (ids below the rows of an embedding table)
    becomes that input's size along that axis."""
    out = dict(dist)
    for key in ("low", "high", "total", "chunk"):
        v = out.get(key)
        if isinstance(v, str) and "." in v:
            other, axis = v.rsplit(".", 1)
            out[key] = shapes[other][int(axis)]
    if isinstance(out.get("base"), Mapping):  # a 'special' mix over a base distribution
        out["base"] = resolve_dims(out["base"], shapes)
    return out


def make_input(name: str, dist: Mapping, shape: tuple[int, ...], dtype: torch.dtype,
               seed: int, step: int = 0, params: Mapping | None = None) -> torch.Tensor:
    rng = np.random.Generator(np.random.PCG64(derive_seed(seed, name, step)))
    values = draw(dist, tuple(shape), dtype, rng, params)
    # 0-d results of numpy ufuncs (abs of a scalar) are numpy scalars, not arrays
    return torch.from_numpy(np.asarray(values, dtype=np.float64).reshape(shape)).to(dtype)


def make_inputs(case, step: int = 0, names=None) -> dict[str, torch.Tensor | None]:
    """All inputs of a case (or only ``names``) at a given step, on the CPU; an optional
    input the case leaves out ({"dist": "none"}) is None. A recorded call's inputs are
    its tensors (verify/recorded.py)."""
    if getattr(case, "source", None) is not None:
        values = case.source.inputs(case)  # a recorded call (verify/cases/recorded.py)
        return {n: values[n] for n in (names if names is not None else case.input_shapes)}
    out = {}
    wanted = list(names if names is not None else case.input_shapes)
    # inputs derived from another input's values ({"dist": "argmax", "of": ...}) come last
    wanted.sort(key=lambda n: case.dists[n]["dist"] == "argmax")
    for name in wanted:
        if case.dists[name]["dist"] == "none":
            out[name] = None
            continue
        if case.dists[name]["dist"] == "argmax":  # labels of the confident class, say
            src = case.dists[name]["of"]
            values = out[src] if src in out else make_inputs(case, step, [src])[src]
            out[name] = values.double().argmax(dim=-1).reshape(
                case.input_shapes[name]).to(case.input_dtypes[name])
            continue
        dist = resolve_dims(case.dists[name], case.input_shapes)
        seg = dist.get("segments")
        if seg and case.dists.get(seg, {}).get("dist") not in (None, "none"):
            offsets = out[seg] if seg in out else make_inputs(case, step, [seg])[seg]
            dist = {**dist, "_segments": offsets.reshape(-1).tolist()}
        out[name] = make_input(name, dist, case.input_shapes[name],
                               case.input_dtypes[name], case.seed, step, case.params)
    return {n: out[n] for n in (names if names is not None else case.input_shapes)}


UPSTREAM_DIST = {"dist": "normal", "mean": 0.0, "std": 1.0}


def make_upstream(case, outputs: Mapping[str, tuple[tuple[int, ...], torch.dtype]]
                  ) -> dict[str, torch.Tensor]:
    """The upstream gradient of each output of a backward case, ``grad_<output>``: seeded
    like the inputs (by the case seed and the name), standard normal unless the case
    gives a distribution under that name, in the output's dtype. A recorded backward
    call's upstream is the one it got (verify/recorded.py)."""
    if getattr(case, "source", None) is not None and case.source.upstream is not None:
        given = case.source.upstream_of(case)
        return {f"grad_{n}": given[f"grad_{n}"].to(dtype) for n, (_, dtype) in outputs.items()
                if f"grad_{n}" in given}
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
