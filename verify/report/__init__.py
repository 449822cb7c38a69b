"""Reports people read: the HTML report, JUnit XML, and run-to-run diffs."""
