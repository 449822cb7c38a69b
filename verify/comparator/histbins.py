"""The error histogram's fixed bins (log10 of the relative error from 1e-12 to 1e3, four
bins per decade) and the heat map's grid. Shared by the metrics pass that counts and the
report that draws (the cells' rounding to three digits: metrics.three_digits)."""
from __future__ import annotations

BIN_LO, BIN_HI, BINS_PER_DECADE = -12, 3, 4
EDGES = [BIN_LO + i / BINS_PER_DECADE for i in range((BIN_HI - BIN_LO) * BINS_PER_DECADE + 1)]
N_BINS = len(EDGES) - 1
HEAT_GRID = 32  # the heat map's cells: at most HEAT_GRID x HEAT_GRID
