"""A chunked gated delta rule that stores its intermediates in the working dtype, as
flash-linear-attention's kernels do (w, u, v_new and the chunk states h in bf16/fp16)."""
import torch, verify
from verify.kernels.torch import gated_delta as tk
from verify.goldens import gated_delta as gold

F32 = torch.float32

@verify.kernel("chunk_gated_delta_rule", backend="mine", name="bf16_intermediates")
def run(q, k, v, g, beta, initial_state=None, cu_seqlens=None, *, scale=None,
        output_final_state=True, use_qk_l2norm_in_kernel=False, chunk_size=64):
    gold.check_gated_delta(q, k, v, g, beta, initial_state, cu_seqlens, chunk_size)
    wd = q.dtype
    st = lambda t: t.to(wd).to(F32)
    qf, kf, vf, gf, bf = (t.to(F32) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        qf, kf = gold.l2norm(qf), gold.l2norm(kf)
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    gc = tk.local_cumsum(gf, cu_seqlens, chunk_size, reverse=False)
    h, kd, vd = k.shape[2], k.shape[3], v.shape[3]
    o_parts, finals = [], []
    for b, start, end in gold.segments(q.shape[0], q.shape[1], cu_seqlens):
        state = (initial_state[b].to(F32) if initial_state is not None
                 else torch.zeros(h, kd, vd, dtype=F32))
        for s, e in gold.chunks(start, end, chunk_size):
            kc, vc, qc, bc, gcc = kf[b, s:e], vf[b, s:e], qf[b, s:e], bf[b, s:e], gc[b, s:e]
            length = e - s
            a = tk.kkt_chunk(kc, gcc, bc, tk.clamped_decay)
            a_inv = tk.inverse_unit_lower(a.permute(1, 0, 2)).permute(1, 0, 2)
            w, u = tk.wy_chunk(a_inv, kc, vc, bc, gcc)
            w, u = st(w), st(u)
            hs = st(state)
            v_new = st(u - torch.einsum("ihk,hkv->ihv", w, hs))
            causal = torch.tril(torch.ones(length, length, dtype=torch.bool))[:, None, :]
            diff = gcc[:, :, None] - gcc.transpose(0, 1)[None, :, :]
            attn = torch.einsum("ihk,jhk->ihj", qc, kc) * tk.clamped_decay(diff, causal.expand_as(diff))
            o = (torch.einsum("ihk,hkv->ihv", qc * torch.exp(gcc)[..., None], hs)
                 + torch.einsum("ihj,jhv->ihv", attn, v_new)) * scale
            o_parts.append((b, s, e, o))
            g_last = gcc[-1]
            state = (state * torch.exp(g_last)[:, None, None]
                     + torch.einsum("jhk,jhv->hkv", kc * torch.exp(g_last[None, :] - gcc)[..., None], v_new))
        finals.append(state)
    o = gold.assemble(vf, o_parts).to(q.dtype)
    final = torch.stack(finals, 0)
    return (o, final) if output_final_state else o
