"""Stage 1, the comparator: how one output is judged against its float64 golden.
dtypes and their precision constants, the metrics pass (MERE, MARE, ULP, ... and the
output-dtype error floor in one read), the standards (CANN v1 / v2, msprobe, allclose,
ULP), msprobe's benchmark standard and the report's plot data.
May import: errors, notices. Nothing here knows of ops, cases or runs."""
