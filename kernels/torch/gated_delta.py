"""Working-precision torch kernels of the Gated DeltaNet family, in fp32: the chunked
algorithm of the MindSpeed / fla kernels (cumsum, KK^T, block inverse, WY
representation, state recurrence per chunk, output), differentiated by autograd.

chunk_gated_delta_rule clamps the exp argument of gate differences above at 0, which
is what keeps exp from overflowing. The document's kernel also clamps below at -9; that
lower bound changes results once a chunk's gates span more than 9 (the document's own
sample gates do), so it is a route of its own under ``verify strategies
chunk_gated_delta_rule``, where the harness measures what it costs.
"""
from __future__ import annotations

import torch

from verify.goldens import gated_delta as gold
from verify.comparator import dtypes as dt
from verify.specs.registry import kernel

F32 = torch.float32
EXP_CLAMP = (None, 0.0)      # overflow guard: g_i - g_j <= 0 below the diagonal
DOC_EXP_CLAMP = (-9.0, 0.0)  # the document's [-9, 0]


def _f(t):
    return None if t is None else t.to(F32)


# -- chunk_local_cumsum ------------------------------------------------------------------
def local_cumsum(g, cu_seqlens, chunk_size, reverse, bounds=gold.chunks):
    """Chunk-local (reverse) cumsum in fp32; ``bounds`` gives a sequence's chunks."""
    parts = []
    for b, start, end in gold.segments(g.shape[0], g.shape[1], cu_seqlens):
        for s, e in bounds(start, end, chunk_size):
            piece = g[b, s:e]
            c = piece.flip(0).cumsum(0).flip(0) if reverse else piece.cumsum(0)
            parts.append((b, s, e, c))
    return gold.assemble(g, parts)


def _cumsum_out_dtype(g, output_dtype):
    return g.dtype if output_dtype is None else dt.to_torch(output_dtype)


@kernel("chunk_local_cumsum")
def chunk_local_cumsum(g, cu_seqlens=None, *, chunk_size=64, reverse=False, scale=None,
                       output_dtype="fp32"):
    gold.check_cumsum(g, cu_seqlens, chunk_size)
    out = local_cumsum(g.to(F32), cu_seqlens, chunk_size, reverse)
    if scale is not None:
        out = out * scale
    return out.to(_cumsum_out_dtype(g, output_dtype))


# -- chunk_scaled_dot_kkt ----------------------------------------------------------------
def masked_decay(diff: torch.Tensor, lower: torch.Tensor, clamp=None) -> torch.Tensor:
    """exp(g_i - g_j) where ``lower`` holds, 0 elsewhere; the masked entries never reach
    exp (their differences can be large and positive). ``clamp`` bounds the argument."""
    arg = torch.where(lower, diff, torch.zeros_like(diff))
    if clamp is not None:
        arg = arg.clamp(*clamp)
    return torch.where(lower, torch.exp(arg), torch.zeros_like(arg))


def kkt_chunk(k, g, beta, decay=masked_decay):
    """[L, H, L] strictly lower beta_i (k_i . k_j) exp(g_i - g_j) of one chunk (fp32)."""
    length = k.shape[0]
    a = torch.einsum("ihk,jhk->ihj", k, k) * beta[:, :, None]
    strict = torch.tril(torch.ones(length, length, dtype=torch.bool, device=k.device), -1)
    mask = strict[:, None, :].expand_as(a)
    if g is None:
        return torch.where(mask, a, torch.zeros_like(a))
    diff = g[:, :, None] - g.transpose(0, 1)[None, :, :]
    return a * decay(diff, mask)


@kernel("chunk_scaled_dot_kkt")
def chunk_scaled_dot_kkt(k, g=None, beta=None, cu_seqlens=None, *, chunk_size=64):
    gold.check_kkt(k, g, beta, cu_seqlens, chunk_size)
    kf, gf, bf = k.to(F32), _f(g), beta.to(F32)
    parts = []
    for b, start, end in gold.segments(k.shape[0], k.shape[1], cu_seqlens):
        for s, e in gold.chunks(start, end, chunk_size):
            blk = kkt_chunk(kf[b, s:e], None if gf is None else gf[b, s:e], bf[b, s:e])
            parts.append((b, s, e, gold.pad_cols(blk, chunk_size)))
    return gold.assemble(torch.zeros(*k.shape[:3], chunk_size, dtype=F32, device=k.device), parts)


# -- solve_tril: 16x16 diagonal blocks inverted, then merged 32 -> 64 ----------------------
BASE = 16


def inverse_unit_lower(m: torch.Tensor, merge: bool = True) -> torch.Tensor:
    """(I + m)^-1 for strictly lower ``m`` [..., L, L] (fp32): invert the 16x16 diagonal
    blocks by triangular solves, then merge pairs of blocks level by level:
    [[A, 0], [C, D]]^-1 = [[A^-1, 0], [-D^-1 C A^-1, D^-1]]."""
    length = m.shape[-1]
    eye = torch.eye(length, dtype=m.dtype, device=m.device)
    full = eye + torch.tril(m, -1)
    blocks = []
    for s in range(0, length, BASE):
        e = min(s + BASE, length)
        blk = full[..., s:e, s:e]
        ident = torch.eye(e - s, dtype=m.dtype, device=m.device).expand_as(blk)
        blocks.append(torch.linalg.solve_triangular(blk, ident, upper=False,
                                                    unitriangular=True))
    starts = list(range(0, length, BASE))
    while len(blocks) > 1:
        merged, merged_starts = [], []
        for i in range(0, len(blocks), 2):
            if i + 1 == len(blocks):
                merged.append(blocks[i])
                merged_starts.append(starts[i])
                continue
            a_inv, d_inv = blocks[i], blocks[i + 1]
            s0, s1 = starts[i], starts[i + 1]
            e1 = s1 + d_inv.shape[-1]
            c = full[..., s1:e1, s0:s1]
            lower_left = -(d_inv @ c @ a_inv) if merge else torch.zeros_like(c)
            top = torch.cat([a_inv, torch.zeros(*a_inv.shape[:-1], d_inv.shape[-1],
                                                dtype=m.dtype, device=m.device)], -1)
            bottom = torch.cat([lower_left, d_inv], -1)
            merged.append(torch.cat([top, bottom], -2))
            merged_starts.append(s0)
        blocks, starts = merged, merged_starts
    return blocks[0]


def solve_tril_fp32(A, cu_seqlens, merge=True):
    bt = A.shape[-1]
    parts = []
    for b, start, end in gold.segments(A.shape[0], A.shape[1], cu_seqlens):
        for s, e in gold.chunks(start, end, bt):
            m = A[b, s:e, :, :e - s].to(F32).permute(1, 0, 2)  # [H, L, L]
            inv = inverse_unit_lower(m, merge).permute(1, 0, 2)
            parts.append((b, s, e, gold.pad_cols(inv, bt)))
    return gold.assemble(torch.zeros(A.shape, dtype=F32, device=A.device), parts)


@kernel("solve_tril")
def solve_tril(A, cu_seqlens=None):
    gold.check_solve_tril(A, cu_seqlens)
    return solve_tril_fp32(A, cu_seqlens)


# -- recompute_w_u -----------------------------------------------------------------------
def wy_chunk(a, k, v, beta, g):
    """w = a @ (k beta exp(g)), u = a @ (v beta) for one chunk, a [L, H, L] (fp32)."""
    kk = k * beta[..., None]
    if g is not None:
        kk = kk * torch.exp(g)[..., None]
    return (torch.einsum("ihj,jhk->ihk", a, kk),
            torch.einsum("ihj,jhv->ihv", a, v * beta[..., None]))


@kernel("recompute_w_u")
def recompute_w_u(k, v, beta, A, g=None, cu_seqlens=None):
    gold.check_recompute(k, v, beta, A, g, cu_seqlens)
    kf, vf, bf, af, gf = k.to(F32), v.to(F32), beta.to(F32), A.to(F32), _f(g)
    bt = A.shape[-1]
    w_parts, u_parts = [], []
    for b, start, end in gold.segments(k.shape[0], k.shape[1], cu_seqlens):
        for s, e in gold.chunks(start, end, bt):
            w, u = wy_chunk(af[b, s:e, :, :e - s], kf[b, s:e], vf[b, s:e], bf[b, s:e],
                            None if gf is None else gf[b, s:e])
            w_parts.append((b, s, e, w))
            u_parts.append((b, s, e, u))
    return (gold.assemble(kf, w_parts).to(k.dtype), gold.assemble(vf, u_parts).to(v.dtype))


# -- chunk_gated_delta_rule ----------------------------------------------------------------
def clamped_decay(diff, mask):
    return masked_decay(diff, mask, EXP_CLAMP)


def doc_clamped_decay(diff, mask):
    return masked_decay(diff, mask, DOC_EXP_CLAMP)


def gated_delta_chunked(q, k, v, g, beta, initial_state, cu_seqlens, scale, l2,
                        chunk_size, decay=clamped_decay, gate_beta=lambda b: b):
    """The chunked forward in fp32 for one call; returns (o fp32, final states fp32).

    ``decay(diff, mask)`` makes the masked exp(g_i - g_j) of a chunk; ``gate_beta``
    transforms beta before use (the identity here; known-bad kernels swap both)."""
    qf, kf, vf, gf, bf = (t.to(F32) for t in (q, k, v, g, beta))
    if l2:
        qf, kf = gold.l2norm(qf), gold.l2norm(kf)
    bf = gate_beta(bf)
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    gc = local_cumsum(gf, cu_seqlens, chunk_size, reverse=False)
    h, kd, vd = k.shape[2], k.shape[3], v.shape[3]
    o_parts, finals = [], []
    for b, start, end in gold.segments(q.shape[0], q.shape[1], cu_seqlens):
        state = (initial_state[b].to(F32) if initial_state is not None
                 else torch.zeros(h, kd, vd, dtype=F32, device=q.device))
        for s, e in gold.chunks(start, end, chunk_size):
            kc, vc, qc, bc, gcc = kf[b, s:e], vf[b, s:e], qf[b, s:e], bf[b, s:e], gc[b, s:e]
            length = e - s
            a = kkt_chunk(kc, gcc, bc, decay)                      # [L, H, L]
            a_inv = inverse_unit_lower(a.permute(1, 0, 2)).permute(1, 0, 2)
            w, u = wy_chunk(a_inv, kc, vc, bc, gcc)                # [L, H, K], [L, H, V]
            v_new = u - torch.einsum("ihk,hkv->ihv", w, state)
            causal = torch.tril(torch.ones(length, length, dtype=torch.bool,
                                           device=q.device))[:, None, :]
            diff = gcc[:, :, None] - gcc.transpose(0, 1)[None, :, :]
            attn = torch.einsum("ihk,jhk->ihj", qc, kc) * decay(diff, causal.expand_as(diff))
            o = (torch.einsum("ihk,hkv->ihv", qc * torch.exp(gcc)[..., None], state)
                 + torch.einsum("ihj,jhv->ihv", attn, v_new)) * scale
            o_parts.append((b, s, e, o))
            g_last = gcc[-1]                                        # [H]
            state = (state * torch.exp(g_last)[:, None, None]
                     + torch.einsum("jhk,jhv->hkv",
                                    kc * torch.exp(g_last[None, :] - gcc)[..., None], v_new))
        finals.append(state)
    return gold.assemble(vf, o_parts), torch.stack(finals, 0)


def gated_delta_kernel(decay=clamped_decay, gate_beta=lambda b: b, doc: str = ""):
    """A chunk_gated_delta_rule kernel with the op's signature over gated_delta_chunked;
    the default one, the strategy routes and the known-bad kernels differ only in
    ``decay`` and ``gate_beta``."""
    def run(q, k, v, g, beta, initial_state=None, cu_seqlens=None, *, scale=None,
            output_final_state=True, use_qk_l2norm_in_kernel=False, chunk_size=64):
        gold.check_gated_delta(q, k, v, g, beta, initial_state, cu_seqlens, chunk_size)
        o, final = gated_delta_chunked(q, k, v, g, beta, initial_state, cu_seqlens, scale,
                                       use_qk_l2norm_in_kernel, chunk_size, decay=decay,
                                       gate_beta=gate_beta)
        o = o.to(q.dtype)
        return (o, final) if output_final_state else o
    run.__doc__ = doc
    return run


chunk_gated_delta_rule = kernel("chunk_gated_delta_rule", name="chunk_gated_delta_rule")(gated_delta_kernel(
    doc="Chunked fp32: cumsum, KK^T, 16x16 block inverse, WY, state per chunk, output."))
