"""Stage 4, goldens: the float64 truth of a case. Where a golden comes from (the local
store, the registry, computed), the store, the registry's client and service, audits,
and the compute-precision floor kept beside each golden.
May import: errors, notices, comparator, specs, cases."""
