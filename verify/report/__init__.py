"""Stage 5, reports: what a run leaves. The result row and its columns, results.csv /
results.json, the terminal summary, diff tables, the HTML report, JUnit XML, merging
shard runs and run-to-run diffs.
May import: errors, notices, comparator, specs, cases, golden."""
