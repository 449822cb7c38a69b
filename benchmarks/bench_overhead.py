"""Harness overhead of a warm `verify run --level L0 -n 2`: wall time over the work itself
(the sum of golden, kernel and backward seconds over the cases, per worker), with the
wall time's parts: start-up and collection (until the first item is done), the items,
and the report written at the end. Everything is measured in one run, side by side."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

WORKERS = 2


def _run(reports: Path, store: Path, run_id: str) -> tuple[float, list[str]]:
    cmd = [sys.executable, "-m", "verify.cli", "run", "--level", "L0", "-n", str(WORKERS),
           "--reports", str(reports), "--run-id", run_id, "--store", str(store),
           "--progress-every", "0.001"]
    env = {**os.environ, "COLUMNS": "200"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    stamps = []  # (seconds since start, line) of the progress lines
    for line in proc.stdout:
        stamps.append((time.perf_counter() - t0, line.rstrip()))
    proc.wait()
    return time.perf_counter() - t0, stamps


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        _run(base, base / "store", "cold")  # computes the goldens: the next run is warm
        wall, lines = _run(base, base / "store", "warm")
        df = pd.read_csv(base / "warm" / "results.csv")
        per_case = df.drop_duplicates(["op", "level", "case_id", "backend", "kernel"])
        work = sum(per_case[c].fillna(0).sum() for c in ("golden_s", "kernel_s", "backward_s"))
        progress = [t for t, ln in lines if re.match(r"verify: \d+/\d+ cases done", ln)]
        summary = next((t for t, ln in lines if "precision summary" in ln), wall)
        first = progress[0] if progress else summary
        print(f"warm verify run --level L0 -n {WORKERS}: {len(per_case)} cases, {len(df)} rows")
        print(f"  wall {wall:.1f} s; work (golden + kernel + backward) {work:.1f} s, "
              f"{work / WORKERS:.1f} s per worker")
        print(f"  overhead ratio wall / (work / workers) = {wall / (work / WORKERS):.2f} "
              f"(target <= 1.3)")
        print(f"  start-up and collection (to the first progress line) {first:.1f} s; items "
              f"{summary - first:.1f} s; summary and reports {wall - summary:.1f} s")


if __name__ == "__main__":
    main()
