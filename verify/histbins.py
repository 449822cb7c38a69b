"""The error histogram's fixed bins: log10 of the relative error from 1e-12 to 1e3, four
bins per decade. Shared by the metrics pass that counts and the report that draws."""
from __future__ import annotations

BIN_LO, BIN_HI, BINS_PER_DECADE = -12, 3, 4
EDGES = [BIN_LO + i / BINS_PER_DECADE for i in range((BIN_HI - BIN_LO) * BINS_PER_DECADE + 1)]
N_BINS = len(EDGES) - 1
