"""The metrics block pass as it was, one loop with masks (123 instructions per 8 elements
at fp32): the reference the lean pass's figures are tested against, bit for bit, on
blocks with and without NaN / Inf, quiet and loud."""
import numpy as np
from numba import njit

from verify.comparator.metrics import (  # noqa: F401
    _FAST, _F64_EXP, _F64_MAN, _as_float, _bits, _fmax, _half_of_bits,
    _ulp_error, C_EPS_CANN, C_EPS_MS, C_SMALL, C_SMALL_ATOL, C_MANT, C_MIN_EXP, C_V2_ATOL,
    C_V2_RTOL, C_ATOL, C_RTOL, C_ABS_RTOL, C_THOU_ATOL, C_EPS_ABS, N, NONFINITE_BAD,
    SPECIAL_EQ, SUM_REL, MAX_REL_CANN, ARG_REL, MAX_ABS, ARG_ABS, SUM_SQ, DOT, AA, GG,
    SUM_EB, MAX_ULP, SUM_ULP, N_ULP1, N_ULP32, N_SMALL, N_SMALL_BAD, N_OK_1E2, N_OK_1E3,
    N_OK_1E4, N_REL_BAD, N_V2, N_CASE, MAX_REL, N_ZERO_G_BAD, MAX_TOL, N_SHRINK, N_GROW,
    EB_GT, EB_LT, MAX_G)


def masked_block(keep_rels: bool, keep_tols: bool, keep_cells: bool, eb_half: bool = False):
    """The block pass as one loop with masks: NaN / Inf pairs are left out of the
    arithmetic element by element, and every count is tested in the loop. The pass's
    lean variant (a loop without masks or tolerance tests, a finite copy of a block with
    NaN / Inf) must give these figures to the bit."""

    @njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
    def _block(a, abits, aexp, aman, g, gbits, lo, hi, c, out, rels, tols, cells):
        """Every metric's counters and sums of a[lo:hi] against g[lo:hi] into out, and
        each element's relative error d / (|g| + 1e-7) (``keep_rels``), allclose's
        d / (atol + rtol |g|) (``keep_tols``) and its relative error's table cell
        (``keep_cells``) into rels, tols and cells [0:hi-lo], for the heat map and the
        histogram."""
        eps_cann, eps_ms = c[C_EPS_CANN], c[C_EPS_MS]
        small, small_atol = c[C_SMALL], c[C_SMALL_ATOL]
        mant, min_field = np.int64(c[C_MANT]), np.int64(c[C_MIN_EXP]) + 1023
        mant_bits = mant << 52
        floor_bits = max(min_field, mant) << 52
        v2_atol, v2_rtol, atol, rtol = c[C_V2_ATOL], c[C_V2_RTOL], c[C_ATOL], c[C_RTOL]
        abs_rtol, thou_atol, eps_abs = c[C_ABS_RTOL], c[C_THOU_ATOL], c[C_EPS_ABS]
        n = bad = same = s_rel = m_rel = m_abs = s_sq = dot = aa = gg = 0.0
        s_eb = m_ulp = s_ulp = n_u1 = n_u32 = n_small = n_small_bad = 0.0
        ok2 = ok3 = ok4 = n_rel_bad = n_v2 = n_case = m_pr = zero_bad = m_tol = 0.0
        shrink = grow = eb_gt = eb_lt = m_g = 0.0
        for j in range(lo, hi):
            i = np.uint64(j)  # unsigned: no negative-index wraparound, so loads stay contiguous
            ab = np.int64(abits[i])
            gb = gbits[i]
            # masks as 0.0 / 1.0 and selects only: no branch, so the loop vectorises
            a_spec = 1.0 if (ab & aexp) == aexp else 0.0
            g_spec = 1.0 if (gb & _F64_EXP) == _F64_EXP else 0.0
            a_nan = a_spec * (1.0 if (ab & aman) != 0 else 0.0)
            g_nan = g_spec * (1.0 if (gb & _F64_MAN) != 0 else 0.0)
            same_sign = 1.0 if (ab < 0) == (gb < 0) else 0.0
            eq_special = a_nan * g_nan + (a_spec - a_nan) * (g_spec - g_nan) * same_sign
            f = (1.0 - a_spec) * (1.0 - g_spec)
            same += eq_special
            bad += 1.0 - f - eq_special
            a_raw = np.float64(a[i])
            g_raw = g[i]
            av = a_raw if f > 0.5 else 0.0
            gv = g_raw if f > 0.5 else 0.0
            n += f
            diff = av - gv
            d = abs(diff)
            ag = abs(gv)
            s_sq += d * d
            dot += av * gv
            aa += av * av
            gg += gv * gv
            # msprobe's error balance against the golden cast to float32 (its NumPy dtype
            # for fp32 and bf16 outputs) or to half (fp16), for finite pairs; a block with
            # any NaN / Inf pair or a golden beyond the cast's range is counted again
            # exactly (_eb_range)
            g32 = np.float32(gv)
            cast = np.float64(g32)
            if eb_half:  # to float32 to odd, then to half: the once-rounded half (Boldo
                # and Melquiond: float32 has two bits more than half in each binade of it)
                odd = _bits(g32) - (np.int32(1) if abs(cast) > ag else np.int32(0))
                cast = _half_of_bits(odd | (np.int32(1) if cast != gv else np.int32(0)))
            eb_gt += f * (1.0 if av > cast else 0.0)
            eb_lt += f * (1.0 if av < cast else 0.0)
            m_g = _fmax(m_g, ag)
            a_mag = abs(av)
            shrink += 1.0 if a_mag < ag else 0.0
            grow += 1.0 if a_mag > ag else 0.0
            inv_ag = 1.0 / _fmax(ag, 1e-300)
            s_eb += diff * (inv_ag if ag > 1.0 else 1.0)
            m_abs = _fmax(m_abs, d)
            rel = d / (ag + eps_cann)
            s_rel += rel
            m_rel = _fmax(m_rel, rel)
            g_pos = 1.0 if ag > 0.0 else 0.0
            m_pr = _fmax(m_pr, d * inv_ag * g_pos)
            zero_bad += (1.0 - g_pos) * (1.0 if d > 0.0 else 0.0)
            # ULP scale 2^(mant - max(e, min_exp)) built from g's exponent field
            # (worked on the exponent fields in place, << 52: two shifts and a min fewer;
            # e >= mant keeps the scale's field at most 2046, so nothing overflows)
            ulp = _ulp_error(d, gb, mant_bits, floor_bits)
            m_ulp = _fmax(m_ulp, ulp)
            s_ulp += ulp
            n_u1 += 1.0 if ulp > 1.0 else 0.0
            n_u32 += 1.0 if ulp > 32.0 else 0.0
            sm = f * (1.0 if ag <= small else 0.0)
            within_atol = 1.0 if d <= small_atol else 0.0
            n_small += sm
            n_small_bad += sm * (1.0 - within_atol)
            denom = ag + eps_ms
            big = f - sm
            within_thou = 1.0 if d <= thou_atol else 0.0
            ok2 += sm * within_thou + big * (1.0 if d < 1e-2 * denom else 0.0)
            ok3 += sm * within_thou + big * (1.0 if d < 1e-3 * denom else 0.0)
            ok4 += sm * within_thou + big * (1.0 if d < 1e-4 * denom else 0.0)
            n_rel_bad += big * (1.0 if d > abs_rtol * (ag + eps_abs) else 0.0)
            n_v2 += f * (1.0 if d <= v2_atol + v2_rtol * ag else 0.0)
            allowed = atol + rtol * ag
            n_case += f * (1.0 if d <= allowed else 0.0)
            tol = d / _fmax(allowed, 1e-300)  # allclose's measure d / (atol + rtol |g|)
            m_tol = _fmax(m_tol, tol)
            # per element, for the histogram and the heat map: the same NaN / Inf in the same
            # place is no error (0), any other non-finite pair the largest (1e300), as is any
            # error beyond it
            special = 0.0 if eq_special > 0.5 else 1e300
            kept = (rel if rel < 1e300 else 1e300) if f > 0.5 else special
            if keep_rels:  # constants of the closure: a variant without stores has none
                rels[np.uint64(j - lo)] = kept
            if keep_cells:  # the histogram's (and the heat map's) key of the kept error:
                # its bits over 2^31, rounded up, plus 2^13 - 1 (the top 19 bits its cell)
                cells[np.uint64(j - lo)] = np.uint32(
                    ((np.uint64(_bits(kept)) + np.uint64(2 ** 31 - 1)) >> np.uint64(31))
                    + np.uint64(2 ** 13 - 1))
            if keep_tols:
                tols[np.uint64(j - lo)] = (tol if tol < 1e300 else 1e300) if f > 0.5 else special
        out[N] = n
        out[NONFINITE_BAD] = bad
        out[SPECIAL_EQ] = same
        out[SUM_REL] = s_rel
        out[MAX_REL_CANN] = m_rel
        out[MAX_ABS] = m_abs
        out[SUM_SQ] = s_sq
        out[DOT] = dot
        out[AA] = aa
        out[GG] = gg
        out[SUM_EB] = s_eb
        out[MAX_ULP] = m_ulp
        out[SUM_ULP] = s_ulp
        out[N_ULP1] = n_u1
        out[N_ULP32] = n_u32
        out[N_SMALL] = n_small
        out[N_SMALL_BAD] = n_small_bad
        out[N_OK_1E2] = ok2
        out[N_OK_1E3] = ok3
        out[N_OK_1E4] = ok4
        out[N_REL_BAD] = n_rel_bad
        out[N_V2] = n_v2
        out[N_CASE] = n_case
        out[MAX_REL] = m_pr
        out[N_ZERO_G_BAD] = zero_bad
        out[MAX_TOL] = m_tol
        out[N_SHRINK] = shrink
        out[N_GROW] = grow
        out[EB_GT] = eb_gt
        out[EB_LT] = eb_lt
        out[MAX_G] = m_g
        out[ARG_ABS] = -1.0
        out[ARG_REL] = -1.0
        return False

    return _block


masked_tols = masked_block(False, True, True)
masked_rels = masked_block(True, False, True)
masked_half_rels = masked_block(True, False, True, eb_half=True)
