"""Stage 2, specs: what the harness knows of ops. The op and kernel registry and its
declarations (``declare_op``, ``@verify.kernel``, backends), call signatures, golden
versions, how an op's inputs are drawn, and the framework calls an op binds.
May import: errors, notices, comparator."""
