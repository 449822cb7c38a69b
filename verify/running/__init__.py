"""Stage 6, running: a case through its kernel. The runner (inputs, kernel, golden,
compare, rows), its run context, time limits, crash isolation in xdist workers, devices,
the pytest plugin, the Ray driver and tasks, and ``verify strategies``.
May import: every stage below (errors, notices, comparator, specs, cases, golden, report)."""
