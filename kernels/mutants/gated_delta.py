"""Known-bug kernels of the Gated DeltaNet family: the correct chunked kernels with one
real bug each, forward or backward."""
from __future__ import annotations

import torch

from verify.goldens import gated_delta as gold
from verify.kernels.torch import gated_delta as good
from verify.specs.registry import kernel

F32 = torch.float32


def mutant(op):
    return kernel(op, backend="mutants")


# -- chunk_local_cumsum ------------------------------------------------------------------
def chunks_off_by_one(start: int, end: int, size: int):
    """Chunk boundaries one token early: [start, start+size-1), then every size."""
    first = min(start + size - 1, end)
    rest = [(s, min(s + size, end)) for s in range(first, end, size)]
    return [(start, first)] + rest if first > start else rest


@mutant("chunk_local_cumsum")
def chunk_boundary_off_by_one(g, cu_seqlens=None, *, chunk_size=64, reverse=False,
                              scale=None, output_dtype="fp32"):
    """Forward bug: every chunk starts one token early."""
    gold.check_cumsum(g, cu_seqlens, chunk_size)
    out = good.local_cumsum(g.to(F32), cu_seqlens, chunk_size, reverse, chunks_off_by_one)
    out = out * scale if scale is not None else out
    return out.to(good._cumsum_out_dtype(g, output_dtype))


class _CumsumBadBackward(torch.autograd.Function):
    """Right forward; the backward's reverse cumsum uses chunks one token early."""

    @staticmethod
    def forward(ctx, g, cu_seqlens, chunk_size, reverse, scale, output_dtype):
        ctx.args = (cu_seqlens, chunk_size, reverse, scale, g.dtype)
        return good.chunk_local_cumsum(g, cu_seqlens, chunk_size=chunk_size, reverse=reverse,
                                       scale=scale, output_dtype=output_dtype)

    @staticmethod
    def backward(ctx, grad):
        cu_seqlens, chunk_size, reverse, scale, dtype = ctx.args
        d = good.local_cumsum(grad.to(F32), cu_seqlens, chunk_size, not reverse,
                              chunks_off_by_one)
        d = d * scale if scale is not None else d
        return d.to(dtype), None, None, None, None, None


@mutant("chunk_local_cumsum")
def backward_chunk_boundary_off_by_one(g, cu_seqlens=None, *, chunk_size=64, reverse=False,
                                       scale=None, output_dtype="fp32"):
    """Backward bug: the gradient's reverse cumsum crosses chunk boundaries one token off."""
    gold.check_cumsum(g, cu_seqlens, chunk_size)
    return _CumsumBadBackward.apply(g, cu_seqlens, chunk_size, reverse, scale, output_dtype)


# -- chunk_scaled_dot_kkt ----------------------------------------------------------------
@mutant("chunk_scaled_dot_kkt")
def diagonal_included(k, g=None, beta=None, cu_seqlens=None, *, chunk_size=64):
    """Forward bug: the mask keeps j <= i, so A gets beta_i |k_i|^2 on its diagonal."""
    out = good.chunk_scaled_dot_kkt(k, g, beta, cu_seqlens, chunk_size=chunk_size)
    kf, bf = k.to(F32), beta.to(F32)
    diag = (kf * kf).sum(-1) * bf                                   # [B, T, H]
    pos = _positions_in_chunk(k.shape[0], k.shape[1], cu_seqlens, chunk_size, k.device)
    onehot = torch.nn.functional.one_hot(pos, chunk_size).to(F32)    # [B, T, BT]
    return out + diag[..., None] * onehot[:, :, None, :]


def _positions_in_chunk(batch, total, cu_seqlens, chunk_size, device):
    pos = torch.zeros(batch, total, dtype=torch.long)
    for b, start, end in gold.segments(batch, total, cu_seqlens):
        for s, e in gold.chunks(start, end, chunk_size):
            pos[b, s:e] = torch.arange(e - s)
    return pos.to(device)


# -- solve_tril --------------------------------------------------------------------------
@mutant("solve_tril")
def blocks_not_merged(A, cu_seqlens=None):
    """Forward bug: the 16x16 diagonal blocks are inverted but never merged (the blocks
    below the diagonal stay 0)."""
    gold.check_solve_tril(A, cu_seqlens)
    return good.solve_tril_fp32(A, cu_seqlens, merge=False)


# -- recompute_w_u -----------------------------------------------------------------------
@mutant("recompute_w_u")
def w_without_gate(k, v, beta, A, g=None, cu_seqlens=None):
    """Forward bug: w = A (k beta), the exp(g) gate left out."""
    return good.recompute_w_u(k, v, beta, A, None, cu_seqlens)


# -- chunk_gated_delta_rule ----------------------------------------------------------------
def unclamped_decay(diff, mask):
    """exp over the whole chunk square, masked afterwards by a multiply: exp of the large
    positive differences above the diagonal overflows to inf, and inf * 0 is NaN."""
    return torch.exp(diff) * mask.to(diff.dtype)


kernel("chunk_gated_delta_rule", backend="mutants", name="exp_clamp_missing")(
    good.gated_delta_kernel(decay=unclamped_decay, doc=(
        "Forward bug: exp(g_i - g_j) unclamped over the whole chunk, then masked by a "
        "multiply: NaN once a chunk's gates span more than ~88 (fp32 exp overflow).")))

kernel("chunk_gated_delta_rule", backend="mutants", name="beta_detached")(
    good.gated_delta_kernel(gate_beta=lambda b: b.detach(), doc=(
        "Backward bug: beta treated as a constant, so d beta is 0.")))
