"""All precision metrics of one output in a single streaming pass.

The pass walks (actual, golden) in fixed blocks of 64Ki elements; a compiled block
function (numba) accumulates every counter and sum that the standards need, blocks run in
parallel, and the per-block partial results are combined in block order. Fixed blocks make
the figures independent of thread count, and nothing of tensor size is allocated for a
float32 / float64 / bf16 / fp16 actual (a bf16 / fp16 one is upcast a block at a time, in
the pass; fp8 and integers whole, before it). The report's plot data comes from the
same pass: each element's errors are kept while its block is in cache, for the histogram
(binned by a table of exponent and top significand bits, no logarithm) and the heat map
(cell maxima). The error floor (the golden rounded to the output's format) is measured in
the same pass, except in a block that is the golden rounded, bit for bit: there it is the
block's own figures.

Definitions follow reference/standards.md (a = actual, g = golden, d = |a - g|):
- mere / mare: mean / max of d / (|g| + 1e-7) (CANN v1)
- max_rel: max of d / |g| over g != 0 (inf when some g == 0 has d > 0)
- rmse (textbook, every element), cosine, eb_mean = |mean((a-g)/max(1,|g|))| (ATB)
- eb = |#(a > g') - #(a < g')| / n with g' the golden cast to the output's NumPy dtype
  (float16, else float32): msprobe's get_error_balance, counted in the same block pass
- mag_bias = (#|a|<|g| - #|a|>|g|) / #inexact: rounding to nearest gives ~0, a truncating
  conversion ~1 (EB cannot see truncation: it cancels between positive and negative values)
- ULP = d * 2^(mantissa - max(floor(log2|g|), min_exp)) (msprobe)
- small-value domain |g| <= small_value: an element is wrong when d > small_value_atol
- hundredth / thousandth / ten_thousandth (our own family): share of elements within
  d/(|g|+eps) < t (small values: within their atol)
- abs_threshold (msprobe's absolute threshold): rel = d / (|g| + finfo(golden).eps), the
  golden being float64 (2^-8 for bf16, get_abs_bench_with_eps)
- NaN / Inf placement: same NaN, or same signed Inf, is equal; anything else is a mismatch.
"""
from __future__ import annotations

import functools
import itertools
import math
import os
import platform
import threading
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import torch

os.environ.setdefault("NUMBA_CACHE_DIR",
                      os.path.join(os.path.expanduser("~"), ".cache", "kernel-verify-numba"))
import numba  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit  # noqa: E402
from numba.core import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from verify.comparator import dtypes as dt  # noqa: E402
from verify.comparator.block_threads import run_per_thread  # noqa: E402
from verify.comparator.cache_size import last_level_cache_bytes  # noqa: E402
from verify.comparator.metric_fields import Metrics  # noqa: E402,F401  (re-exported)

BLOCK = 1 << 16  # every output goes through the pass whole, in blocks (bf16 / fp16 ones
# upcast a block at a time by the pass itself: upcast by torch a 4Mi-element chunk a call,
# bf16's metrics took 33-46 ms at [7168, 4096])

# accumulator slots
(N, NONFINITE_BAD, SPECIAL_EQ, SUM_REL, MAX_REL_CANN, ARG_REL, MAX_ABS, ARG_ABS, SUM_SQ,
 DOT, AA, GG, SUM_EB, MAX_ULP, SUM_ULP, N_ULP1, N_ULP32, N_SMALL, N_SMALL_BAD,
 N_OK_1E2, N_OK_1E3, N_OK_1E4, N_REL_BAD, N_V2, N_CASE, MAX_REL, N_ZERO_G_BAD, MAX_TOL,
 N_SHRINK, N_GROW, EB_GT, EB_LT, MAX_G, N_SLOTS) = range(34)
_FLT_MAX = float(np.finfo(np.float32).max)

# constants slots
(C_EPS_CANN, C_EPS_MS, C_SMALL, C_SMALL_ATOL, C_MANT, C_MIN_EXP, C_V2_ATOL, C_V2_RTOL,
 C_ATOL, C_RTOL, C_ABS_RTOL, C_THOU_ATOL, C_EPS_ABS, C_QUIET, C_RATIOS, C_QUIET_ABS,
 C_RATIOS_TRIM, C_SPARSE, N_CONSTS) = range(19)

from verify.comparator.histbins import BIN_HI, BIN_LO, BINS_PER_DECADE, HEAT_GRID, N_BINS  # noqa: E402

N_BINS_ = N_BINS  # a global numba freezes as a constant
_F64_EXP = np.int64(0x7FF0000000000000)
_F64_MAN = np.int64(0x000FFFFFFFFFFFFF)
_F64_MAX_FIELD = np.int64(2046 << 52)  # the largest finite exponent field, in place
# NaN / Inf are classified from the bit patterns, so the float arithmetic below only ever
# sees finite values and may be vectorised with fast-math flags (no nnan / ninf). The
# functions that must see NaN / Inf say fastmath=False outright: numba compiles a callee
# with its caller's fast-math flags unless it sets its own (and caches it so).
_FAST = {"nnan", "ninf", "nsz", "arcp", "contract", "reassoc"}


@intrinsic
def _fmax(typingctx, x, y):
    """llvm.maxnum: a max that LLVM vectorises as a reduction (numba's max() does not)."""
    sig = types.float64(types.float64, types.float64)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.DoubleType(), [ir.DoubleType(), ir.DoubleType()])
        fn = builder.module.declare_intrinsic("llvm.maxnum", [ir.DoubleType()], fnty)
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def _as_float(typingctx, bits):
    """The float64 whose IEEE bits are ``bits`` (a vectorisable bit cast)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@intrinsic
def _bits(typingctx, x):
    """The IEEE bits of a float64 or float32, as int64 or int32 (a vectorisable bit cast)."""
    if not isinstance(x, types.Float):
        return None
    width = x.bitwidth
    sig = getattr(types, f"int{width}")(x)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(width))

    return sig, codegen


@intrinsic
def _and_max(typingctx, top, bits, mask):
    """max(top, bits & mask) in the width of bits (and top): an fp32 output's exponent
    fields tracked in int32, 8 to a 256-bit register, not widened to int64 first (fp32
    block loop 1.25 -> 1.20 ns an element, one thread, a block in cache)."""
    if not isinstance(bits, types.Integer) or top != bits:
        return None
    sig = bits(bits, bits, types.int64)

    def codegen(context, builder, signature, args):
        t, b, m = args
        if b.type.width < 64:
            m = builder.trunc(m, b.type)
        v = builder.and_(b, m)
        return builder.select(builder.icmp_signed(">", v, t), v, t)

    return sig, codegen


@intrinsic
def _zero_of(typingctx, array):
    """0 in the integer type of an array's elements (a start for _and_max)."""
    sig = array.dtype(array)

    def codegen(context, builder, signature, args):
        return ir.Constant(context.get_value_type(signature.return_type), 0)

    return sig, codegen


@intrinsic
def _half_of_bits(typingctx, bits):
    """The float32 of IEEE bits ``bits`` (int32) rounded to IEEE half (the hardware's
    conversion: to nearest, ties to even, subnormals, overflow to inf), as float64."""
    sig = types.float64(types.int32)

    def codegen(context, builder, signature, args):
        f = builder.bitcast(args[0], ir.FloatType())
        return builder.fpext(builder.fptrunc(f, ir.HalfType()), ir.DoubleType())

    return sig, codegen


@intrinsic
def _f32_of_16(typingctx, bits, half):
    """The float32 of a bf16 or (``half``, a literal) IEEE half of bits ``bits`` (int16):
    exact either way (bf16: the bits are float32's top half; half: its conversion)."""
    if not isinstance(half, types.BooleanLiteral):
        return None
    sig = types.float32(types.int16, half)

    def codegen(context, builder, signature, args):
        if signature.args[1].literal_value:
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return sig, codegen


@intrinsic
def _f32_of_bits(typingctx, bits):
    """The float32 of IEEE bits ``bits`` (int32), as float64."""
    sig = types.float64(types.int32)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.FloatType()), ir.DoubleType())

    return sig, codegen


_MACHINE = platform.machine().lower()


@intrinsic
def _cycles(typingctx):
    """A counter that ticks at a steady rate, to time a block: rdtsc on x86 (LLVM's
    readcyclecounter); else 0, and the pass then finds no gain in the touch and keeps
    its former way (AArch64's readcyclecounter reads PMCCNTR_EL0, which may trap in user
    space; its virtual counter, by inline assembly, is not tried where it cannot be run)."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        if _MACHINE in ("x86_64", "amd64", "i386", "i686"):
            fnty = ir.FunctionType(ir.IntType(64), [])
            fn = builder.module.declare_intrinsic("llvm.readcyclecounter", (), fnty)
            return builder.call(fn, [])
        return ir.Constant(ir.IntType(64), 0)

    return sig, codegen


@intrinsic
def _claim(typingctx, counter):
    """Atomically adds 1 to counter[0] and returns its former value: the next block a
    thread of the pass takes (every thread's claims distinct, in any interleaving)."""
    sig = types.int64(counter)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", ary.data, ir.Constant(ir.IntType(64), 1),
                                  "monotonic")

    return sig, codegen


@intrinsic
def _prefetch(typingctx, array, index):
    """Asks for the cache line holding array[index] (LLVM's prefetch: a read, kept in
    the outer caches), without waiting for it and without a fault where there is none:
    the pass's next block, fetched while the histogram's scalar count runs
    (_count_cells), so that its vectorised block loop finds it in cache."""
    sig = types.void(array, types.uint64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [byte_ptr], fnty)
        where = builder.bitcast(builder.gep(ary.data, [args[1]]), byte_ptr)
        builder.call(fn, [where, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


# the formats _rounded rounds a golden into (the fp32 floor's block as it goes, bf16 / fp16
# floors in a pass of their own); 0 for the others (float64), rounded by _round_range
ROUND_F32, ROUND_BF16, ROUND_F16 = 1, 2, 3


@njit(inline="always")
def _rounded(gv, kind):
    """The float64 ``gv`` rounded once, to nearest with ties to even, into float32
    (``kind`` ROUND_F32: the hardware's conversion), bfloat16 or IEEE half (ROUND_BF16,
    ROUND_F16), as float64: the latter two from float32 rounded to odd, which has two
    bits more than either in each of its binades, so rounding that to nearest is rounding
    once (Boldo and Melquiond); then bfloat16 by adding half its last place to the bits
    (ties to even: and the bit above), half by the hardware's conversion. Subnormals and
    overflow to inf as IEEE says; NaN / Inf pass. The fp32 floor's block rounds so as it
    goes; bf16 / fp16 floors are rounded in a pass of their own (_rounded_range: 0.65 /
    0.47 ns an element, _round_range's general rounding 0.64 / 0.65), as rounding inside
    the block loop made it slower there (3.2 / 3.65 ns an element against 2.7)."""
    g32 = np.float32(gv)
    cast = np.float64(g32)
    if kind == ROUND_F32:
        return cast
    odd = (_bits(g32) - (np.int32(1) if abs(cast) > abs(gv) else np.int32(0))) \
        | (np.int32(1) if cast != gv else np.int32(0))
    if kind == ROUND_F16:
        return _half_of_bits(odd)
    up = odd + np.int32(0x7FFF) + ((odd >> np.int32(16)) & np.int32(1))
    return _f32_of_bits(up & np.int32(-65536))


FLAG = 0xFF  # a table cell that holds a bin edge: its elements are binned exactly
ZERO_CODE, OVER_CODE = N_BINS + 2, N_BINS + 1  # codes: 0 under, 1..N_BINS the bins
assert ZERO_CODE < 0x80  # FLAG alone has bit 7 (_count_cells tests eight codes at once)
CELL_BITS = 8  # significand bits of a histogram table cell: 2^(11 + 8) cells for the
# positive floats, the zero's first (a 512 KiB table, of which a block touches the few
# lines its errors fall in)
CELL_SHIFT = 52 - CELL_BITS
HEAT_KEY_SHIFT = 31  # a heat-map key keeps an error's bits over 2^31, rounded up
N_CELLS = 1 << (11 + CELL_BITS)  # the table's cells: every 4-byte key's (_cell_index)
ZERO_CELL = 0  # an error of 0's table entry, below the positive floats'
# a key is its error's bits over 2^31, rounded up, plus KEY_OF_ZERO: the key of 0, whose
# cell (key >> 13) is ZERO_CELL, while a positive error's key is 2^13 or more
KEY_OF_ZERO = (1 << (CELL_SHIFT - HEAT_KEY_SHIFT)) - 1
_KEY_ROUNDING = (1 << HEAT_KEY_SHIFT) - 1 + (KEY_OF_ZERO << HEAT_KEY_SHIFT)  # _heat_key's


@njit(inline="always")
def _cell_index(key):
    """The histogram table entry of a relative error's key (_heat_key): 1 + k for the
    cell k that holds the errors whose bits lie in (k 2^44, (k + 1) 2^44] (the key's
    span lies within one cell), and ZERO_CELL for an error of 0 (KEY_OF_ZERO): the key's
    top 19 bits, no test for 0 and no clamp (which took an fp32 block with allclose's
    heat map 1.45 ns an element, 1.35 without: one thread, a block in cache), and in the
    histogram's count, from two keys read as one 8-byte word, a shift and a mask each.
    The key is both the heat map's and the histogram's: one 4-byte store an element."""
    return np.uint64(key) >> np.uint64(CELL_SHIFT - HEAT_KEY_SHIFT)


@njit(inline="always")
def _heat_key(v):
    """The heat map's 4-byte key of a kept error 0 <= v <= 1e300: its bits over 2^31,
    rounded up, plus KEY_OF_ZERO (one addition: of the constant's multiple of 2^31 before
    the shift). Monotone, so a window's largest key is its largest error's, and
    KEY_OF_ZERO for 0 alone; the error's bits lie in ((key - KEY_OF_ZERO - 1) 2^31,
    (key - KEY_OF_ZERO) 2^31] (_heat_cells, which recomputes a cell exactly only where
    that span straddles a rounding to three digits); 1e300's key is under 2^32 - 2^13.
    A float64 error a block, stored and read back, spilled the block out of L2: the heat
    map took an fp32 [7168, 4096] compare 5.6-6.0 ms, with keys 3.1-3.4."""
    return np.uint32((np.uint64(_bits(v)) + np.uint64(_KEY_ROUNDING)) >> np.uint64(HEAT_KEY_SHIFT))


@njit(inline="always", fastmath=_FAST)
def _ulp_error(d, gb, mant_bits, floor_bits):
    """msprobe's ULP error d * 2^(mant - max(e, min_exp)) of an error d against a golden of
    IEEE bits gb, its scale built on the exponent fields in place (<< 52: two shifts and a
    min fewer; e >= mant keeps the scale's field at most 2046, so nothing overflows).
    mant_bits and floor_bits: _ulp_fields."""
    e_bits = gb & _F64_EXP
    e_bits = e_bits if e_bits > floor_bits else floor_bits
    return d * _as_float(_F64_MAX_FIELD - (e_bits - mant_bits))


@njit(inline="always")
def _ulp_fields(c):
    """(mant << 52, max(min_exp + 1023, mant) << 52): the exponent fields _ulp_error
    takes, from the dtype's constants."""
    mant, min_field = np.int64(c[C_MANT]), np.int64(c[C_MIN_EXP]) + 1023
    return mant << 52, max(min_field, mant) << 52


@njit(inline="always")
def _special(ab, aexp, gb):
    """Whether a pair holds NaN or Inf, from the bits: the actual's (exponent field
    ``aexp`` of its format) or the golden's exponent field all ones."""
    return ((np.int64(ab) & aexp) == aexp) | ((gb & _F64_EXP) == _F64_EXP)


# what _block_counts counts of the ratio family: all, the thousandth and ten-thousandth
# over the small bound, the ten-thousandth there
RATIOS_ALL, RATIOS_TRIMMED, RATIOS_TEN_THOUSANDTH = 1, 2, 3

_EB_TIE = float(1 << 20)  # a tie's weight in a half block's error balance counts (> BLOCK)


def _make_block(keep_tols: bool, keep_cells: bool, eb_half: bool, floor_of: int = 0,
                masked: bool = False, ten_thousandth_in_loop: bool = False):
    """The block pass, compiled once per set of per-element errors kept for the plot data,
    each as its 4-byte key (_heat_key): the relative errors' (``keep_cells``: the
    histogram's table cells, _cell_index, and the relative errors' heat map, so the
    histogram's count reads 4 bytes an element and looks up one table: 0.51 ns an element,
    from the errors themselves 0.83) and allclose's measure's too (``keep_tols``, its heat
    map); none for metrics alone. The ``rels`` argument is not written: the relative
    errors' keys are the cells. ``eb_half``: msprobe's error balance against the golden cast to IEEE
    half (fp16 outputs) rather than float32; counted in a pass of its own over the
    golden, fp16's metrics took 64 ms at [7168, 4096], in the block pass 45-50 (measured
    when it moved there). Counted from the ULP error the loop has anyway, for an actual on
    half's grid: the half cast emulated per element (float32 to odd, then half) took 76
    instructions per 8 elements, this 68 (fp32's: 65), and fp16's metrics 0.92-0.95x.

    For a block without NaN or Inf, whose arithmetic needs no masks (a block with one goes
    through the ``masked`` twin, which takes each pair holding NaN or Inf as a pair of
    zeros, tested on the bits, and _settle_specials). Its loop computes every sum and
    maximum, the counts that depend on the data everywhere (the error balance's, magnitude
    bias, ULP > 1, small values and those beyond their atol) and the kept errors, and counts
    the *loud* elements, d > fl(q |g|) (C_QUIET, _slope_of): a quiet block's tolerance
    counts are known without a test (all within CANN v2's and the case's tolerance, none
    beyond msprobe's absolute threshold, no error at a zero golden; for fp32 / fp64 outputs
    all within the hundredth / thousandth / ten-thousandth too), and a block loud only by
    small values within an absolute offset is quiet too (_loud_after_all). A loud block
    counts them in a loop of its own over the block while it is in cache (_block_counts;
    an fp32 or fp16 block with at most SPARSE_LOUD_MOST loud elements on those alone:
    _sparse_loud_counts),
    as do bf16 / fp16 outputs the ratio family (C_RATIOS, less what a quiet block knows:
    _ratios_trimmed), unless the block loop counts what is left of it
    (``ten_thousandth_in_loop``, fp16's lean variants: a quiet block, RATIOS_TEN_THOUSANDTH,
    then 1.65 -> 1.43 ns an element, a loud one, which counts all again, 2.10 -> 2.23;
    bf16's two tests in the fp32 variants it shares would cost fp32 blocks, and variants
    and passes of its own, compiled too, bought a quiet bf16 block only 1.47 -> 1.42);
    ULP errors over 32 are counted only where the block's largest is (in the loud block's
    loop, or alone). 65 instructions per 8 elements at fp32, where one loop with masks
    for NaN / Inf and every count took 123 (that loop's figures, kept as
    tests/masked_block.py, are these to the bit). Returns True when the block holds NaN /
    Inf.

    ``floor_of`` (ROUND_F32): the error floor's block, whose actual is the golden rounded
    to the output's format as the loop goes (_rounded; a and abits are not read, aexp is
    float64's): no pass of its own writing a rounded block for this one to read again
    (fp32: 1.83 -> 1.44 ns an element, one thread on a block in cache).

    Tried and dropped: an fp32 output's block and its floor's in one loop, sharing the
    golden's loads, |g|, 1/|g|, float32(g) (the floor's actual), the ULP scale and the
    bounds. Its accumulators (23 a block) spill out of the 32 vector registers: 2.98-4.12
    ns an element against 2.61-2.70 for the two block loops (cells variants, one thread,
    a block in cache); with the counts packed three to a float64 accumulator (exact below
    2^53), 2.55-2.65 against 2.71-2.73: 5%, where the floor's 4x target wants about 30%."""

    @njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
    def _block(a, abits, aexp, aman, g, gbits, lo, hi, c, out, rels, tols, cells):
        eps_cann, small, eps_ms = c[C_EPS_CANN], c[C_SMALL], c[C_EPS_MS]
        mant_bits, floor_bits = _ulp_fields(c)
        atol, rtol, quiet, small_atol = c[C_ATOL], c[C_RTOL], c[C_QUIET], c[C_SMALL_ATOL]
        s_rel = m_rel = m_abs = s_sq = dot = aa = gg = 0.0
        s_eb = m_ulp = s_ulp = n_u1 = n_small = n_small_bad = 0.0
        m_pr = m_tol = shrink = grow = eb_gt = eb_lt = m_g = loud = 0.0
        r_ok4 = 0.0  # ten_thousandth_in_loop's count
        # the largest exponent fields, all ones at NaN / Inf: the output's in its bits'
        # width (int64 for the floor's, whose abits are the golden's)
        top_a = _zero_of(abits)
        top_g = np.int64(0)
        for j in range(lo, hi):
            i = np.uint64(j)  # unsigned: no negative-index wraparound, so loads stay contiguous
            gb = gbits[i]
            gv = g[i]
            if floor_of:
                av = _rounded(gv, floor_of)
                ab = _bits(av)
            else:
                ab = abits[i]
                av = np.float64(a[i])
            if masked:  # a NaN / Inf pair as a pair of zeros, tested on the bits alone
                # (gb is left: the ULP error of d = 0 is 0 whatever its scale)
                spec = _special(ab, aexp, gb)
                av = 0.0 if spec else av
                gv = 0.0 if spec else gv
            else:
                top_a = _and_max(top_a, ab, aexp)
                top_g = max(top_g, gb & _F64_EXP)
            diff = av - gv
            d = abs(diff)
            ag = abs(gv)
            s_sq += d * d
            dot += av * gv
            aa += av * av
            gg += gv * gv
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
            ulp = _ulp_error(d, gb, mant_bits, floor_bits)
            # msprobe's error balance against the golden cast to float32 (its NumPy dtype
            # for fp32 and bf16 outputs) or to half (fp16); a block with any NaN / Inf pair
            # or a golden beyond the cast's range is counted again exactly (_eb_range)
            if eb_half:  # an actual on half's grid: av > half(g) when av > g and half(g)
                # is not av, which rounding to nearest gives where d < half an ULP, and a
                # tie (d exactly half an ULP) by the evens: each tie counts _EB_TIE, and a
                # block with one is counted again exactly, as is one whose actual is not
                # on half's grid (the pass's on_half_grid)
                off = 1.0 if ulp > 0.5 else (_EB_TIE if ulp == 0.5 else 0.0)
                eb_gt += off if av > gv else 0.0
                eb_lt += off if av < gv else 0.0
            else:
                cast = np.float64(np.float32(gv))
                eb_gt += 1.0 if av > cast else 0.0
                eb_lt += 1.0 if av < cast else 0.0
            m_ulp = _fmax(m_ulp, ulp)
            s_ulp += ulp
            n_u1 += 1.0 if ulp > 1.0 else 0.0
            sm = 1.0 if ag <= small else 0.0
            n_small += sm
            n_small_bad += sm * (1.0 if d > small_atol else 0.0)
            if ten_thousandth_in_loop:  # _block_counts' test, over the small bound
                r_ok4 += 1.0 if (ag > small) & (d < 1e-4 * (ag + eps_ms)) else 0.0
            allowed = atol + rtol * ag
            tol = d / _fmax(allowed, 1e-300)
            m_tol = _fmax(m_tol, tol)
            loud += 1.0 if d > quiet * ag else 0.0
            # per element, for the histogram and the heat map: any error beyond 1e300 is
            # 1e300, as a NaN / Inf placement mismatch's (_settle_specials)
            kept = rel if rel < 1e300 else 1e300
            # constants of the closure: a variant without stores has none. The relative
            # error's key is the histogram's (_cell_index) and its heat map's: one store
            if keep_cells:
                cells[np.uint64(j - lo)] = _heat_key(kept)
            if keep_tols:
                tols[np.uint64(j - lo)] = _heat_key(tol if tol < 1e300 else 1e300)
        if top_a == aexp or top_g == _F64_EXP:
            return True
        n = np.float64(hi - lo)
        n_u32 = 0.0  # ULP errors over 32: counted in a quiet block only where it has one
        by_slope = loud == 0.0  # every d <= fl(q |g|)
        n_loud = loud
        if not (masked or floor_of) and 0.0 < loud <= n_small and c[C_QUIET_ABS] > 0.0:
            loud = _loud_after_all(a, g, lo, hi, c)  # by small values' errors alone?
        # the ten-thousandth over the small bound as this loop counted it (fp16), or -1
        ok4_big = r_ok4 if ten_thousandth_in_loop and c[C_SPARSE] == SPARSE_BUT_1E4 \
            else -1.0
        sparse = c[C_SPARSE] == SPARSE_ALL or ok4_big >= 0.0
        if loud > 0.0 and not (masked or floor_of) and n_loud <= SPARSE_LOUD_MOST \
                and sparse:  # a few loud elements: their counts alone
            n_u32 = _sparse_loud_counts(a, g, gbits, lo, hi, c, out, ok4_big, n_small)
        elif loud > 0.0 or quiet < 0.0:  # a loud block: its counts in one loop
            n_u32 = _block_counts(a, abits, aexp, g, gbits, lo, hi, c, out, True,
                                  RATIOS_ALL, True, floor_of, masked)
        else:
            out[N_REL_BAD] = out[N_ZERO_G_BAD] = 0.0
            out[N_V2] = out[N_CASE] = n
            ratios = 0 if c[C_RATIOS] == 0.0 else RATIOS_ALL
            if c[C_RATIOS_TRIM] > 0.0 and (by_slope or c[C_QUIET_ABS] <= c[C_THOU_ATOL]):
                ratios = np.int64(c[C_RATIOS_TRIM])  # some counts known (_ratios_trimmed)
            counted = ratios
            if ten_thousandth_in_loop and ratios == RATIOS_TEN_THOUSANDTH:  # counted above
                out[N_OK_1E4] = r_ok4
                counted = 0
            if counted or m_ulp > 32.0:  # one loop for both
                n_u32 = _block_counts(a, abits, aexp, g, gbits, lo, hi, c, out, False,
                                      counted, m_ulp > 32.0, floor_of, masked)
            if ratios == 0:
                out[N_OK_1E2] = out[N_OK_1E3] = out[N_OK_1E4] = n
            elif ratios != RATIOS_ALL:  # the counts over the small bound: add the small
                out[N_OK_1E2] = n
                out[N_OK_1E3] = n if ratios == RATIOS_TEN_THOUSANDTH \
                    else out[N_OK_1E3] + n_small
                out[N_OK_1E4] += n_small
        out[N_SMALL_BAD] = n_small_bad
        out[N] = n
        out[NONFINITE_BAD] = 0.0
        out[SPECIAL_EQ] = 0.0
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
        out[MAX_REL] = m_pr
        out[MAX_TOL] = m_tol
        out[N_SHRINK] = shrink
        out[N_GROW] = grow
        out[EB_GT] = -1.0 if eb_half and max(eb_gt, eb_lt) >= _EB_TIE else eb_gt  # a tie
        out[EB_LT] = eb_lt
        out[MAX_G] = m_g
        out[ARG_ABS] = -1.0
        out[ARG_REL] = -1.0
        return False

    return _block


@njit(inline="always")
def _pair_at(a, abits, aexp, g, gbits, i, kind, masked):
    """(actual, golden, golden's bits) at i, the actual as float64: a's, or (``kind``, a
    ROUND_ kind) the golden's rounded; ``masked``: a pair that holds NaN or Inf as zeros,
    as the masked block variant takes it (the bits left: a ULP error of 0 is 0)."""
    gv, gb = g[i], gbits[i]
    av = _rounded(gv, kind) if kind else np.float64(a[i])
    if masked:
        spec = _special(abits[i], aexp, gb)
        av = 0.0 if spec else av
        gv = 0.0 if spec else gv
    return av, gv, gb


_RUN_LOUD = 256  # the elements _loud_after_all tests at once (vectorised)


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _loud_after_all(a, g, lo, hi, c):
    """1.0 when a block that its loop found loud (some d > fl(q |g|)) holds an element
    loud by C_QUIET_ABS too: a nonzero small value (0 < |g| <= small) within that offset
    is quiet (_quiet_offset); else 0.0. An fp16 output of a normal golden has a few
    subnormals in about half its blocks, whose relative errors made them loud: this test
    (runs of 256, vectorised, ending at the first loud one) spares them the loud loop.
    Asked only of a block with no more loud elements than small values: no test in the
    block's own loop (4 more instructions in 65, 2-4% of an fp32 block's time). Only the
    lean variants over an actual ask it (a block with NaN / Inf, or an fp32 floor's, whose
    offset 9.3e-10 spares little, stays loud): a fresh machine compiles it into fewer."""
    quiet, quiet_abs, small = c[C_QUIET], c[C_QUIET_ABS], c[C_SMALL]
    for start in range(lo, hi, _RUN_LOUD):
        end = min(start + _RUN_LOUD, hi)
        loud = 0.0
        for j in range(start, end):
            gv = g[np.uint64(j)]
            d = abs(np.float64(a[np.uint64(j)]) - gv)
            ag = abs(gv)
            near = (ag <= small) & (ag > 0.0)
            loud += 1.0 if d > _fmax(quiet * ag, quiet_abs if near else 0.0) else 0.0
        if loud > 0.0:
            return 1.0
    return 0.0


# The counts a block pass takes in a loop of its own, for a block whose actual is a
# (``kind`` 0) or the golden rounded as the loop goes (a ROUND_ kind: the floor's block,
# _make_block's floor_of), with NaN / Inf pairs as zeros (``masked``). Inlined in each
# block variant, with its flags constants there: each call site's loop counts only what
# it is asked

@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _block_counts(a, abits, aexp, g, gbits, lo, hi, c, out, tolerances, ratios, over,
                  kind, masked):
    """The counts of a finite block a[lo:hi] against g[lo:hi] that its block loop leaves,
    in the masked one-loop pass's expressions (tests/masked_block.py), in one loop while
    the block is in cache: ``tolerances``, msprobe's absolute threshold, CANN v2's and
    the case's tolerance and errors at a zero golden; ``ratios``, the hundredth /
    thousandth / ten-thousandth (into out; RATIOS_TRIMMED: the thousandth's and the
    ten-thousandth's tests of values over the small bound alone, RATIOS_TEN_THOUSANDTH the
    latter's, the caller knowing the rest: a quiet bf16 block 1.60 -> 1.53 ns an element,
    one thread, a block in cache); ``over``, how many ULP errors exceed 32
    (returned). A loud fp32 block with ULP errors over 32 took 2.15 ns an element with
    three loops, 2.02-2.06 with one (one thread, a block in cache). A loud block's loop
    counts these always (none where its largest ULP error is within 32): such a block
    took 1.97 with two loops, 2.02-2.06 now; a copy without the ULP test took 1.90, but
    the fourth compiled copy made a fresh machine's first compares 34-36 s, not 28-30.
    A quiet block counts its ratios and its ULP errors over 32 in one call, its modes
    taken at run time: each call site is a loop inlined into every block variant, and the
    quiet path's four (a constant mode each: 1.49 ns above) made those first compares
    40-41 s, its former two (the ratios, the ULP errors) 34-36, this one 31."""
    v2_atol, v2_rtol, atol, rtol = c[C_V2_ATOL], c[C_V2_RTOL], c[C_ATOL], c[C_RTOL]
    small, abs_rtol, eps_abs = c[C_SMALL], c[C_ABS_RTOL], c[C_EPS_ABS]
    eps_ms, thou_atol = c[C_EPS_MS], c[C_THOU_ATOL]
    mant_bits, floor_bits = _ulp_fields(c)
    n_rel_bad = n_v2 = n_case = zero_bad = 0.0
    ok_small = ok2 = ok3 = ok4 = n_over = 0.0
    for j in range(lo, hi):
        av, gv, gb = _pair_at(a, abits, aexp, g, gbits, np.uint64(j), kind, masked)
        d = abs(av - gv)
        ag = abs(gv)
        big = ag > small
        if tolerances:
            zero_bad += 1.0 if (ag == 0.0) & (d > 0.0) else 0.0
            n_rel_bad += 1.0 if big & (d > abs_rtol * (ag + eps_abs)) else 0.0
            n_v2 += 1.0 if d <= v2_atol + v2_rtol * ag else 0.0
            n_case += 1.0 if d <= atol + rtol * ag else 0.0
        if ratios:
            denom = ag + eps_ms
            if ratios == RATIOS_ALL:
                ok_small += 1.0 if (ag <= small) & (d <= thou_atol) else 0.0
                ok2 += 1.0 if big & (d < 1e-2 * denom) else 0.0
            if ratios != RATIOS_TEN_THOUSANDTH:
                ok3 += 1.0 if big & (d < 1e-3 * denom) else 0.0
            ok4 += 1.0 if big & (d < 1e-4 * denom) else 0.0
        if over:
            n_over += 1.0 if _ulp_error(d, gb, mant_bits, floor_bits) > 32.0 else 0.0
    if tolerances:
        out[N_REL_BAD] = n_rel_bad
        out[N_V2] = n_v2
        out[N_CASE] = n_case
        out[N_ZERO_G_BAD] = zero_bad
    if ratios == RATIOS_ALL:
        out[N_OK_1E2] = ok_small + ok2
        out[N_OK_1E3] = ok_small + ok3
        out[N_OK_1E4] = ok_small + ok4
    elif ratios:  # over the small bound alone
        if ratios == RATIOS_TRIMMED:
            out[N_OK_1E3] = ok3
        out[N_OK_1E4] = ok4
    return n_over


_SPARSE_RUN = 64  # the elements _sparse_loud_counts tests at once (vectorised)
SPARSE_ALL, SPARSE_BUT_1E4 = 1, 2  # C_SPARSE: what a quiet element is known to pass
SPARSE_LOUD_MOST = 1 << 11  # the most loud elements a block counts one by one (1/32 of it)


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _sparse_loud_counts(a, g, gbits, lo, hi, c, out, ok4_big, n_small):
    """A loud block's counts (_block_counts' tolerances, ratios and ULP errors over 32)
    from its loud elements alone (d > fl(q |g|)), where C_SPARSE says every quiet one
    passes each test and has a ULP error within 32: SPARSE_ALL (C_RATIOS 0: the ratio
    family is in the slope), or SPARSE_BUT_1E4 (RATIOS_TEN_THOUSANDTH: all but the
    ten-thousandth of the values over the small bound, which fp16's block loop counts
    over every element, ``ok4_big``; -1 where the slope covers it; ``n_small``: the
    block's small values). Each run of 64 elements is tested at once (vectorised); a run that holds
    a loud one is walked by its set bits, each loud element tested in _block_counts'
    expressions. For a block with few loud elements (of the fp32 blocks of an L1 run,
    59% are loud, and of those 42% hold under 1% loud elements: torch's fp32 layer_norm
    has about 100 a block), where the loop over every element counts nine tests: an fp32
    block took 1.97 ns an element that way, with 33 / 327 / 983 / 1638 loud elements
    1.42 / 1.53 / 1.70 / 1.83 (one thread, a block in cache; about 17 ns a loud element,
    so that past SPARSE_LOUD_MOST the loop is as fast). Returns how many ULP errors
    exceed 32."""
    quiet = c[C_QUIET]
    v2_atol, v2_rtol, atol, rtol = c[C_V2_ATOL], c[C_V2_RTOL], c[C_ATOL], c[C_RTOL]
    small, abs_rtol, eps_abs = c[C_SMALL], c[C_ABS_RTOL], c[C_EPS_ABS]
    eps_ms, thou_atol = c[C_EPS_MS], c[C_THOU_ATOL]
    mant_bits, floor_bits = _ulp_fields(c)
    loud = loud_small = 0.0
    n_rel_bad = n_v2 = n_case = zero_bad = ok2 = ok3 = ok4 = small_ok = n_over = 0.0
    for start in range(lo, hi, _SPARSE_RUN):
        end = min(start + _SPARSE_RUN, hi)
        some = 0.0
        for j in range(start, end):
            i = np.uint64(j)
            gv = g[i]
            some += 1.0 if abs(np.float64(a[i]) - gv) > quiet * abs(gv) else 0.0
        if some == 0.0:
            continue
        mask = np.uint64(0)
        for j in range(start, end):
            i = np.uint64(j)
            gv = g[i]
            hit = abs(np.float64(a[i]) - gv) > quiet * abs(gv)
            mask |= np.uint64(hit) << np.uint64(j - start)
        while mask:
            i = np.uint64(start + _lowest_bit(mask))
            mask &= mask - np.uint64(1)
            gv, gb = g[i], gbits[i]
            d = abs(np.float64(a[i]) - gv)
            ag = abs(gv)
            big = ag > small
            loud += 1.0
            loud_small += 0.0 if big else 1.0
            zero_bad += 1.0 if (ag == 0.0) & (d > 0.0) else 0.0
            n_rel_bad += 1.0 if big & (d > abs_rtol * (ag + eps_abs)) else 0.0
            n_v2 += 1.0 if d <= v2_atol + v2_rtol * ag else 0.0
            n_case += 1.0 if d <= atol + rtol * ag else 0.0
            denom = ag + eps_ms
            ok_small = 1.0 if (ag <= small) & (d <= thou_atol) else 0.0
            ok2 += ok_small + (1.0 if big & (d < 1e-2 * denom) else 0.0)
            ok3 += ok_small + (1.0 if big & (d < 1e-3 * denom) else 0.0)
            ok4 += ok_small + (1.0 if big & (d < 1e-4 * denom) else 0.0)
            small_ok += ok_small
            n_over += 1.0 if _ulp_error(d, gb, mant_bits, floor_bits) > 32.0 else 0.0
    passed = np.float64(hi - lo) - loud  # the quiet elements: within every test
    out[N_REL_BAD] = n_rel_bad
    out[N_V2] = passed + n_v2
    out[N_CASE] = passed + n_case
    out[N_ZERO_G_BAD] = zero_bad
    out[N_OK_1E2] = passed + ok2
    out[N_OK_1E3] = passed + ok3
    out[N_OK_1E4] = passed + ok4 if ok4_big < 0.0 \
        else ok4_big + (n_small - loud_small) + small_ok  # every quiet small value within
    return n_over


# the variants in use (each compiled when first called): the kernel's with a heat map of
# allclose's measure or of the relative error, with the histogram alone, and metrics
# alone; the floor's (the histogram's cells, or nothing), over a rounded golden or (fp32)
# rounding it on the fly; and the kernel's for fp16, whose error balance is against the
# golden cast to half and whose loop counts the ten-thousandth. Module globals, so that a
# pass calling them is cached (numba caches no function that holds a compiled one in a
# closure)
_block_tols = _make_block(True, True, False)
_block_cells = _make_block(False, True, False)
_block_rels = _block_cells  # the relative errors' heat map reads the cells' keys
_block_metrics = _make_block(False, False, False)
_half_block_tols = _make_block(True, True, True, ten_thousandth_in_loop=True)
_half_block_cells = _make_block(False, True, True, ten_thousandth_in_loop=True)
_half_block_rels = _half_block_cells
_half_block_metrics = _make_block(False, False, True, ten_thousandth_in_loop=True)
_floor_f32_cells = _make_block(False, True, False, ROUND_F32)
_floor_f32_metrics = _make_block(False, False, False, ROUND_F32)
# and each with NaN / Inf pairs taken as zeros, for a block that holds one
_masked_tols = _make_block(True, True, False, masked=True)
_masked_cells = _make_block(False, True, False, masked=True)
_masked_rels = _masked_cells
_masked_metrics = _make_block(False, False, False, masked=True)
_masked_half_tols = _make_block(True, True, True, masked=True)
_masked_half_cells = _make_block(False, True, True, masked=True)
_masked_half_rels = _masked_half_cells
_masked_half_metrics = _make_block(False, False, True, masked=True)


_ROW_MAXIMA_MOST = 2048  # the widest rows whose column maxima _heat_range keeps (windows
# of 64 columns at most); at [7168, 4096] (windows of 128) the column maxima took 2.4 / 3.5
# ms of heat map, window by window 2.4 / 1.9 (two rounds)


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _heat_range(vals, first, rows, cols, starts, ends, grid):
    """Adds vals (the errors' keys, _heat_key, of elements first, first + 1, ... of a
    rows x cols tensor) to the heat map's maxima: grid[i, w] is the largest key in the
    rows with row * n_row_bins // rows == i and the columns of window w, [starts[w],
    ends[w]) (the windows of adaptive max pooling, which overlap when they do not divide
    cols)."""
    gr, gc = grid.shape[0], grid.shape[1]
    m = vals.shape[0]
    last = first + m
    if cols <= _ROW_MAXIMA_MOST:
        # per row bin (a run of whole rows, so one flat range [k, e)): each column's
        # maximum, then the windows over those column maxima. Window by window (below),
        # narrow windows made the heat map 2.1 of 8.6 ms of a bf16 [2, 4096, 8, 64]
        # output's plot data (windows of 2), 0.67 of 2.4 of an fp32 [1024, 1024] one's
        colmax = np.zeros(cols, dtype=np.uint32)
        acc = np.empty(_NARROW_RUN - _NARROW_RUN % cols if cols < _NARROW_ROWS else 0,
                       dtype=np.uint32)
        k = first
        while k < last:
            i = (k // cols) * gr // rows
            e = min(last, (((i + 1) * rows + gr - 1) // gr) * cols)  # row bin i's end
            if cols < _NARROW_ROWS:  # narrow rows: runs of whole rows, one vectorised
                _narrow_column_maxima(vals, k - first, e - first, k % cols, colmax, acc)
            else:  # row by row, one vectorised max of the row into the columns'
                colmax[:] = 0
                j = k
                while j < e:
                    c0 = j % cols
                    c1 = min(cols, c0 + (e - j))
                    at = j - first - c0  # vals index of this row's column 0
                    for col in range(c0, c1):
                        colmax[np.uint64(col)] = max(colmax[np.uint64(col)],
                                                     vals[np.uint64(at + col)])
                    j += c1 - c0
            _flush_columns(colmax, starts, ends, grid[i])
            k = e
        return
    done = 0  # wide rows: each window's part of a row is one vectorised max
    while done < m:
        r = (first + done) // cols
        c0 = first + done - r * cols
        c1 = min(cols, c0 + (m - done))
        at = done - c0  # vals index of this row's column 0
        i = r * gr // rows
        for w in range(gc):
            s, e = max(starts[w], c0), min(ends[w], c1)
            if s < e:
                top = np.uint32(0)
                for col in range(s, e):
                    top = max(top, vals[np.uint64(at + col)])
                grid[i, w] = max(grid[i, w], top)
        done += c1 - c0


_NARROW_ROWS = 128  # rows narrower than this: column maxima over runs of whole rows
_NARROW_RUN = 512  # the elements a run holds at most (whole rows of the narrow ones)


@njit(cache=True, nogil=True, error_model="numpy")
def _narrow_column_maxima(vals, lo, hi, phase, colmax, acc):
    """colmax[col] = the largest of vals[lo:hi] in column col (vals[lo] in column
    ``phase``), for rows narrower than _NARROW_ROWS: the range in runs of acc's length (a
    multiple of the row's width, so acc[l] is always column (phase + l) % cols), each run
    one vectorised max into acc, acc folded into the columns at the end (one thread, a
    block in cache): rows 2 and 4 wide 0.55 ns an element (a strided walk per column)
    -> 0.06-0.07, 64 wide 0.105 (row by row) -> 0.066, against 0.04-0.06 for rows 1
    or 4096 wide."""
    cols = colmax.shape[0]
    if cols == 1:  # one column: a max held in registers
        top = np.uint32(0)
        for j in range(lo, hi):
            top = max(top, vals[np.uint64(j)])
        colmax[0] = top
        return
    # no longer than the range's whole rows: a small output's row bin of a row or two
    # zeroed and folded all 512 (fp32 [64, 64] measure_all with the allclose heat map
    # 177-185 us before the runs, 220-259 so, 188-209 now; one process, noisy)
    run = min(acc.shape[0], -(-(hi - lo) // cols) * cols)
    acc[:run] = 0
    j = lo
    while j + run <= hi:
        for q in range(run):
            acc[np.uint64(q)] = max(acc[np.uint64(q)], vals[np.uint64(j + q)])
        j += run
    for q in range(hi - j):
        acc[np.uint64(q)] = max(acc[np.uint64(q)], vals[np.uint64(j + q)])
    colmax[:] = 0
    for q in range(run):
        col = (phase + q) % cols
        colmax[col] = max(colmax[col], acc[np.uint64(q)])


@njit(cache=True, nogil=True, error_model="numpy")
def _flush_columns(colmax, starts, ends, cells):
    """One row bin's cells: the largest column maximum in each window."""
    for w in range(cells.shape[0]):
        for col in range(starts[w], ends[w]):
            cells[w] = max(cells[w], colmax[col])


_ROUND_MAGIC = 6755399441055744.0  # 1.5 * 2^52: adding and subtracting it rounds to an integer


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _round_range(g, gbits, lo, hi, rp, r):
    """r[j - lo] = g[j] rounded once, to nearest with ties to even, to a format of rp[0]
    significand bits, smallest normal exponent rp[1] and largest finite rp[2] (IEEE:
    subnormals, overflow to inf); float64 (53 bits) is copied. Not fast-math: g may hold
    NaN and Inf, which pass through, and the rounding relies on exact float addition."""
    bits, emin, vmax = np.int64(rp[0]), np.int64(rp[1]), rp[2]
    if bits >= 53:
        for j in range(lo, hi):
            r[np.uint64(j - lo)] = g[np.uint64(j)]
        return
    for j in range(lo, hi):
        i = np.uint64(j)  # unsigned indices: no wraparound test, so the loop vectorises
        x = g[i]
        e = ((gbits[i] >> 52) & 0x7FF) - 1023  # floor(log2|x|) for a normal float64
        e = e if e > emin else emin
        shift = e - (bits - 1)  # x / 2^shift has its units digit at the format's last bit
        y = x * _as_float((1023 - shift) << 52)  # exact: a power of two, |y| < 2^bits
        y = (y + _ROUND_MAGIC) - _ROUND_MAGIC  # to an integer, ties to even (|y| < 2^51)
        y = y * _as_float((shift + 1023) << 52)
        y = np.inf * np.sign(x) if abs(y) > vmax else y
        r[np.uint64(j - lo)] = np.copysign(y, x) if abs(x) < np.inf else x


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _eb_against(x, cast, out):
    """msprobe's error balance counts of x against its cast golden, already rounded:
    out[0] += #(x > cast), out[1] += #(x < cast) (NaN on either side counts in neither)."""
    gt = lt = 0
    for j in range(x.shape[0]):
        i = np.uint64(j)
        xv = np.float64(x[i])
        gt += 1 if xv > cast[i] else 0
        lt += 1 if xv < cast[i] else 0
    out[0] += gt
    out[1] += lt


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _eb_range(x, g, gbits, lo, hi, rp, out, cast):
    """msprobe's error balance counts of x[0:hi-lo] against g[lo:hi] cast to msprobe's
    NumPy dtype: out[0] += #(x > cast), out[1] += #(x < cast). float32 and half by
    _rounded as the loop goes (the hardware's conversion, not fast-math: NaN, Inf and
    overflow as IEEE says; 0.73 -> 0.16 ns an element, with a NaN every 1009), another
    format rounded by rp into ``cast`` (hi - lo long) first."""
    kind = 0
    if rp[1] == -126.0 and rp[0] == 24.0:
        kind = ROUND_F32
    elif rp[1] == -14.0 and rp[0] == 11.0:
        kind = ROUND_F16
    if kind == 0:
        _round_range(g, gbits, lo, hi, rp, cast)
        _eb_against(x[:hi - lo], cast, out)
        return
    gt = lt = 0
    for j in range(hi - lo):
        xv = np.float64(x[np.uint64(j)])
        cv = _rounded(g[np.uint64(lo + j)], kind)
        gt += 1 if xv > cv else 0
        lt += 1 if xv < cv else 0
    out[0] += gt
    out[1] += lt


_UNSETTLED = (-1, -1)  # _eb_of_block: a block's NaN / Inf pairs not counted apart


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _eb_at_spots(x, g, spots, k, half):
    """msprobe's error balance counts (#(x > cast), #(x < cast)) of a block's k NaN / Inf
    pairs (spots from _special_spots; the block's own counts took them as pairs of zeros,
    which count in neither), against g cast to float32 or (``half``) IEEE half as NumPy
    casts it: an Inf larger or smaller by its sign, a NaN neither, an overflow an Inf."""
    gt = lt = 0
    kind = ROUND_F16 if half else ROUND_F32
    for m in range(k):
        j = np.uint64(spots[m] >> 1)
        xv, cv = np.float64(x[j]), _rounded(g[j], kind)
        gt += 1 if xv > cv else 0
        lt += 1 if xv < cv else 0
    return gt, lt


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _eb_of_block(x, g, gbits, lo, hi, rp_eb, counts, half_counts, out, cast, rounded,
                 at_specials):
    """The error balance counts of a block: the block pass's own (``counts``, against
    float32(g), or half(g) when ``half_counts``: an actual on half's grid, its block
    without a rounding tie, EB_GT -1 there) where msprobe's dtype is that cast's and
    the finite pairs' golden is inside its range, every pair finite or its NaN / Inf pairs
    counted apart (``at_specials``, _eb_at_spots: a block with a NaN every 1009 took 0.19
    ns an element in _eb_range; _UNSETTLED where they were not); else against ``rounded``
    (the golden already rounded to msprobe's dtype, when not empty), else counted exactly
    here (_eb_range)."""
    clean = counts[NONFINITE_BAD] == 0.0 and counts[SPECIAL_EQ] == 0.0
    settled = (clean or at_specials[0] >= 0) and counts[EB_GT] >= 0.0
    if settled and ((rp_eb[0] == 24.0 and not half_counts and counts[MAX_G] <= _FLT_MAX)
                    or (rp_eb[0] == 11.0 and half_counts and counts[MAX_G] <= 65504.0)):
        out[0] += np.int64(counts[EB_GT]) + (0 if clean else at_specials[0])
        out[1] += np.int64(counts[EB_LT]) + (0 if clean else at_specials[1])
    elif rounded.shape[0] > 0:
        _eb_against(x, rounded, out)
    else:
        _eb_range(x, g, gbits, lo, hi, rp_eb, out, cast)


_ROUNDED_RUN = 256  # the elements _is_rounded_golden tests at once (vectorised)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _is_rounded_golden(x, g, kind, nan_alike):
    """Whether the output block x is g rounded once into the format of ``kind`` (a ROUND_
    kind), bit for bit (the sign of a zero too; ``nan_alike``, a block with NaN / Inf: a
    NaN of any sign or payload where the rounded golden is NaN, as the figures see every
    NaN alike, tested only in a run whose bits differ somewhere): a correctly rounded
    block, whose error floor is its own figures. Asked only of a block whose finite pairs'
    ULP errors are all within half of one, as a correctly rounded block's are, which a
    kernel rounding twice (float64 to float32 to bf16, as torch's .to(bfloat16) does)
    passes too: run by run, so that such a block stops at its first run that differs
    (bf16 [7168, 4096] of torch's .to: 0.60 ns an element over the whole block)."""
    n = x.shape[0]
    for lo in range(0, n, _ROUNDED_RUN):
        hi = min(lo + _ROUNDED_RUN, n)
        same = 0
        for j in range(lo, hi):
            i = np.uint64(j)
            same += 1 if _bits(np.float64(x[i])) == _bits(_rounded(g[i], kind)) else 0
        if same == hi - lo:
            continue
        if not nan_alike:
            return False
        same = 0
        for j in range(lo, hi):
            i = np.uint64(j)
            xv, rv = np.float64(x[i]), _rounded(g[i], kind)
            same += 1 if (_bits(xv) == _bits(rv)) | ((xv != xv) & (rv != rv)) else 0
        if same != hi - lo:
            return False
    return True


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _zeros_signed_as_golden(x, xbits, gbits):
    """Whether every zero of x has its golden's sign (float32(g) keeps g's sign, a -0.0
    golden's and one that underflows alike): all that is left to test of an fp32 block
    whose error balance counts say each value is float32(g). The zeros are counted on x
    alone first (0.05 ns an element; with the golden's signs read too, 0.13-0.16)."""
    zeros = 0
    for j in range(x.shape[0]):
        zeros += 1 if x[np.uint64(j)] == 0 else 0
    if zeros == 0:
        return True
    for j in range(x.shape[0]):
        i = np.uint64(j)
        if x[i] == 0 and (xbits[i] < 0) != (gbits[i] < 0):
            return False
    return True


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _own_floor(ob, x, xbits, g, gbits, kind, clean, eb_half, on_grid):
    """Whether the kernel's block x (its figures ob; ``clean``: no NaN / Inf pair) is the
    golden g rounded once into the format of ``kind`` (a ROUND_ kind, 0 none), bit for
    bit: its floor's figures are then its own. Only a block whose ULP errors are all
    within half of one can be. A clean fp32 block's error balance counts, against
    float32(g) (``eb_half`` False), already say whether every value is float32(g): only
    the sign of a zero is left to test (fp32 [7168, 4096]: 0.19 -> 0.05 ns an element,
    against _is_rounded_golden's). So does a clean block of values of that format
    (``on_grid``: a bf16 / fp16 output's own bits) whose ULP errors are all under 0.5."""
    if kind == 0 or ob[MAX_ULP] > 0.5:
        return False
    if kind == ROUND_F32 and clean and not eb_half:
        return ob[EB_GT] == 0.0 and ob[EB_LT] == 0.0 \
            and _zeros_signed_as_golden(x, xbits, gbits)
    if on_grid and clean and ob[MAX_ULP] < 0.5:
        # every value of the format strictly within half an ULP of its golden (the
        # spacing of the golden's binade, floored at min_exp): no other value of the
        # format is that near, the nearest (the rounding) is, so each is the rounding;
        # a d rounded in float64 reaches 0.5 only from 0.5 or above. Left: the zeros'
        # signs. [7168, 4096] metrics with the floor, bf16 34.7-37.6 -> 27.6-28.9 ms
        # (26.0-29.0 without it), fp16 37.8 -> 31.9-32.3 (27.5-30.5); two runs each
        return _zeros_signed_as_golden(x, xbits, gbits)
    return _is_rounded_golden(x, g, kind, not clean)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _round_into(g, gbits, lo, hi, rp, kind, r):
    """r[j - lo] = g[j] rounded once to the output's format: by _rounded (``kind``) or by
    the general rounding (rp)."""
    if kind:
        _rounded_range(g, lo, hi, kind, r)
    else:
        _round_range(g, gbits, lo, hi, rp, r)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _rounded_range(g, lo, hi, kind, r):
    """r[j - lo] = g[j] rounded once into the format of ``kind`` (_rounded), as float64."""
    for j in range(lo, hi):
        r[np.uint64(j - lo)] = _rounded(g[np.uint64(j)], kind)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _exact_code(av, gv, base, t1, t2):
    """The histogram code of one finite element, exactly: the bin from the binary exponent
    of d / (|g| + 1e-7) and at most two thresholds in its octave (tables built from log10
    itself, so the bins are those of floor((log10(rel) - BIN_LO) * 4))."""
    rel = abs(av - gv) / (abs(gv) + 1e-7)
    if rel == 0.0:
        return ZERO_CODE
    e = np.uint64((_bits(rel) >> 52) & 0x7FF)
    k = base[e] + (1 if rel >= t1[e] else 0) + (1 if rel >= t2[e] else 0)
    return k if k <= OVER_CODE else OVER_CODE


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _count_cells(kept, x, g, lo, table, base, t1, t2, flagged, out, kind, next_g,
                 next_a):
    """Adds the histogram of one block's relative errors to out (histbins: the bins, then
    zero, under, over), from their table cells (kept[j] for x[lo + j] against g[lo + j],
    as the block pass keeps them): the bin of each is its cell's; an element whose cell
    holds a bin edge (or touches one) is binned exactly from the element itself
    (_exact_code), afterwards. ``kind`` (a ROUND_ kind, else 0): x is not read, the
    element is g[lo + j] rounded so (the floor's, rounded on the fly).

    ``next_g`` / ``next_a`` (the golden and the actual's bytes of the block this thread
    most likely takes next, or empty): fetched a line a step (_prefetch), so that the
    memory works while this loop does. The vectorised block loop left to fetch its own read a bf16 block at
    2.63-2.75 TSC cycles an element, against 1.86-1.88 with it fetched here, which cost
    this loop 0.95-0.99 -> 1.14-1.19 (one thread, one upcast, block loop and count a
    block, side by side)."""
    fetch = next_g.shape[0] > 0
    last_a = np.uint64(max(next_a.shape[0], 1) - 1)
    q = np.zeros((8, 256), dtype=np.int32)  # eight sets of counters: no queueing on one
    n_flagged = 0
    m = kept.shape[0]
    # eight elements a step, each into its own set, their keys read two to an 8-byte word
    # (_cell_index: a shift and a mask each), one test for a FLAG (0xFF, the only code
    # with bit 7) among them: 0.341-0.394 -> 0.287-0.296 ns an element, against four a
    # step from 4-byte reads (one thread, a block in cache, side by side)
    words = kept[:m & ~7].view(np.uint64)
    low = np.uint64(CELL_SHIFT - HEAT_KEY_SHIFT)  # the first key's cell: (w >> low) & mask
    high = np.uint64(32 + CELL_SHIFT - HEAT_KEY_SHIFT)  # the second's: w >> high
    mask = np.uint64(N_CELLS - 1)
    for s in range(m >> 3):
        j = np.uint64(4 * s)
        if fetch:  # the golden's line of eight elements, and as many of the actual's
            _prefetch(next_g, min(np.uint64(8 * s), np.uint64(next_g.shape[0] - 1)))
            _prefetch(next_a, min(np.uint64(64 * s), last_a))
        w0, w1 = words[j], words[j + np.uint64(1)]
        w2, w3 = words[j + np.uint64(2)], words[j + np.uint64(3)]
        k0 = np.uint64(table[(w0 >> low) & mask])
        k1 = np.uint64(table[w0 >> high])
        k2 = np.uint64(table[(w1 >> low) & mask])
        k3 = np.uint64(table[w1 >> high])
        k4 = np.uint64(table[(w2 >> low) & mask])
        k5 = np.uint64(table[w2 >> high])
        k6 = np.uint64(table[(w3 >> low) & mask])
        k7 = np.uint64(table[w3 >> high])
        q[0, k0] += 1
        q[1, k1] += 1
        q[2, k2] += 1
        q[3, k3] += 1
        q[4, k4] += 1
        q[5, k5] += 1
        q[6, k6] += 1
        q[7, k7] += 1
        if (k0 | k1 | k2 | k3 | k4 | k5 | k6 | k7) & np.uint64(0x80):  # rare (under 1%
            # of the elements of a rounding's errors)
            for e, k in ((0, k0), (1, k1), (2, k2), (3, k3), (4, k4), (5, k5), (6, k6),
                         (7, k7)):
                if k == FLAG:
                    flagged[np.uint64(n_flagged)] = 8 * s + e
                    n_flagged += 1
    for j in range(m & ~7, m):  # the last few
        code = np.uint64(table[_cell_index(kept[np.uint64(j)])])
        q[0, code] += 1
        if code == FLAG:
            flagged[np.uint64(n_flagged)] = j
            n_flagged += 1
    for f in range(n_flagged):
        j = np.uint64(flagged[np.uint64(f)])
        gv = g[np.uint64(lo) + j]
        xv = _rounded(gv, kind) if kind else np.float64(x[np.uint64(lo) + j])
        q[0, np.uint64(_exact_code(xv, gv, base, t1, t2))] += 1
    counts = np.zeros(ZERO_CODE + 1, dtype=np.int64)  # the codes (FLAG's entries: none
    for e in range(8):  # left, each binned again above)
        for k in range(ZERO_CODE + 1):
            counts[k] += q[e, k]
    for k in range(N_BINS_):
        out[k] += counts[k + 1]
    out[N_BINS_] += counts[ZERO_CODE]
    out[N_BINS_ + 1] += counts[0]
    out[N_BINS_ + 2] += counts[OVER_CODE]


# what the kernel's block pass keeps (rels, tols, cells), by what the caller asks for
KEEP = {"tol": (False, True, True), "rel": (True, False, True), "hist": (False, False, True),
        "none": (False, False, False)}
_KEEP_FLAGS = {k: np.array(v, dtype=np.int64) for k, v in KEEP.items()}  # the pass's keep


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _upcast_into(src, dst, half):
    """dst = the bf16 (or ``half``: IEEE half) output block of bits src, upcast to
    float32 exactly: in the pass, each block by the thread that measures it, while it
    goes into cache anyway."""
    if half:
        for j in range(src.shape[0]):
            dst[np.uint64(j)] = _f32_of_16(src[np.uint64(j)], True)
    else:
        for j in range(src.shape[0]):
            dst[np.uint64(j)] = _f32_of_16(src[np.uint64(j)], False)


@njit(cache=True, nogil=True, error_model="numpy")
def _touch(xbits, ybits):
    """Reads one word of each 64-byte line of a block's output bits and golden bits, so
    that the block loop finds them in cache (_make_pass's touch_first): independent loads,
    many in flight, where the block loop's own (65 instructions per 8 elements) leave the
    memory idle on a machine whose prefetchers do not run ahead of it. Returns the words
    OR'd, which the caller keeps, so that the loads stay."""
    acc = np.int64(0)
    step = 64 // xbits.itemsize
    for j in range(0, xbits.shape[0], step):
        acc |= np.int64(xbits[np.uint64(j)])
    for j in range(0, ybits.shape[0], 8):
        acc |= ybits[np.uint64(j)]
    return acc


# _make_pass's touch: state[0] the way learned (-1 none yet, 0 the block loop reading
# the data as it goes, 1 each block touched first), state[1] 1 when that way is fixed
# (benchmarks and tests set it; else each large pass times both ways on its first blocks)
TOUCH_STATE = np.array([-1, 0], dtype=np.int64)
TOUCH_TRIALS = 4  # the blocks a thread times each way before it picks one
TOUCH_MIN_BLOCKS = 4 * TOUCH_TRIALS  # the fewest blocks a thread takes for it to time
TOUCH_RETIME = 16  # once a way is learned, every 16th pass times both again (_touch_of)
_TOUCH_PASSES = itertools.count()


@intrinsic
def _lowest_bit(typingctx, mask):
    """The index of the lowest set bit of a non-zero uint64 (llvm.cttz)."""
    sig = types.int64(types.uint64)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(1)])
        fn = builder.module.declare_intrinsic("llvm.cttz", [ir.IntType(64)], fnty)
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 1)])

    return sig, codegen


@njit(inline="always")
def _same_special(xb, xexp, xman, gb):
    """Whether a pair that holds NaN or Inf (_special) is the same NaN or the same signed
    Inf, from the bits (the actual's exponent and significand masks of its format), rather
    than a placement mismatch."""
    x_spec, g_spec = (xb & xexp) == xexp, (gb & _F64_EXP) == _F64_EXP
    x_nan, g_nan = x_spec and (xb & xman) != 0, g_spec and (gb & _F64_MAN) != 0
    return (x_nan and g_nan) or (x_spec and g_spec and not x_nan and not g_nan
                                 and (xb < 0) == (gb < 0))


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _special_spots(x, xbits, xexp, xman, g, gbits, spots):
    """Where the pairs that hold NaN or Inf are, for the masked block variant (which takes
    them as pairs of zeros, adding nothing to a sum or maximum) and _settle_specials:
    spots[k] = 2 j + 1 for the k-th such pair at j when it is a placement mismatch, 2 j
    when it is the same NaN or the same signed Inf. Returns how many there are. Each run
    of 64 elements is counted at once (vectorised); a run that holds one is walked by its
    set bits. (A finite copy of the block for the lean variant took 1.0 ns an element
    with a NaN every 1009, 0.6 of it the copy's.)"""
    n = x.shape[0]
    k = 0
    for lo in range(0, n, 64):
        hi = min(lo + 64, n)
        some = 0
        for j in range(lo, hi):
            i = np.uint64(j)
            some += np.int64(_special(xbits[i], xexp, gbits[i]))
        if some == 0:
            continue
        mask = np.uint64(0)
        for j in range(lo, hi):
            i = np.uint64(j)
            mask |= np.uint64(_special(xbits[i], xexp, gbits[i])) << np.uint64(j - lo)
        while mask:
            j = lo + _lowest_bit(mask)
            mask &= mask - np.uint64(1)
            same = _same_special(np.int64(xbits[j]), xexp, xman, gbits[j])
            spots[k] = 2 * j + (0 if same else 1)
            k += 1
    return k


_FAR = 1e300  # the error kept for a placement mismatch: larger than any other
_FAR_KEY = np.uint32((np.float64(_FAR).view(np.int64) + _KEY_ROUNDING)
                     >> HEAT_KEY_SHIFT)  # _heat_key


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _settle_specials(out, spots, k, rels, tols, cells):
    """A block's figures from the masked variant (NaN / Inf pairs as zeros; spots from
    _special_spots) made the block's own: its k NaN / Inf pairs counted as such rather than
    as pairs of zeros (each had added one to the finite pairs, the small values and every
    within-tolerance count), and a placement mismatch's kept error the largest (an equal NaN
    / Inf's is 0, as the zeros gave). rels, tols (their heat-map keys), cells: empty when
    not kept."""
    bad = 0.0
    for m in range(k):
        if spots[m] & 1:
            bad += 1.0
            j = spots[m] >> 1
            if rels.shape[0]:
                rels[j] = _FAR_KEY
            if tols.shape[0]:
                tols[j] = _FAR_KEY
            if cells.shape[0]:
                cells[j] = _FAR_KEY
    for slot in (N, N_SMALL, N_OK_1E2, N_OK_1E3, N_OK_1E4, N_V2, N_CASE):
        out[slot] -= k
    out[NONFINITE_BAD] = bad
    out[SPECIAL_EQ] = k - bad


@functools.cache
def _make_pass(eb_half: bool):
    """The whole pass over a chunk, compiled per error balance cast (``eb_half``: fp16, a
    constant of the closure: numba compiles only the block variants of that cast). What
    the kernel's block keeps (``keep``: a KEEP entry, rels / tols / cells, as 0 / 1) is
    taken at run time, a branch a block: compiled per KEEP key as well, the passes cost a
    fresh machine's cold L0 run (-n 0) 94.2 s of compiling in 114.8 s, one pass per cast
    66.6 of 83.1 s, while a first fp32 compare, which now compiles every kept-errors block
    variant at once, went 27.0 -> 39.5 s (fp16's next 7.2 -> 14.2). The floor's block keeps
    the cells when the kernel's does (the histograms), else nothing.

    One call walks one thread's blocks (``t``); block_threads runs a call a thread, the
    pass being nogil. As one parallel=True function (a prange over the threads), each
    pass cost numba's parfor compilation besides: a fresh machine's first fp32 compare
    compiled that pass in 18.7 s, this one in 5.5 (_pass alone, of 50 and 38 s in all)."""

    @njit(cache=True, nogil=True, error_model="numpy")
    def _pass(t, a, abits, aexp, aman, g, gbits, c, rp, rp_eb, out, out_f, hist, eb, cells,
              base, t1, t2, heat, where, starts, ends, scratch, cells_of, flagged_of,
              floor_kind, a16, up_of, up_bits_of, up_half, touch, keep,
              next_block):
        """Per block: the kernel's metrics and error balance counts, then (out_f not
        empty) the golden rounded to the output dtype and its metrics and counts, then
        (hist not empty) both histograms and (heat not empty) the kernel's heat map, all
        while the block is in cache. eb[b] holds the kernel's counts (0, 1) and the
        floor's (2, 3); heat[t] the heat map's maxima over thread t's blocks. where:
        the chunk's first element, the tensor's rows and columns, and 1 when the heat
        map shows allclose's d / (atol + rtol |g|) rather than the relative error,
        then 1 when the block's last count fetches the next block (_fetches_ahead), then
        1 for the floor alone (measure_floor: no kernel's output; a and a16 empty, and
        out, eb's kernel counts and hist's are not written).
        Each thread takes the next block no thread has taken (``next_block``, a counter
        all share, _claim) with buffers of its own (the rounded golden, msprobe's cast
        golden; the errors' table cells and heat-map keys; the histogram's flagged elements
        and a block's NaN / Inf spots), made once per call: a fresh 512 KiB array per
        block was a fresh mapping, paid for in page faults. Every figure is kept per block
        and combined in block order, so which thread took a block changes nothing. Taken
        as they come rather than every n_threads-th from the t-th: a thread that shares
        its core (torch's OpenMP threads spinning for a while after the op before the
        compare, another worker's pass) no longer holds the call up while the other
        waits; metrics fp32 [7168, 4096] right after a torch sum, best / median of 12,
        15.7 / 18.2 -> 12.2 / 13.8 ms (10.0 / 10.3 alone).

        Every block goes through the lean variant: a block with NaN or Inf through its
        masked twin, which takes those pairs as zeros (_special_spots, _settle_specials),
        and so does the thread's next block, where NaN / Inf spread through a tensor would
        make the try on the block itself a waste. ``floor_kind``: the output's ROUND_ kind
        (else 0: _round_range rounds the floor). An fp32 floor's block rounds the golden as
        it goes where the kernel's block has no NaN / Inf; the rounded golden is written out
        (r) only where something must read it again: NaN / Inf (the golden's, or a finite
        one the rounding overflows) or another format. A bf16 / fp16 output comes as its
        bits (a16; a and abits empty): each block is upcast into the thread's row of up_of
        (up_bits_of: its bits) first (``up_half``: IEEE half).

        ``touch`` (TOUCH_STATE or a copy, _touch_of): whether each block's output and
        golden are read one word a line first (_touch) before the block loop reads them.
        On a machine whose prefetchers keep up with the loop that costs a read of the block
        (~0.1 ns an element in cache, more from memory); on one whose don't, where the loop
        read fp32 [7168, 4096] at 4.3-4.9 ns an element against 1.7 in cache (one thread),
        it brings the loop's time near the latter: metrics 64-73 -> 39-43 ms, with the floor
        and plot data 86-92 -> 55-60 (two threads). Unless fixed (touch[1] 1), each thread
        with at least TOUCH_MIN_BLOCKS blocks times both ways (the block's read and the
        kernel's block loop, rdtsc) on TOUCH_TRIALS blocks each and takes the touch for
        the rest where it saves 1/16 or more, and leaves its pick in touch[0], which a pass
        that does not time (too few blocks, or _touch_of's fixed copy) follows. A block
        that goes straight to the masked twin (after one with NaN / Inf) is not touched:
        that loop's slower arithmetic keeps up with the memory (bf16 with a NaN every 1009
        elements: metrics 4.3x the memory floor untouched, 4.5x touched)."""
        # keep[0] (the relative errors' heat map) reads the cells' keys: no store of its own
        keep_tols, keep_cells = keep[1] == 1, keep[2] == 1
        n = g.shape[0]
        upcast = a16.shape[0] > 0
        floor = out_f.shape[0] > 0
        counts = hist.shape[0] > 0
        heats = heat.shape[0] > 0
        fetch_next = where[4] == 1  # the next block fetched ahead (_fetches_ahead)
        floor_only = where[5] == 1  # no kernel's block: the floor's figures alone
        same_format = rp[0] == rp_eb[0]  # the floor is exactly msprobe's cast golden
        # the half block's error balance counts hold for an actual on half's grid alone
        on_half_grid = eb_half and upcast and up_half
        # the actual's values are the floor's format's (its bf16 / fp16 bits upcast)
        on_grid = upcast and (floor_kind == (ROUND_F16 if up_half else ROUND_BF16))
        first, rows, cols, by_tol = where[0], where[1], where[2], where[3] == 1
        n_threads = scratch.shape[0]
        n_blocks = out.shape[0]

        def kernel_block(x, xbits, y, ybits, ob, tols, kept, masked):
            """The kernel's lean block variant (``masked``: its masked twin), for what the
            pass keeps: True when the block holds NaN / Inf."""
            args = (x, xbits, aexp, aman, y, ybits, 0, x.shape[0], c, ob, kept[:0], tols,
                    kept)
            if masked:
                if eb_half:
                    if keep_tols:
                        return _masked_half_tols(*args)
                    if keep_cells:
                        return _masked_half_cells(*args)
                    return _masked_half_metrics(*args)
                if keep_tols:
                    return _masked_tols(*args)
                if keep_cells:
                    return _masked_cells(*args)
                return _masked_metrics(*args)
            if eb_half:
                if keep_tols:
                    return _half_block_tols(*args)
                if keep_cells:
                    return _half_block_cells(*args)
                return _half_block_metrics(*args)
            if keep_tols:
                return _block_tols(*args)
            if keep_cells:
                return _block_cells(*args)
            return _block_metrics(*args)

        def floor_block(x, xbits, y, ybits, ob, tols, kept, masked):
            """The floor's lean block variant over the rounded golden x (``masked``: its
            masked twin): the cells when the kernel keeps them."""
            args = (x, xbits, _F64_EXP, _F64_MAN, y, ybits, 0, x.shape[0], c, ob, kept[:0],
                    tols, kept)
            if masked:
                if keep_cells:
                    return _masked_cells(*args)
                return _masked_metrics(*args)
            if keep_cells:
                return _block_cells(*args)
            return _block_metrics(*args)

        def floor_on_the_fly(y, ybits, ob, tols, kept):
            """The floor's lean block variant rounding the golden y to float32 itself."""
            args = (y, ybits, _F64_EXP, _F64_MAN, y, ybits, 0, y.shape[0], c, ob, kept[:0],
                    tols, kept)
            if keep_cells:
                return _floor_f32_cells(*args)
            return _floor_f32_metrics(*args)

        fixed = touch[1] == 1
        # block_threads runs one call a thread; each claims its blocks as it goes
        try_clean = True
        flagged = flagged_of[t]
        # the way this thread reads its blocks: timed both ways on its first blocks
        # where it takes enough of them (and the way is not fixed), else as learned
        timing = not fixed and not floor_only and n_blocks // n_threads >= TOUCH_MIN_BLOCKS
        touch_first = touch[0] == 1 and not floor_only
        spent = np.zeros(2, dtype=np.int64)  # cycles over each way's trial blocks
        sink = np.int64(0)  # the touched words, OR'd: kept below, so the loads stay
        kb = -1  # the thread's kb-th block

        def upcoming():
            """The golden and the actual's bytes of the block this thread will most
            likely take next, fetched while this one's last count runs (_count_cells'
            next_g / next_a): the next one no thread has taken, read and not claimed, as
            the thread ending its block is most often the first to claim again. Claimed
            ahead, a pass of a few blocks went to the thread that started first (fp32
            [2, 65536] compare 281-299 -> 370-380 us) and a thread slowed by torch's
            spinning OpenMP threads would hold a block the other could take; read, a
            wrong guess costs only a fetch the other thread may use (the L3 is shared)."""
            nb = next_block[0] if fetch_next else n_blocks
            nlo = nb * BLOCK if nb < n_blocks else 0
            nhi = min(nlo + BLOCK, n) if nb < n_blocks else 0
            return g[nlo:nhi], (a16[nlo:nhi].view(np.uint8) if upcast
                                else a[nlo:nhi].view(np.uint8))

        while True:
            b = _claim(next_block)  # the next block no thread has taken
            if b >= n_blocks:
                break
            kb += 1
            # the first block untimed (the buffers' first use), then each way in turn
            trial = timing and 1 <= kb <= 2 * TOUCH_TRIALS
            if trial:
                touch_first = (kb & 1) == 1
            elif timing and kb == 2 * TOUCH_TRIALS + 1:
                touch_first = spent[1] < spent[0] - spent[0] // 16  # a clear gain
                touch[0] = 1 if touch_first else 0
            start = _cycles() if trial else 0
            lo = b * BLOCK
            hi = min(lo + BLOCK, n)
            r = scratch[t, 0, :hi - lo]
            cast = scratch[t, 1, :hi - lo]
            kept = cells_of[t, 0, :hi - lo]  # the relative errors' keys, for both plots
            tols = cells_of[t, 1, :hi - lo]
            ob = out[b]
            if touch_first and try_clean:  # the masked twin's slower loop keeps up
                sink |= _touch(a16[lo:hi], gbits[lo:hi]) if upcast \
                    else _touch(abits[lo:hi], gbits[lo:hi])
            if upcast:
                x = up_of[t, :hi - lo]
                _upcast_into(a16[lo:hi], x, up_half)
                xbits = up_bits_of[t, :hi - lo]
            else:
                x, xbits = a[lo:hi], abits[lo:hi]
            y, ybits = g[lo:hi], gbits[lo:hi]
            at_specials = (0, 0)  # the error balance's counts at NaN / Inf pairs
            if not floor_only and (not try_clean or kernel_block(x, xbits, y, ybits, ob,
                                                                   tols, kept, False)):
                k = _special_spots(x, xbits, aexp, aman, y, ybits, flagged)
                kernel_block(x, xbits, y, ybits, ob, tols, kept, True)
                _settle_specials(ob, flagged, k, kept[:0],
                                 tols if keep_tols else tols[:0],
                                 kept if keep_cells else kept[:0])
                at_specials = _eb_at_spots(x, y, flagged, k, eb_half)
            if trial:
                way = 1 if touch_first else 0
                spent[way] += _cycles() - start
            # the floor alone tries its lean variants first, as after a clean block
            clean = floor_only or (ob[NONFINITE_BAD] == 0.0 and ob[SPECIAL_EQ] == 0.0)
            # a block that is the golden rounded to the output's format, bit for bit
            # (_own_floor; a NaN where the rounded golden has one): the floor's
            # figures are the kernel's own, the same block template over the same
            # values, NaN / Inf through the same masked twin and settled alike
            # (test_a_correctly_rounded_block_is_its_own_floor)
            own_floor = floor and not floor_only and _own_floor(
                ob, x, xbits, y, ybits, floor_kind, clean, eb_half, on_grid)
            floor_left = floor and not own_floor
            if heats:
                _heat_range(tols if by_tol else kept, first + lo, rows, cols, starts,
                            ends, heat[t])
            if counts and not floor_only:  # the next block fetched by its last count
                next_g, next_a = upcoming()
                _count_cells(kept, x, y, 0, cells, base, t1, t2, flagged, hist[b, 0],
                             0, next_g[:0] if floor_left else next_g,
                             next_a[:0] if floor_left else next_a)
            if own_floor:
                out_f[b, :] = ob
                if counts:
                    hist[b, 1, :] = hist[b, 0, :]
            on_the_fly = floor_left and clean and floor_kind == ROUND_F32
            r_ready = floor_left and not on_the_fly
            if r_ready:
                _round_into(g, gbits, lo, hi, rp, floor_kind, r)
            # fp16 with its floor: the rounded golden is msprobe's cast, where the
            # block's own counts cannot be taken
            rounded = r if r_ready and same_format and rp_eb[0] != 24.0 else r[:0]
            if not floor_only:
                _eb_of_block(x, g, gbits, lo, hi, rp_eb, ob, on_half_grid, eb[b, 0:2],
                             cast, rounded, at_specials)
            if own_floor:  # against msprobe's cast golden, as the kernel's
                eb[b, 2:4] = eb[b, 0:2]
            if floor_left:
                # the rounded golden is NaN / Inf where the golden is (and where a
                # finite golden overflows the output dtype): the kernel's block tells
                # where to look
                ofb = out_f[b]
                rbits = r.view(np.int64)
                if on_the_fly:
                    specials = floor_on_the_fly(y, ybits, ofb, tols, kept)
                else:
                    specials = not clean or floor_block(r, rbits, y, ybits, ofb, tols,
                                                        kept, False)
                if specials:
                    if not r_ready:
                        _round_into(g, gbits, lo, hi, rp, floor_kind, r)
                        r_ready = True
                    k = _special_spots(r, rbits, _F64_EXP, _F64_MAN, y, ybits, flagged)
                    floor_block(r, rbits, y, ybits, ofb, tols, kept, True)
                    _settle_specials(ofb, flagged, k, kept[:0], tols[:0],
                                     kept if keep_cells else kept[:0])
                if counts:
                    _count_cells(kept, r, y, 0, cells, base, t1, t2, flagged,
                                 hist[b, 1], 0 if r_ready else floor_kind, *upcoming())
                if not same_format:  # bf16, whose rounded golden r is written out
                    _eb_of_block(r, g, gbits, lo, hi, rp_eb, ofb, False, eb[b, 2:4],
                                 cast, r[:0], _UNSETTLED)
            try_clean = clean
        cells_of[t, 1, 0] = np.uint32(sink & 1)  # tols' keys, which nothing reads after

    return _pass


_RUN = 256  # the elements _first_equal tests at once (vectorised) before it walks them


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _first_equal(a, g, target, eps_cann, by_rel):
    """Index of the first finite pair of a, g whose |a - g| (``by_rel``: whose
    CANN relative error d / (|g| + eps_cann)) is ``target`` (the block's maximum, as the
    block pass computed it: the same IEEE operations), or -1. Each run of _RUN elements
    is counted vectorised and only a run with a hit is walked: a scalar search of the
    largest over the whole block took 1.75 ns an element, twice a compare."""
    n = a.shape[0]
    for lo in range(0, n, _RUN):
        hi = min(lo + _RUN, n)
        hits = 0
        for j in range(lo, hi):
            i = np.uint64(j)
            d = abs(np.float64(a[i]) - g[i])
            v = d / (abs(g[i]) + eps_cann) if by_rel else d
            hits += 1 if v == target else 0
        if hits == 0:
            continue
        for j in range(lo, hi):  # a NaN / Inf pair's error is NaN or inf: not finite
            av, gv = np.float64(a[j]), g[j]
            d = abs(av - gv)
            v = d / (abs(gv) + eps_cann) if by_rel else d
            if v == target and np.isfinite(av) and np.isfinite(gv):
                return j
    return -1


_SUMS = (N, NONFINITE_BAD, SPECIAL_EQ, SUM_REL, SUM_SQ, DOT, AA, GG, SUM_EB,
         SUM_ULP, N_ULP1, N_ULP32, N_SMALL, N_SMALL_BAD, N_OK_1E2, N_OK_1E3, N_OK_1E4,
         N_REL_BAD, N_V2, N_CASE, N_ZERO_G_BAD, N_SHRINK, N_GROW)
_MAXES = (MAX_ABS, MAX_REL_CANN, MAX_ULP, MAX_REL, MAX_TOL)


def _combine(parts: np.ndarray) -> np.ndarray:
    """The blocks' partial results, summed in block order (deterministic: cumsum adds one
    after the other, unlike sum's pairwise tree; + 0.0 as a sum started at 0.0 gives)."""
    acc = np.zeros(N_SLOTS)
    acc[ARG_ABS] = acc[ARG_REL] = -1
    if len(parts):
        sums = list(_SUMS)
        acc[sums] = np.cumsum(parts[:, sums], axis=0)[-1] + 0.0
        maxes = list(_MAXES)
        acc[maxes] = np.fmax.reduce(parts[:, maxes], axis=0, initial=0.0)
    if acc[N_ZERO_G_BAD] > 0:
        acc[MAX_REL] = np.inf
    return acc


def _finish(acc: np.ndarray, atol: float, rtol: float, eb: float) -> Metrics:
    """The metrics from the combined slots; ``eb``: msprobe's error balance, counted
    against the golden cast to msprobe's dtype (EB_GT / EB_LT and _eb_range)."""
    n = int(acc[N])
    normal = n - int(acc[N_SMALL])
    nn = max(n, 1)
    if acc[AA] == 0 and acc[GG] == 0:
        cosine = 1.0
    elif acc[AA] == 0 or acc[GG] == 0:
        cosine = 0.0
    else:
        cosine = float(acc[DOT] / math.sqrt(acc[AA] * acc[GG]))
    return Metrics(
        n=n,
        nan_inf_mismatch=int(acc[NONFINITE_BAD]),
        mere=float(acc[SUM_REL] / nn),
        mare=float(acc[MAX_REL_CANN]),
        max_abs=float(acc[MAX_ABS]),
        max_rel=float(acc[MAX_REL]),
        rmse=math.sqrt(acc[SUM_SQ] / nn),
        cosine=cosine,
        eb=eb,
        eb_mean=float(abs(acc[SUM_EB]) / nn),
        mag_bias=float((acc[N_SHRINK] - acc[N_GROW]) / max(acc[N_SHRINK] + acc[N_GROW], 1.0)),
        ulp_max=float(acc[MAX_ULP]),
        ulp_mean=float(acc[SUM_ULP] / nn),
        ulp_gt1_ratio=float(acc[N_ULP1] / nn),
        ulp_gt32_ratio=float(acc[N_ULP32] / nn),
        small_count=int(acc[N_SMALL]),
        small_err_ratio=float(acc[N_SMALL_BAD] / max(int(acc[N_SMALL]), 1)),
        rel_err_ratio=float(acc[N_REL_BAD] / max(normal, 1)),
        hundredth=float(acc[N_OK_1E2] / nn) if n else 1.0,
        thousandth=float(acc[N_OK_1E3] / nn) if n else 1.0,
        ten_thousandth=float(acc[N_OK_1E4] / nn) if n else 1.0,
        v2_match_ratio=float(acc[N_V2] / nn) if n else 1.0,
        allclose_mismatch=int(n - acc[N_CASE] + acc[NONFINITE_BAD]),
        tol_ratio=float(acc[MAX_TOL]),
        atol=atol,
        rtol=rtol,
        argmax_abs=int(acc[ARG_ABS]),
        argmax_rel=int(acc[ARG_REL]),
    )


def _bin_of(rel: float) -> int:
    """0: under the bins, 1..N_BINS: bin k-1, N_BINS+1: over (rel > 0, finite)."""
    lg = math.log10(rel)
    if lg < BIN_LO:
        return 0
    if lg >= BIN_HI:
        return N_BINS + 1
    # (lg - BIN_LO) * 4 can round up to N_BINS just under BIN_HI: that is the last bin
    return min(int(math.floor((lg - BIN_LO) * BINS_PER_DECADE)), N_BINS - 1) + 1


def _threshold(k: int) -> float:
    """The smallest positive float64 whose bin is >= k, found among the bit patterns
    (positive floats sort as their bits): exactly the boundary log10 draws."""
    lo = np.int64(np.float64(10.0 ** (BIN_LO + (k - 1) / BINS_PER_DECADE) / 2).view(np.int64))
    hi = np.int64(np.float64(10.0 ** (BIN_LO + (k - 1) / BINS_PER_DECADE) * 2).view(np.int64))
    while hi - lo > 1:  # _bin_of(lo) < k <= _bin_of(hi)
        mid = lo + (hi - lo) // 2
        if _bin_of(float(np.int64(mid).view(np.float64))) >= k:
            hi = mid
        else:
            lo = mid
    return float(np.int64(hi).view(np.float64))


def _histogram_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per float64 exponent field: the bin code of the octave's start, and the (at most
    two) thresholds inside the octave (inf: none)."""
    thresholds = [_threshold(k) for k in range(1, N_BINS + 2)]
    base = np.zeros(2048, dtype=np.int64)
    t1 = np.full(2048, np.inf)
    t2 = np.full(2048, np.inf)
    for field in range(2048):
        start = float(np.int64(field << 52).view(np.float64)) if field < 2047 else math.inf
        end = float(np.int64((field + 1) << 52).view(np.float64)) if field < 2046 else math.inf
        base[field] = sum(t < start for t in thresholds) if field else 0
        inside = [t for t in thresholds if start <= t < end] if field else \
            [t for t in thresholds if t < end]
        assert len(inside) <= 2, "a quarter decade is wider than half an octave"
        if inside:
            t1[field] = inside[0]
        if len(inside) > 1:
            t2[field] = inside[1]
    return base, t1, t2


_HIST_BASE, _HIST_T1, _HIST_T2 = _histogram_tables()


def _cell_table() -> np.ndarray:
    """The histogram code of each table cell (_cell_index: ZERO_CELL, then the positive
    float64s whose bits less one share an exponent and top CELL_BITS significand bits),
    FLAG where the cell holds a bin edge or borders one (so that no element within an ulp
    of an edge is binned by the table), from the exact bins (_HIST_BASE / T1 / T2, drawn
    from log10 itself); ZERO_CODE at ZERO_CELL."""
    n = N_CELLS
    idx = np.arange(n, dtype=np.int64)
    step = np.int64(1) << CELL_SHIFT
    first = idx * step + 1  # the bits of the cell's smallest value, and of its largest
    # (an octave's last cell ends on the next octave's first value; the top cell, NaN's
    # and set below, is kept from overflowing)
    last = np.minimum(idx, n - 2) * step + step
    field = idx >> CELL_BITS

    def code(bits):
        v, at = bits.view(np.float64), bits >> 52  # each value by its own octave's bins
        k = _HIST_BASE[at] + (v >= _HIST_T1[at]) + (v >= _HIST_T2[at])
        return np.minimum(k, OVER_CODE)

    lo, hi = code(first), code(last)
    cells = np.where(lo == hi, lo, FLAG)
    boundary = hi[:-1] != lo[1:]  # an edge where one cell ends and the next begins
    cells[np.r_[False, boundary] | np.r_[boundary, False]] = FLAG
    cells[field == 2047] = OVER_CODE  # NaN bit patterns: never stored
    table = np.empty(N_CELLS, dtype=np.uint8)  # (_cell_index) the zero's, then the
    table[ZERO_CELL] = ZERO_CODE  # positive floats' (but the top one, NaN's: no key's)
    table[ZERO_CELL + 1:] = cells[:-1]
    return table


_HIST_CELLS = _cell_table()


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """torch.testing.assert_close defaults: (atol, rtol)."""
    t = dt.traits(dtype)
    return t.torch_atol, t.torch_rtol


@functools.lru_cache(maxsize=64)
def _kept_constants(dtype: torch.dtype, atol: float, rtol: float, scale: float) -> np.ndarray:
    """_constants, made once per set of them (0.02 ms a compare under cProfile, of a [16,
    16] output's 0.43 there): the pass only reads them."""
    return _constants(dtype, atol, rtol, scale)


def _constants(dtype: torch.dtype, atol: float, rtol: float, scale: float = 1.0) -> np.ndarray:
    t = dt.traits(dtype)
    c = np.zeros(N_CONSTS)
    c[C_EPS_CANN] = 1e-7
    c[C_EPS_MS] = t.msprobe_eps
    c[C_SMALL] = t.small_value
    c[C_SMALL_ATOL] = t.small_value_atol
    c[C_MANT] = t.mantissa_bits
    c[C_MIN_EXP] = t.min_exp
    c[C_V2_ATOL] = t.v2_atol * scale
    c[C_V2_RTOL] = t.v2_rtol * scale
    c[C_ATOL] = atol
    c[C_RTOL] = rtol
    c[C_ABS_RTOL] = t.abs_threshold_rtol
    c[C_THOU_ATOL] = thousandth_small_atol(dtype)
    # msprobe's absolute threshold: rel = d / (|golden| + finfo(golden's dtype).eps), 2^-8
    # for bf16 (get_abs_bench_with_eps); the golden here is float64
    c[C_EPS_ABS] = 2.0 ** -8 if dtype == torch.bfloat16 else float(np.finfo(np.float64).eps)
    # the ratio counts run in every block where the correctly rounded output already
    # misses the ten-thousandth (bf16, fp16: its relative error reaches 2^-(mant + 1))
    c[C_RATIOS] = float(2.0 ** -(t.mantissa_bits + 1) >= min(_RATIO_THRESHOLDS))
    c[C_QUIET] = _quiet_slope(c)
    c[C_QUIET_ABS] = _quiet_offset(c)
    c[C_RATIOS_TRIM] = _ratios_trimmed(c)
    c[C_SPARSE] = _sparse_loud(c)
    return c


_RATIO_THRESHOLDS = (1e-2, 1e-3, 1e-4)  # hundredth, thousandth, ten-thousandth
_MARGIN = 1.0 - 2.0 ** -20  # keeps a strict test strict through two roundings


def _quiet_slope(c: np.ndarray) -> float:
    """_slope_of the constants that bound the tolerance tests."""
    return _slope_of(c[C_SMALL], c[C_RTOL], c[C_V2_RTOL], c[C_ABS_RTOL], c[C_THOU_ATOL],
                     c[C_RATIOS] != 0.0, min(c[C_ATOL], c[C_V2_ATOL], c[C_EPS_MS],
                                             c[C_EPS_ABS]))


@functools.lru_cache(maxsize=256)
def _slope_of(small: float, rtol: float, v2_rtol: float, abs_rtol: float, thou_atol: float,
              ratios_always: bool, least_offset: float) -> float:
    """The largest slope q such that every finite element with d <= fl(q |g|) passes
    every tolerance test that the block pass does not count in its first loop, as the
    pass computes it (-1: none; the tolerance counts then always run). Each test's bound
    rounds monotonically in |g|, so q <= its slope suffices: allclose (rtol), CANN v2
    (v2 rtol), msprobe's absolute threshold (its rtol). Unless the ratio counts always
    run (C_RATIOS), the hundredth / thousandth / ten-thousandth too: small values
    (|g| <= small) within their atol takes q small <= atol exactly; the others' tests
    are strict (d < t (|g| + eps)), and q <= t (1 - 2^-20) keeps fl(q |g|) below
    fl(t |g|) while q small is a normal number. A zero golden gives fl(q 0) = 0, so a
    quiet element there is exact."""
    slopes = [rtol, v2_rtol, abs_rtol]
    exact = []  # bounds that q small must meet exactly
    if not ratios_always:
        slopes += [t * _MARGIN for t in _RATIO_THRESHOLDS]
        if small > 0:
            slopes.append(thou_atol / small)
            exact.append(Fraction(thou_atol))
    q = float(min(slopes))
    while q > 0 and any(Fraction(q) * Fraction(small) > bound for bound in exact):
        q = float(np.nextafter(q, 0.0))
    if not (q > 0 and q * small >= 2.0 ** -1000 and least_offset >= 0):
        return -1.0
    return q


def _ratios_trimmed(c: np.ndarray) -> float:
    """What a quiet block whose ratio counts run (C_RATIOS) counts of them: a block quiet
    by the slope alone (every d <= fl(q |g|); or by the offset too, where C_QUIET_ABS is
    within the small values' atol) knows every small value within that atol (fl(q small)
    <= it, and fl(q |g|) grows with |g|) and every other value within the hundredth (q <=
    1e-2 (1 - 2^-20) with q small a normal number, as _slope_of argues for a strict test),
    and within the thousandth where q <= 1e-3 (1 - 2^-20): RATIOS_TRIMMED (bf16) or
    RATIOS_TEN_THOUSANDTH (fp16) of _block_counts; 0.0: all counted."""
    q, small = c[C_QUIET], c[C_SMALL]
    if not (c[C_RATIOS] > 0 and q > 0 and q * small <= c[C_THOU_ATOL]
            and q <= _RATIO_THRESHOLDS[0] * _MARGIN and q * small >= 2.0 ** -1000):
        return 0.0
    if q <= _RATIO_THRESHOLDS[1] * _MARGIN:
        return float(RATIOS_TEN_THOUSANDTH)
    return float(RATIOS_TRIMMED)


def _sparse_loud(c: np.ndarray) -> float:
    """What a loud block may count on its loud elements alone (_sparse_loud_counts), every
    quiet element (d <= fl(q |g|)) having a ULP error within 32 (d <= q |g| (1 + 2^-52)
    with |g| < 2^(e + 1) and the ULP 2^(max(e, min_exp) - mant) makes it under
    q 2^(mant + 1)): SPARSE_ALL where the slope covers the ratio family too (C_RATIOS 0),
    SPARSE_BUT_1E4 where a quiet block knows all of it but the ten-thousandth over the
    small bound (RATIOS_TEN_THOUSANDTH: fp16, whose block loop counts that), else 0."""
    q = c[C_QUIET]
    if not (q > 0 and q * 2.0 ** (c[C_MANT] + 1) * (1 + 2.0 ** -50) <= 32):
        return 0.0
    if c[C_RATIOS] == 0.0:
        return float(SPARSE_ALL)
    if c[C_RATIOS_TRIM] == RATIOS_TEN_THOUSANDTH:
        return float(SPARSE_BUT_1E4)
    return 0.0


def _quiet_offset(c: np.ndarray) -> float:
    """The largest absolute error qa such that every nonzero small value (0 < |g| <=
    small) with d <= qa passes every tolerance test that a quiet block takes as known:
    allclose's and CANN v2's (d <= atol + rtol |g|: qa <= atol, exactly) and, unless the
    ratio counts always run, the hundredth's family (d <= its small-value atol). msprobe's
    absolute threshold tests only |g| > small, and an error at a zero golden is counted
    (never quiet). 0 where the slope is unusable (C_QUIET < 0: the counts always run)."""
    if c[C_QUIET] < 0:
        return 0.0
    bounds = [c[C_ATOL], c[C_V2_ATOL]]
    if c[C_RATIOS] == 0.0:
        bounds.append(c[C_THOU_ATOL])
    return max(0.0, float(min(bounds)))


def thousandth_small_atol(dtype: torch.dtype) -> float:
    """Small values' atol in the hundredth / thousandth / ten-thousandth ratios (our own
    family): msprobe's small-value atol, but never below half an ulp at the small-value
    bound, so a correctly rounded small value always counts as right (bf16: 1e-16 would
    fail every inexact one; 2^-18 is the most a correct rounding moves a value <= 2^-10)."""
    t = dt.traits(dtype)
    return max(t.small_value_atol, t.small_value * 2.0 ** -(t.mantissa_bits + 1))


def measure_pair(actual: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype | None = None,
                 atol: float | None = None, rtol: float | None = None,
                 floor: bool = True, scale: float = 1.0) -> tuple[Metrics, Metrics | None]:
    """Metrics of ``actual`` and (``floor``) of the golden rounded to the output dtype.

    ``dtype`` is the output dtype whose constants apply (default: actual's dtype).
    ``scale`` widens the tolerances (atol / rtol, CANN v2's atol / rtol) for outputs
    that sum many terms (reduction gradients).
    """
    m = measure_all(actual, golden, dtype, atol, rtol, floor, scale, hist=False)
    return m.metrics, m.floor


class Measured(NamedTuple):
    metrics: Metrics
    floor: Metrics | None
    histogram: dict | None  # {'actual': counts, 'floor': counts}: plotdata.histogram's
    heatmap: dict | None    # plotdata.heatmap's layout; None under 2 dims or not asked


_BUFFERS = threading.local()
# the output formats whose floor _rounded rounds (the others: _round_range)
_FLOOR_KINDS = {torch.float32: ROUND_F32, torch.bfloat16: ROUND_BF16,
                torch.float16: ROUND_F16}
FLOOR_DTYPES = tuple(_FLOOR_KINDS)  # the output dtypes measure_floor rounds a golden into


def _buffers(n_threads: int, width: int, upcast: bool, dtype=np.float32):
    """The pass's per-thread buffers: rounded and cast golden (2 x width float64); the
    histogram's flagged elements (and a block's NaN / Inf spots); the errors' table cells
    (the relative errors' heat-map keys) and allclose's measure's keys (2 x width
    uint32); and the float32 block a
    bf16 / fp16 output is upcast into (``upcast``; else an empty one of the actual's
    ``dtype``, so that both branches type alike). Full-block ones (4 MiB on 2 threads)
    are kept for the calling thread's next call rather than allocated again by every
    compare of an output of a block or more (a run compares thousands)."""
    kept = {}
    if width == BLOCK:
        kept = getattr(_BUFFERS, "full", None)
        if kept is None or kept["scratch"].shape[0] != n_threads:
            kept = _BUFFERS.full = {}
    shape = (n_threads, width)
    if "scratch" not in kept:
        kept.update(scratch=np.empty((n_threads, 2, width)),
                    flagged=np.empty(shape, dtype=np.int64),
                    cells=np.empty((n_threads, 2, width), dtype=np.uint32))
    if upcast and "upcast" not in kept:
        kept["upcast"] = np.empty(shape, dtype=np.float32)
    up = kept["upcast"] if upcast else np.empty((n_threads, 0), dtype=dtype)
    return kept["scratch"], kept["flagged"], kept["cells"], up


def _fetches_ahead(a: torch.Tensor, heat, up: bool) -> bool:
    """Whether the pass fetches each next block while it counts this one (_count_cells'
    next_g / next_a): only where the work after the block loop hides the fetch (the heat
    map's, or a bf16 / fp16 upcast's) and the golden and actual do not fit the last-level
    cache (cache_size). A 1-D fp32 output's count alone did not hide it: [4194304]
    compare without a floor 2.35-2.63 -> 2.65-3.1 ms with it, side by side."""
    data_bytes = a.numel() * (8 + a.element_size())
    return bool(heat or up) and data_bytes > last_level_cache_bytes()


def _touch_of() -> np.ndarray:
    """The touch state a pass gets: TOUCH_STATE itself (which it may update) while no way
    is learned, when one is fixed and on every TOUCH_RETIME-th pass; else the learned way,
    fixed for that pass, which then times nothing (timing cost a pass 2-7%)."""
    if TOUCH_STATE[1] == 1 or TOUCH_STATE[0] < 0 or next(_TOUCH_PASSES) % TOUCH_RETIME == 0:
        return TOUCH_STATE
    return np.array([TOUCH_STATE[0], 1], dtype=np.int64)


def measure_all(actual: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype | None = None,
                atol: float | None = None, rtol: float | None = None, floor: bool = True,
                scale: float = 1.0, hist: bool = True, heat: str | None = None) -> Measured:
    """``measure_pair`` and the report's plot data in the same pass over the data: each
    block of 64Ki elements is read once, the golden is rounded to the output dtype on
    the fly (the error floor) and both get their metrics and histogram counts while the
    block is in cache, and (``heat`` 'rel' or 'tol', with ``hist``) the kernel's heat map
    of the relative error d / (|g| + 1e-7) or of allclose's d / (atol + rtol |g|)."""
    dtype = dtype or actual.dtype
    atol, rtol = _tolerances(dtype, atol, rtol, scale)
    a = actual.detach().to("cpu").contiguous().reshape(-1)
    if a.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        a = a.to(torch.float32)  # fp8, integers: upcast whole (the pass takes bf16 / fp16)
    g = golden.detach().to("cpu", torch.float64).contiguous().reshape(-1)
    if a.numel() != g.numel():
        raise ValueError(f"actual has {a.numel()} elements, golden {g.numel()}")
    total = a.numel()
    shape = tuple(actual.shape)
    heat = heat if hist and len(shape) >= 2 and total else None
    cols = shape[-1] if heat else 1
    rows = total // cols if heat else 1
    ran = _launch(a, g, dtype, atol, rtol, scale, floor, hist, heat, rows, cols, False)
    a_np, a16, g_np, c = ran.a_np, ran.a16, ran.g_np, ran.c
    hists = ran.hist_blocks.sum(axis=0)
    eb_a = [int(ran.eb_blocks[:, 0].sum()), int(ran.eb_blocks[:, 1].sum())]
    eb_f = [int(ran.eb_blocks[:, 2].sum()), int(ran.eb_blocks[:, 3].sum())]
    combined = _combine(ran.parts)
    _locate_argmax(combined, ran.parts, a_np, a16, a.dtype == torch.float16, g_np, c, total)
    m_a = _finish(combined, atol, rtol, _eb_ratio(eb_a, total))
    m_f = None
    if floor:
        m_f = _finish(_combine(ran.parts_f), atol, rtol, _eb_ratio(eb_f, total))
    histogram = None
    if hist:
        histogram = {"actual": _hist_dict(hists[0])}
        if floor:
            histogram["floor"] = _hist_dict(hists[1])
    heatmap = None
    if heat:
        cells = _heat_cells(ran.heat_threads.max(axis=0), (a_np, *ran.bits, a16,
                            a.dtype == torch.float16, g_np, c), heat == "tol", rows, cols,
                            ran.starts, ran.ends)
        heatmap = {"rows": rows, "cols": cols, "grid": cells.tolist(),
                   "measure": "d/(atol+rtol|g|)" if heat == "tol" else "d/(|g|+1e-7)"}
    return Measured(m_a, m_f, histogram, heatmap)


def measure_floor(golden: torch.Tensor, dtype: torch.dtype, atol: float | None = None,
                  rtol: float | None = None, scale: float = 1.0,
                  hist: bool = True) -> tuple[Metrics, dict | None]:
    """The error floor alone: ``measure_all``'s floor figures and floor histogram for
    this golden written as ``dtype`` (fp32, bf16, fp16), the same to the bit, with no
    kernel's output. Each block of the golden is rounded in cache as the pass goes, so
    nothing of the tensor's size is written: rounding the whole golden first (round_once)
    and measuring that as an output read and wrote it twice more; output_floor at [7168,
    4096], fp32 / bf16 / fp16: 87.2 / 111.2 / 109.4 -> 36.0 / 45.3 / 46.6 ms (round_once
    alone 41.3 / 77.0 / 66.7)."""
    if dtype not in FLOOR_DTYPES:
        raise ValueError(f"measure_floor rounds to {sorted(map(str, FLOOR_DTYPES))}, "
                         f"not {dtype}")
    atol, rtol = _tolerances(dtype, atol, rtol, scale)
    g = golden.detach().to("cpu", torch.float64).contiguous().reshape(-1)
    total = g.numel()
    ran = _launch(torch.empty(0, dtype=torch.float32), g, dtype, atol, rtol, scale, True,
                  hist, None, 1, 1, True)
    eb_f = [int(ran.eb_blocks[:, 2].sum()), int(ran.eb_blocks[:, 3].sum())]
    m_f = _finish(_combine(ran.parts_f), atol, rtol, _eb_ratio(eb_f, total))
    return m_f, (_hist_dict(ran.hist_blocks[:, 1].sum(axis=0)) if hist else None)


def _tolerances(dtype: torch.dtype, atol, rtol, scale: float) -> tuple[float, float]:
    """The case's atol / rtol (the dtype's defaults where None), widened by ``scale``."""
    d_atol, d_rtol = default_tolerances(dtype)
    return ((d_atol if atol is None else float(atol)) * scale,
            (d_rtol if rtol is None else float(rtol)) * scale)


class _Ran(NamedTuple):
    """What one pass wrote, per block (and per thread: the heat map's maxima), with the
    arrays it read."""
    parts: np.ndarray
    parts_f: np.ndarray
    hist_blocks: np.ndarray
    eb_blocks: np.ndarray
    heat_threads: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    a_np: np.ndarray
    bits: tuple  # a_np's bits and its exponent and significand masks (_bits_of)
    a16: np.ndarray
    g_np: np.ndarray
    c: np.ndarray


def _launch(a: torch.Tensor, g: torch.Tensor, dtype: torch.dtype, atol: float, rtol: float,
            scale: float, floor: bool, hist: bool, heat, rows: int, cols: int,
            floor_only: bool) -> _Ran:
    """One pass of the block kernel over flat ``a`` (empty for ``floor_only``) and the
    float64 golden ``g``, on every numba thread the blocks can use."""
    c = _kept_constants(dtype, atol, rtol, scale)
    rp = _rounding_of(dtype) if floor else np.zeros(3)
    total = g.numel()
    rp_eb = _rounding_of(_msprobe_dtype(dtype))
    grid_shape = (min(rows, HEAT_GRID), min(cols, HEAT_GRID)) if heat else (1, 1)
    # the pass compiled for fp16's half cast of msprobe's EB or not; what it keeps, as flags
    pass_ = _make_pass(bool(rp_eb[0] == 11.0))
    keep = _KEEP_FLAGS[heat or ("hist" if hist else "none")]
    starts, ends = _pool_windows(cols, grid_shape[1])
    # per thread: the rounded golden, msprobe's cast golden, the histogram's flagged
    # elements, the errors' cells and heat-map keys, reused by every block it takes
    n_threads = max(1, min(numba.get_num_threads(), -(-total // BLOCK)))
    up = a.dtype in (torch.bfloat16, torch.float16)
    scratch, flagged, kept_cells, up_buf = _buffers(
        n_threads, min(BLOCK, max(total, 1)), up,
        np.float64 if a.dtype == torch.float64 else np.float32)
    if up:  # the pass upcasts each block of the bits itself
        a16 = a.view(torch.int16).numpy()
        a_np = np.empty(0, dtype=np.float32)
    else:
        a16 = np.empty(0, dtype=np.int16)
        a_np = a.numpy()
    abits, aexp, aman = _bits_of(a_np)
    g_np = g.numpy()
    n_blocks = -(-total // BLOCK)
    parts = np.empty((n_blocks, N_SLOTS))  # the kernel's (for floor_only: not written)
    parts_f = np.empty((n_blocks if floor else 0, N_SLOTS))
    hist_blocks = np.zeros((n_blocks if hist else 0, 2, N_BINS + 3), dtype=np.int64)
    eb_blocks = np.zeros((n_blocks, 4), dtype=np.int64)
    heat_threads = np.zeros((n_threads if heat else 0,) + grid_shape, dtype=np.uint32)
    where = np.array([0, rows, cols, heat == "tol", _fetches_ahead(a, heat, up), floor_only],
                     dtype=np.int64)
    run_per_thread(pass_, n_threads, a_np, abits, aexp, aman, g_np, g_np.view(np.int64), c,
                   rp, rp_eb, parts, parts_f, hist_blocks, eb_blocks, _HIST_CELLS,
                   _HIST_BASE, _HIST_T1, _HIST_T2, heat_threads, where, starts, ends,
                   scratch, kept_cells, flagged, _FLOOR_KINDS.get(dtype, 0) if floor else 0,
                   a16, up_buf, _bits_of(up_buf)[0], a.dtype == torch.float16, _touch_of(),
                   keep, np.zeros(1, dtype=np.int64))
    return _Ran(parts, parts_f, hist_blocks, eb_blocks, heat_threads, starts, ends, a_np,
                (abits, aexp, aman), a16, g_np, c)


_EXACT_TENS = np.array([10.0 ** k for k in range(23)])  # the powers of ten a float holds


@njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _three_digits_into(v, tens, out, slow):
    """out[i] = v[i] to 3 significant digits where a scaled integer vouches for it (r
    in [100, 1000) times or over an exact power of ten, correctly rounded as the parse of
    its decimal is), else 0 with slow[i] set (near a rounding tie, beyond the exact powers,
    negative, NaN, Inf; a zero is 0). Whatever log10 gives, a wrong exponent only fails
    the range test."""
    for i in range(v.shape[0]):
        x = v[i]
        out[i] = 0.0
        slow[i] = x != 0.0
        if x > 0.0 and x < np.inf:
            e = min(max(np.int64(np.floor(np.log10(x))) - 2, -23), 23)
            if abs(e) <= 22:
                scale = tens[abs(e)]
                m = x / scale if e >= 0 else x * scale
                r = np.rint(m)
                if abs(m - np.floor(m) - 0.5) > 1e-6 and r >= 100.0 and r < 1000.0:
                    out[i] = r * scale if e >= 0 else r / scale
                    slow[i] = False


def three_digits(grid) -> list[list[float]]:
    """The heat map's cells as stored: each value to 3 significant digits, exactly what
    float(f"{v:.3g}") gives (_three_digits_of)."""
    return _three_digits_of(grid).tolist()


def _three_digits_of(grid) -> np.ndarray:
    """three_digits as an array: compiled for the values a scaled integer vouches for, the
    rest through the string (NumPy's dozen array operations took 0.07-0.1 ms a grid, a
    third of a small output's compare)."""
    v = np.ascontiguousarray(grid, dtype=np.float64)
    flat = v.reshape(-1)
    out = np.empty_like(flat)
    slow = np.empty(flat.shape, dtype=np.bool_)
    _three_digits_into(flat, _EXACT_TENS, out, slow)
    for i in np.flatnonzero(slow):
        out[i] = float(f"{flat[i]:.3g}")
    return out.reshape(v.shape)


def _heat_cells(keys: np.ndarray, data: tuple, by_tol: bool, rows: int, cols: int,
                starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The heat map's cells to three digits from the largest key in each (_heat_key, less
    KEY_OF_ZERO: k): the cell's error lies in ((k - 1) 2^31, k 2^31] as bits, and where
    both ends round to the same three digits that is the cell's (rounding is monotone). A
    cell whose span
    straddles a rounding (about one in 2^20 / 10^3 of random errors) is recomputed from
    the data, exactly as the pass keeps its errors (_exact_heat_cell). ``data``: the
    actual as the pass reads it (values, bits, exponent and significand masks, bf16 /
    fp16 bits, whether IEEE half), the golden and the constants."""
    k = np.maximum(keys.astype(np.int64) - KEY_OF_ZERO, 0)  # 0: no element, or errors of 0
    top = np.minimum((k << HEAT_KEY_SHIFT).view(np.float64), _FAR)
    bottom = np.minimum(np.where(k > 0, ((k - 1) << HEAT_KEY_SHIFT) + 1, 0).view(np.float64),
                        _FAR)
    cells = _three_digits_of(top)
    gr, gc = keys.shape
    a_np, abits, aexp, aman, a16, half, g_np, c = data
    for cell in np.flatnonzero(_three_digits_of(bottom) != cells):
        i, w = divmod(int(cell), gc)
        exact = _exact_heat_cell(a_np, abits, aexp, aman, a16, half, g_np,
                                 g_np.view(np.int64), c, by_tol, (i * rows + gr - 1) // gr,
                                 ((i + 1) * rows + gr - 1) // gr, int(starts[w]),
                                 int(ends[w]), cols)
        cells[i, w] = _three_digits_of(np.array([exact]))[0]
    return cells


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _exact_heat_cell(a, abits, aexp, aman, a16, half, g, gbits, c, by_tol, r0, r1, c0, c1,
                     cols):
    """The largest kept error over rows [r0, r1) and columns [c0, c1) of a tensor cols
    wide, as the block loop keeps it (the same arithmetic, under the same fast-math
    flags): d / (|g| + 1e-7) or (``by_tol``) d / (atol + rtol |g|), at most 1e300; a
    NaN / Inf pair's 0 where it is the same NaN or signed Inf, else _FAR
    (_special_spots, _settle_specials). The actual: a (its bits abits), or (a16 not
    empty) the bf16 / ``half`` bits, upcast as the pass does."""
    eps_cann, atol, rtol = c[C_EPS_CANN], c[C_ATOL], c[C_RTOL]
    upcast = a16.shape[0] > 0
    top = 0.0
    for r in range(r0, r1):
        for col in range(c0, c1):
            i = r * cols + col
            gv, gb = g[i], gbits[i]
            if upcast:
                x32 = _f32_of_16(a16[i], True) if half else _f32_of_16(a16[i], False)
                av, xb = np.float64(x32), np.int64(_bits(x32))
            else:
                av, xb = np.float64(a[i]), np.int64(abits[i])
            if _special(xb, aexp, gb):
                v = 0.0 if _same_special(xb, aexp, aman, gb) else _FAR
            else:
                d = abs(av - gv)
                ag = abs(gv)
                if by_tol:
                    allowed = atol + rtol * ag
                    v = d / _fmax(allowed, 1e-300)
                else:
                    v = d / (ag + eps_cann)
                v = v if v < 1e300 else 1e300
            top = max(top, v)
    return top


def _eb_ratio(counts: list[int], total: int) -> float:
    """msprobe's error balance from its counts: |#(a > g') - #(a < g')| / n."""
    return abs(counts[0] - counts[1]) / total if total else 0.0


@functools.lru_cache(maxsize=256)
def _pool_windows(length: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Adaptive max pooling's windows of ``length`` into ``n``: [floor(i L / n),
    ceil((i + 1) L / n)), which overlap when n does not divide L."""
    i = np.arange(n, dtype=np.int64)
    return i * length // n, -((-(i + 1) * length) // n)


def _locate_argmax(combined: np.ndarray, parts: np.ndarray, a_np: np.ndarray,
                   a16: np.ndarray, half: bool, g_np: np.ndarray, c, total: int) -> None:
    """The element index of the largest |a - g| and relative error: the first element
    whose error is that maximum, inside the first block that holds it (none where the
    block maxima are NaN). The actual as the pass reads it: a_np, or (a16 not empty) the
    bf16 / ``half`` bits, of which only that block is upcast again."""
    views: dict[int, tuple] = {}  # block start -> its actual (as float32 / float64), golden
    for slot, arg, by_rel in ((MAX_ABS, ARG_ABS, False), (MAX_REL_CANN, ARG_REL, True)):
        b = int(np.argmax(parts[:, slot])) if len(parts) else -1
        if b >= 0 and parts[b, slot] >= 0.0:
            lo = b * BLOCK
            if lo not in views:
                hi = min(lo + BLOCK, total)
                if a16.shape[0]:
                    x = np.empty(hi - lo, dtype=np.float32)
                    _upcast_into(a16[lo:hi], x, half)
                else:
                    x = a_np[lo:hi]
                views[lo] = (x, g_np[lo:hi])
            x, y = views[lo]
            j = _first_equal(x, y, parts[b, slot], c[C_EPS_CANN], by_rel)
            combined[arg] = lo + j if j >= 0 else -1


def _hist_dict(counts: np.ndarray) -> dict:
    return {"counts": counts[:N_BINS].tolist(), "zero": int(counts[N_BINS]),
            "under": int(counts[N_BINS + 1]), "over": int(counts[N_BINS + 2])}


def _msprobe_dtype(dtype: torch.dtype) -> torch.dtype:
    """The NumPy dtype msprobe holds an output in: fp16 stays, bf16 becomes float32."""
    return dtype if dtype in (torch.float16, torch.float32, torch.float64) else torch.float32


def _rounding_of(dtype: torch.dtype) -> np.ndarray:
    """dtypes.rounding_params as the array the compiled rounding reads."""
    return np.array(dt.rounding_params(dtype), dtype=np.float64)


def _bits_of(a_np: np.ndarray):
    if a_np.dtype == np.float32:
        return a_np.view(np.int32), np.int64(0x7F800000), np.int64(0x007FFFFF)
    return a_np.view(np.int64), _F64_EXP, _F64_MAN


def measure(actual: torch.Tensor, golden: torch.Tensor, **kw) -> Metrics:
    return measure_pair(actual, golden, floor=False, **kw)[0]


def exact_metrics(actual: torch.Tensor, golden: torch.Tensor) -> Metrics:
    """Exact comparison, reported in the same fields (``allclose_mismatch`` counts the
    elements that differ). Integers and bools compare as int64, never through a float (2^53
    + 1 differs from 2^53); floats compare by value in float64, which holds every float
    dtype exactly: NaN matches NaN, -0 equals +0 (IEEE equality)."""
    a = actual.detach().cpu().reshape(-1)
    g = golden.detach().cpu().reshape(-1)
    if not a.dtype.is_floating_point and not g.dtype.is_floating_point:
        a64, g64 = a.to(torch.int64), g.to(torch.int64)
        differ = a64 != g64
        d = torch.where(differ, (a64 - g64).abs().to(torch.float64), 0.0)
    else:
        a64, g64 = a.to(torch.float64), g.to(torch.float64)
        differ = (a64 != g64) & ~(a64.isnan() & g64.isnan())
        d = torch.where(differ, (a64 - g64).abs().nan_to_num(nan=math.inf), 0.0)
    n = a.numel()
    wrong = int(differ.sum())
    max_abs = float(d.max()) if n else 0.0
    arg = int(d.argmax()) if n else -1
    ratio = 1.0 - wrong / n if n else 1.0
    return Metrics(n=n, nan_inf_mismatch=0, mere=0.0, mare=0.0, max_abs=max_abs,
                   max_rel=0.0, rmse=float(d.pow(2).mean().sqrt()) if n else 0.0,
                   cosine=1.0, eb=0.0, eb_mean=0.0, mag_bias=0.0, ulp_max=max_abs, ulp_mean=0.0,
                   ulp_gt1_ratio=0.0, ulp_gt32_ratio=0.0, small_count=0,
                   small_err_ratio=0.0, rel_err_ratio=0.0, hundredth=ratio,
                   thousandth=ratio, ten_thousandth=ratio, v2_match_ratio=ratio,
                   allclose_mismatch=wrong, tol_ratio=float(wrong > 0) * max_abs,
                   atol=0.0, rtol=0.0, argmax_abs=arg,
                   argmax_rel=arg)


def numba_threads() -> int:
    return numba.get_num_threads()


def round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 values rounded once, to nearest with ties to even, into ``dtype``:
    subnormals, ties and overflow to inf as IEEE 754 says. torch converts float64 to
    fp16 / bf16 through float32, which rounds twice and lands one ulp off now and then;
    the error floor must be the correctly rounded golden. The rounding is the metrics
    pass's own (_round_into), so a rounded tensor and the pass agree."""
    if dtype in (torch.float32, torch.float64) or dtype not in dt.FLOAT_TRAITS \
            or not x.dtype.is_floating_point:
        return x.to(dtype)  # float32 / float64 targets: torch rounds once already
    v = x.detach().to("cpu", torch.float64).contiguous().reshape(-1).numpy()
    r = np.empty_like(v)
    _round_into(v, v.view(np.int64), 0, v.shape[0], _rounding_of(dtype),
                _FLOOR_KINDS.get(dtype, 0), r)
    return torch.from_numpy(r).reshape(x.shape).to(dtype)  # exact now: no second rounding
