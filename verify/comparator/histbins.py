"""The error histogram's fixed bins (log10 of the relative error from 1e-12 to 1e3, four
bins per decade) and the heat map's grid. Shared by the metrics pass that counts and the
report that draws."""
from __future__ import annotations

import numpy as np

BIN_LO, BIN_HI, BINS_PER_DECADE = -12, 3, 4
EDGES = [BIN_LO + i / BINS_PER_DECADE for i in range((BIN_HI - BIN_LO) * BINS_PER_DECADE + 1)]
N_BINS = len(EDGES) - 1
HEAT_GRID = 32  # the heat map's cells: at most HEAT_GRID x HEAT_GRID


def three_digits(grid) -> list[list[float]]:
    """The heat map's cells as stored: each value to 3 significant digits, exactly what
    float(f"{v:.3g}") gives, but vectorised: most values are rounded in NumPy (a scaled
    integer divided or multiplied by an exact power of ten is correctly rounded, as the
    parse of its decimal is), and only those the shortcut cannot vouch for (near a
    rounding tie, or beyond the exact powers of ten) go through the string."""
    v = np.asarray(grid, dtype=np.float64)
    with np.errstate(all="ignore"):  # the values the shortcut cannot take overflow in it
        return _three_digits(v)


def _three_digits(v: np.ndarray) -> list[list[float]]:
    pos = np.isfinite(v) & (v > 0)
    x = np.where(pos, v, 1.0)
    # e: x / 10^e in [100, 1000), nearly; only powers of ten up to 1e22 are exact
    e = np.clip(np.floor(np.log10(x)).astype(np.int64) - 2, -23, 23)
    scale = 10.0 ** np.abs(e).astype(np.float64)
    m = np.where(e >= 0, x / scale, x * scale)
    r = np.rint(m)
    exact = (np.abs(e) <= 22) & (np.abs(m - np.floor(m) - 0.5) > 1e-6) \
        & (r >= 100) & (r < 1000)
    fast = pos & exact
    out = np.where(fast, np.where(e >= 0, r * scale, r / scale), 0.0)
    for idx in zip(*np.nonzero(~fast & (v != 0))):  # the rest but zeros: through the string
        out[idx] = float(f"{v[idx]:.3g}")
    return out.tolist()
