"""float64 goldens of the Gated DeltaNet family (ops.md section C, seed 003):
chunk_gated_delta_rule and its chunked sub-steps as ops of their own.

The golden of the whole op is the plain token-by-token recurrence, not the chunked
algorithm the kernels use, so a kernel is checked against the math and not against a
copy of its own structure. The sub-steps' goldens are their definitions per chunk.
Public reference for details the documents leave open: flash-linear-attention
(fla.ops.gated_delta_rule and fla.ops.utils), which the MindSpeed ops port.
"""
from __future__ import annotations

import torch

from verify.goldens.fused_training import FLOATS, MIXED, NONE
from verify.golden.compute_floor import working
from verify.specs.registry import Gradients, InputSpec, OutputSpec, declare_op

SOLVE_TRIL_BLOCKS = (16, 32, 64)


# -- shared helpers (used by the kernels too: segmentation is data layout, not math) ----
def check_cu_seqlens(op: str, batch: int, total: int, cu_seqlens) -> None:
    if cu_seqlens is None:
        return
    if batch != 1:
        raise ValueError(f"{op}: cu_seqlens needs batch size 1, got batch {batch}")
    offs = [int(v) for v in cu_seqlens.reshape(-1).tolist()]
    if len(offs) < 2 or offs[0] != 0 or offs[-1] != total \
            or any(b < a for a, b in zip(offs, offs[1:])):
        raise ValueError(f"{op}: cu_seqlens must rise from 0 to T = {total}, got {offs}")


def segments(batch: int, total: int, cu_seqlens) -> list[tuple[int, int, int]]:
    """(batch index, start, end) of every sequence: whole rows, or cu_seqlens' pieces. An
    empty sequence (equal offsets) is a sequence too: it has no tokens and its own final
    state (its initial one, zeros), as flash-linear-attention gives it."""
    if cu_seqlens is None:
        return [(b, 0, total) for b in range(batch)]
    offs = [int(v) for v in cu_seqlens.reshape(-1).tolist()]
    return [(0, a, b) for a, b in zip(offs, offs[1:])]


def chunks(start: int, end: int, size: int) -> list[tuple[int, int]]:
    """Chunks of a sequence, counted from the sequence's own start."""
    return [(s, min(s + size, end)) for s in range(start, end, size)]


def _check_power_of_two(op: str, chunk_size: int) -> None:
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"{op}: chunk_size must be a power of 2, got {chunk_size}")


# -- chunk_local_cumsum ------------------------------------------------------------------
def check_cumsum(g, cu_seqlens=None, chunk_size=64, **_):
    op = "chunk_local_cumsum"
    _check_power_of_two(op, chunk_size)
    if g.dim() not in (3, 4):
        raise ValueError(f"{op}: g must be [B, T, H] or [B, T, H, K], got {list(g.shape)}")
    check_cu_seqlens(op, g.shape[0], g.shape[1], cu_seqlens)


def _out_dtype(working: str, params: dict) -> str:
    return params.get("output_dtype") or working


@declare_op(
    "chunk_local_cumsum",
    inputs=[InputSpec("g", dist={"dist": "uniform", "low": -1.0, "high": 0.0}),
            InputSpec("cu_seqlens", "int32", shape=lambda m: (2,), dist=NONE, optional=True)],
    params=dict(chunk_size=64, reverse=False, scale=None, output_dtype="fp32"),
    outputs=[OutputSpec("out", _out_dtype)],
    dtypes=FLOATS,
    standard=MIXED,
    validate=check_cumsum,
    ranks=(3, 4),
    grads=Gradients(wrt=("g",)),
    description="Cumulative sum of g along T inside each chunk of chunk_size (chunks "
                "restart at every cu_seqlens boundary), suffix sums when reverse, times "
                "scale; output fp32 by default (output_dtype null: g's dtype).",
)
def chunk_local_cumsum(g, cu_seqlens, *, chunk_size, reverse, scale, output_dtype):
    """fla.ops.utils.cumsum.chunk_local_cumsum semantics: chunk boundaries are counted
    from each sequence's start; the 4-D form sums every K channel on its own."""
    check_cumsum(g, cu_seqlens, chunk_size)
    parts = []
    for b, start, end in segments(g.shape[0], g.shape[1], cu_seqlens):
        for s, e in chunks(start, end, chunk_size):
            piece = g[b, s:e]
            c = piece.flip(0).cumsum(0).flip(0) if reverse else piece.cumsum(0)
            parts.append((b, s, e, c))
    out = assemble(g, parts)
    return (out * scale if scale is not None else out,)


def assemble(like: torch.Tensor, parts) -> torch.Tensor:
    """A tensor shaped like ``like`` from (batch, start, end, piece) blocks along T, built
    with cat (no in-place writes, so autograd sees every piece)."""
    rows = []
    for b in range(like.shape[0]):
        mine = sorted((s, e, c) for bb, s, e, c in parts if bb == b)
        pieces, at = [], 0
        for s, e, c in mine:
            if s > at:
                pieces.append(torch.zeros_like(like[b, at:s]))
            pieces.append(c)
            at = e
        if at < like.shape[1]:
            pieces.append(torch.zeros_like(like[b, at:]))
        rows.append(torch.cat(pieces, 0) if pieces else torch.zeros_like(like[b]))
    return torch.stack(rows, 0)


# -- chunk_scaled_dot_kkt ----------------------------------------------------------------
def _bth(main):
    return tuple(main[:3])


def check_kkt(k, g=None, beta=None, cu_seqlens=None, chunk_size=64, **_):
    op = "chunk_scaled_dot_kkt"
    _check_power_of_two(op, chunk_size)
    if k.dim() != 4:
        raise ValueError(f"{op}: k must be [B, T, H, K], got {list(k.shape)}")
    for name, t in (("g", g), ("beta", beta)):
        if t is not None and tuple(t.shape) != tuple(k.shape[:3]):
            raise ValueError(f"{op}: {name} must be [B, T, H] = {list(k.shape[:3])}, got "
                             f"{list(t.shape)}")
    check_cu_seqlens(op, k.shape[0], k.shape[1], cu_seqlens)


def kkt_block(k, g, beta):
    """A of one chunk ([L, H, K] keys): A[i, h, j] = beta_i (k_i . k_j) exp(g_i - g_j)
    for j < i, else 0; returned as [L, H, L]."""
    length = k.shape[0]
    a = torch.einsum("ihk,jhk->ihj", k, k) * beta[:, :, None]
    if g is not None:
        diff = g[:, :, None] - g.transpose(0, 1)[None, :, :]  # [i, h, j]
        lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=k.device), -1)
        a = a * torch.exp(torch.where(lower[:, None, :], diff, torch.zeros_like(diff)))
    strict = torch.tril(torch.ones(length, length, dtype=a.dtype, device=k.device), -1)
    return a * strict[:, None, :]


def pad_cols(block: torch.Tensor, width: int) -> torch.Tensor:
    short = width - block.shape[-1]
    return block if short == 0 else torch.cat(
        [block, torch.zeros(*block.shape[:-1], short, dtype=block.dtype)], -1)


# The sub-steps get what the steps before them produce: g is chunk_local_cumsum's
# output (per-token log decays summed within a chunk, so non-increasing there; kernels may
# clamp exp(g_i - g_j) at 1), A is solve_tril's (unit lower triangular per chunk).
CHUNK_GATES = {"dist": "chunk_cumsum", "low": -0.1, "high": 0.0, "segments": "cu_seqlens"}


@declare_op(
    "chunk_scaled_dot_kkt",
    inputs=[InputSpec("k", dist={"dist": "normal", "std": 0.1}),
            InputSpec("g", "fp32", shape=_bth, dist=CHUNK_GATES, optional=True),
            InputSpec("beta", shape=_bth, dist={"dist": "uniform", "low": 0.0, "high": 1.0}),
            InputSpec("cu_seqlens", "int64", shape=lambda m: (2,), dist=NONE, optional=True)],
    params=dict(chunk_size=64),
    outputs=[OutputSpec("A", "fp32")],
    dtypes=FLOATS,
    standard=MIXED,
    validate=check_kkt,
    ranks=(4, 4),
    grads=Gradients(wrt=("k", "g", "beta")),
    description="Per chunk, A = beta * K K^T * exp(g_i - g_j), strictly lower triangular: "
                "[B, T, H, BT] with BT = chunk_size (step 2 of the gated delta rule).",
)
def chunk_scaled_dot_kkt(k, g, beta, cu_seqlens, *, chunk_size):
    """fla chunk_scaled_dot_kkt_fwd: g is the chunk-local cumsum of the log gates; the
    row t of a chunk holds its scores against the chunk's earlier keys."""
    check_kkt(k, g, beta, cu_seqlens, chunk_size)
    parts = []
    for b, start, end in segments(k.shape[0], k.shape[1], cu_seqlens):
        for s, e in chunks(start, end, chunk_size):
            blk = kkt_block(k[b, s:e], None if g is None else g[b, s:e], beta[b, s:e])
            parts.append((b, s, e, pad_cols(blk, chunk_size)))
    like = torch.zeros(*k.shape[:3], chunk_size, dtype=k.dtype)
    return (assemble(like, parts),)


# -- solve_tril --------------------------------------------------------------------------
def check_solve_tril(A, cu_seqlens=None, **_):
    op = "solve_tril"
    if A.dim() != 4:
        raise ValueError(f"{op}: A must be [B, T, H, BT], got {list(A.shape)}")
    if A.shape[-1] not in SOLVE_TRIL_BLOCKS:
        raise ValueError(f"{op}: block size BT must be one of {SOLVE_TRIL_BLOCKS}, got "
                         f"{A.shape[-1]}")
    check_cu_seqlens(op, A.shape[0], A.shape[1], cu_seqlens)


def tril_block(A, s, e, b):
    """The strictly lower part of chunk [s, e) of A as [H, L, L]."""
    length = e - s
    blk = A[b, s:e, :, :length].permute(1, 0, 2)
    return torch.tril(blk, -1)


@declare_op(
    "solve_tril",
    # the contract of real callers: A is chunk_scaled_dot_kkt's output, strictly lower
    # triangular per chunk (fla documents it so); a random upper part is an explicit
    # adversarial case of its own (test_cases/solve_tril.json, "upper-part")
    inputs=[InputSpec("A", dist={"dist": "chunk_tril", "std": 0.1, "diag": 0.0,
                                 "segments": "cu_seqlens"}),
            InputSpec("cu_seqlens", "int64", shape=lambda m: (2,), dist=NONE, optional=True)],
    params={},
    outputs=[OutputSpec("Ai", "fp32")],
    dtypes=["fp32"],
    standard=MIXED,
    validate=check_solve_tril,
    ranks=(4, 4),
    # the shape rule the hunt cannot guess: the last dim is the block size BT
    hunt={"last_dim": list(SOLVE_TRIL_BLOCKS)},
    grads=Gradients(wrt=("A",)),
    description="(I + A)^-1 per chunk for the strictly lower triangular A of "
                "chunk_scaled_dot_kkt; BT = 16, 32 or 64 (step 3).",
)
def solve_tril(A, cu_seqlens):
    """fla.ops.utils.solve_tril: fla documents A as strictly lower triangular per chunk
    (what chunk_scaled_dot_kkt returns); its kernels do not all mask the rest (the 16-wide
    one does, the merging 32- and 64-wide ones read the upper part), so the golden inverts
    I + the strictly lower triangle, which is the whole of a valid A. A final chunk
    shorter than BT is inverted at its own size, the columns past it stay 0."""
    check_solve_tril(A, cu_seqlens)
    bt = A.shape[-1]
    parts = []
    for b, start, end in segments(A.shape[0], A.shape[1], cu_seqlens):
        for s, e in chunks(start, end, bt):
            m = tril_block(A, s, e, b)
            eye = torch.eye(e - s, dtype=A.dtype).expand_as(m)
            inv = torch.linalg.inv(eye + m).permute(1, 0, 2)  # [L, H, L]
            parts.append((b, s, e, pad_cols(inv, bt)))
    return (assemble(torch.zeros_like(A), parts),)


# -- recompute_w_u -----------------------------------------------------------------------
def check_recompute(k, v, beta, A, g=None, cu_seqlens=None, **_):
    op = "recompute_w_u"
    if k.dim() != 4 or v.dim() != 4 or tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(f"{op}: k [B, T, H, K] and v [B, T, H, V] must share B, T, H; got "
                         f"{list(k.shape)} and {list(v.shape)}")
    if tuple(A.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(f"{op}: A must be [B, T, H, BT], got {list(A.shape)}")
    for name, t in (("beta", beta), ("g", g)):
        if t is not None and tuple(t.shape) != tuple(k.shape[:3]):
            raise ValueError(f"{op}: {name} must be [B, T, H], got {list(t.shape)}")
    check_cu_seqlens(op, k.shape[0], k.shape[1], cu_seqlens)


def _a_of(main):
    return tuple(main[:3]) + (64,)


@declare_op(
    "recompute_w_u",
    inputs=[InputSpec("k", dist={"dist": "normal", "std": 0.1}), InputSpec("v"),
            InputSpec("beta", shape=_bth, dist={"dist": "uniform", "low": 0.0, "high": 1.0}),
            # A in the working dtype, as fla's pipeline hands solve_tril's output over
            InputSpec("A", shape=_a_of, dist={"dist": "chunk_tril", "std": 0.1,
                                              "segments": "cu_seqlens"}),
            InputSpec("g", "fp32", shape=_bth, dist={**CHUNK_GATES, "chunk": "A.3"},
                      optional=True),
            InputSpec("cu_seqlens", "int64", shape=lambda m: (2,), dist=NONE, optional=True)],
    params={},
    outputs=[OutputSpec("w"), OutputSpec("u")],
    dtypes=FLOATS,
    standard=MIXED,
    validate=check_recompute,
    ranks=(4, 4),
    grads=Gradients(wrt=("k", "v", "beta", "A", "g")),
    description="WY representation per chunk: w = A @ (k * beta * exp(g)), u = A @ (v * "
                "beta), A the [B, T, H, BT] output of solve_tril (step 4).",
)
def recompute_w_u(k, v, beta, A, g, cu_seqlens):
    """fla recompute_w_u_fwd: A's row t of a chunk multiplies the chunk's rows; without g
    the keys are not gated."""
    check_recompute(k, v, beta, A, g, cu_seqlens)
    bt = A.shape[-1]
    w_parts, u_parts = [], []
    for b, start, end in segments(k.shape[0], k.shape[1], cu_seqlens):
        for s, e in chunks(start, end, bt):
            a = A[b, s:e, :, :e - s]  # [L(i), H, L(j)]
            bb = beta[b, s:e][..., None]
            kk = k[b, s:e] * bb
            if g is not None:
                kk = kk * torch.exp(g[b, s:e])[..., None]
            w_parts.append((b, s, e, torch.einsum("ihj,jhk->ihk", a, kk)))
            u_parts.append((b, s, e, torch.einsum("ihj,jhv->ihv", a, v[b, s:e] * bb)))
    return assemble(k, w_parts), assemble(v, u_parts)


# -- chunk_gated_delta_rule ----------------------------------------------------------------
def check_gated_delta(q, k, v, g, beta, initial_state=None, cu_seqlens=None,
                      chunk_size=64, **_):
    op = "chunk_gated_delta_rule"
    if chunk_size not in SOLVE_TRIL_BLOCKS:
        raise ValueError(f"{op}: chunk_size must be one of {SOLVE_TRIL_BLOCKS} (solve_tril's "
                         f"block sizes), got {chunk_size}")
    if q.dim() != 4 or tuple(q.shape) != tuple(k.shape):
        raise ValueError(f"{op}: q and k must be [B, T, H, K] alike, got {list(q.shape)} and "
                         f"{list(k.shape)}")
    if v.dim() != 4 or tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(f"{op}: v must be [B, T, H, V], got {list(v.shape)}")
    if beta.dim() != 3 or tuple(beta.shape) != tuple(k.shape[:3]):
        raise ValueError(f"{op}: beta must be a 3-D [B, T, H] tensor, got {list(beta.shape)}")
    if tuple(g.shape) != tuple(k.shape[:3]):
        raise ValueError(f"{op}: g must be [B, T, H], got {list(g.shape)}")
    check_cu_seqlens(op, q.shape[0], q.shape[1], cu_seqlens)
    if cu_seqlens is not None and initial_state is not None:
        raise ValueError(f"{op}: with cu_seqlens, initial_state must be None")
    n = q.shape[0]
    want = (n, k.shape[2], k.shape[3], v.shape[3])
    if initial_state is not None and tuple(initial_state.shape) != want:
        raise ValueError(f"{op}: initial_state must be [N, H, K, V] = {list(want)}, got "
                         f"{list(initial_state.shape)}")


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's l2norm: x / sqrt(sum(x^2) + eps) over the head dim."""
    return x * torch.rsqrt(x.square().sum(dim=-1, keepdim=True) + eps)


# The contract of real callers, which the hunt keeps to. beta is a sigmoid's output in
# [0, 1] and g a log decay <= 0: scaled or moved they leave it. k's norm with beta sets
# the recurrence's stability (|1 - beta |k|^2| <= 1 keeps the state bounded), so k keeps
# its declared spread: scaled, the true state explodes and no kernel computes it. q and v
# enter linearly and are searched. Head dims are the usual ones and their neighbours, from
# 16 (the state is [H, K, V] per token; the kernels' matrix units take 16 at least: fla's
# Triton kernels tile K with tl.dot), and the token-by-token float64 golden keeps its
# autograd graph per token: at 2^18 elements 100 candidates took 16-28 s and under 0.9 GB
# here (at 2^21 and any head dim, 8 took 193 s and 23.8 GB). Values
# at half of fp32's largest (the 'extreme' family) are left out: a chunked kernel sums a
# chunk's terms before they decay, so its intermediates overflow where the token-by-token
# recurrence's do not, and no fp32 kernel of the chunked algorithm computes them.
GATED_DELTA_HUNT = {"inputs": ["q", "v"],
                    "families": ["plain", "heavy", "outliers", "peaked", "zeros",
                                 "subnormal"],
                    "last_dim": [16, 17, 31, 32, 33, 63, 64, 65, 127, 128],
                    "max_elements": 1 << 18}


def _state_shape(main):
    return (main[0], main[2], main[3], main[3])


def _gated_delta_as_kernels_compute_it(q, k, v, g, beta, initial_state, cu_seqlens, *,
                                       scale, output_final_state, use_qk_l2norm_in_kernel,
                                       chunk_size):
    """The compute-precision floor: the recurrence with each token's decay taken from g's
    chunk-local cumsum (gc_t - gc_t-1), as chunked kernels take theirs (exp(gc_i - gc_j)):
    its g carries the cumsum's rounding, and grad_g comes back through a reverse cumsum.
    At a sequence's first token, where the exact gradient is 0 without an initial state,
    this leaves the fp32 rounding every chunked kernel leaves there (README "Hunting");
    the token-by-token recurrence on g itself gives exactly 0."""
    gc = chunk_local_cumsum(g, cu_seqlens, chunk_size=chunk_size, reverse=False, scale=None,
                            output_dtype=None)[0]
    steps = []
    for b, start, end in segments(g.shape[0], g.shape[1], cu_seqlens):
        for s, e in chunks(start, end, chunk_size):
            c = gc[b, s:e]
            steps.append((b, s, e, c - torch.cat([torch.zeros_like(c[:1]), c[:-1]], 0)))
    return chunk_gated_delta_rule(q, k, v, assemble(g, steps), beta, initial_state,
                                  cu_seqlens, scale=scale,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                  chunk_size=chunk_size)


@declare_op(
    "chunk_gated_delta_rule",
    inputs=[InputSpec("q", dist={"dist": "normal", "std": 0.1}),
            InputSpec("k", dist={"dist": "normal", "std": 0.1}),
            InputSpec("v"),
            InputSpec("g", shape=_bth, dist={"dist": "uniform", "low": -0.1, "high": 0.0}),
            InputSpec("beta", shape=_bth, dist={"dist": "uniform", "low": 0.0, "high": 1.0}),
            InputSpec("initial_state", "fp32", shape=_state_shape, dist=NONE, optional=True),
            InputSpec("cu_seqlens", "int64", shape=lambda m: (2,), dist=NONE, optional=True)],
    params=dict(scale=None, output_final_state=True, use_qk_l2norm_in_kernel=False,
                chunk_size=64),
    outputs=[OutputSpec("o"),
             OutputSpec("final_state", "fp32", when=lambda p: bool(p["output_final_state"]))],
    dtypes=FLOATS,
    standard=MIXED,
    validate=check_gated_delta,
    ranks=(4, 4),
    hunt=GATED_DELTA_HUNT,
    grads=Gradients(wrt=("q", "k", "v", "g", "beta", "initial_state")),
    compute_floor=_gated_delta_as_kernels_compute_it,
    description="Gated delta rule: per token S <- exp(g_t) S; u = beta_t (v_t - S^T k_t); "
                "S <- S + k_t u^T; o_t = scale S^T q_t. Returns o [B, T, H, V] and the "
                "final state [N, H, K, V] (fp32).",
)
def chunk_gated_delta_rule(q, k, v, g, beta, initial_state, cu_seqlens, *, scale,
                           output_final_state, use_qk_l2norm_in_kernel, chunk_size):
    """The golden is fla's naive recurrent gated delta rule, token by token in float64:
    no chunks, no WY representation, no exp clamp (the kernels' [-9, 0] clamp is an
    approximation the harness measures). scale defaults to K^-0.5; with
    use_qk_l2norm_in_kernel q and k are L2-normalised first (eps 1e-6)."""
    check_gated_delta(q, k, v, g, beta, initial_state, cu_seqlens, chunk_size)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    seqs = segments(q.shape[0], q.shape[1], cu_seqlens)
    if cu_seqlens is None:  # all rows at once: state [B, H, K, V]
        s0 = (torch.zeros(*k.shape[:1], k.shape[2], k.shape[3], v.shape[3], dtype=q.dtype)
              if initial_state is None else initial_state)
        o, final = _recurrence(q, k, v, g, beta, s0, scale)
    else:
        outs, finals = [], []
        for _, start, end in seqs:
            s0 = torch.zeros(1, k.shape[2], k.shape[3], v.shape[3], dtype=q.dtype)
            o_seq, f_seq = _recurrence(*(t[:, start:end] for t in (q, k, v, g, beta)), s0, scale)
            outs.append(o_seq)
            finals.append(f_seq)
        o, final = torch.cat(outs, 1), torch.cat(finals, 0)
    return (o, final) if output_final_state else (o,)


def _recurrence(q, k, v, g, beta, state, scale):
    """Token-by-token recurrence over T for rows [B, T, H, *]; state [B, H, K, V]."""
    outs = []
    for t in range(q.shape[1]):
        state = state * torch.exp(g[:, t])[:, :, None, None]
        kt, vt = k[:, t], v[:, t]
        # a real kernel stores this correction (v_new) in the working dtype: the float64
        # golden keeps it exact, the compute-precision floor rounds it (README "Two floors")
        u = working(beta[:, t][..., None] * (vt - torch.einsum("bhk,bhkv->bhv", kt, state)))
        state = state + kt[..., :, None] * u[..., None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    if not outs:  # an empty sequence: no output rows, the state as it came
        return v.new_zeros(v.shape[0], 0, v.shape[2], v.shape[3]), state
    return torch.stack(outs, 1), state
