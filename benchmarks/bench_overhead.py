"""Harness overhead of a warm `verify run --level L0 -n 2`: wall time over the work itself
(the sum of golden, kernel and backward seconds over the cases, per worker), with the
wall time's parts: start-up and collection (until the first item is done), the items,
and the report written at the end. Everything is measured in one run, side by side."""
from __future__ import annotations

import json
import os
import re
import shutil
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
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    stamps = []  # (seconds since start, line) of the progress lines
    for line in proc.stdout:
        stamps.append((time.time() - t0, line.rstrip()))
    proc.wait()
    return time.time() - t0, t0, stamps


def _rebuild(run_dir: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "verify.cli", "report", str(run_dir)],
                   capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        _run(base, base / "store", "cold")  # computes the goldens: the next run is warm
        wall, t0, lines = _run(base, base / "store", "warm")
        df = pd.read_csv(base / "warm" / "results.csv")
        timing = json.loads((base / "warm" / "results.json").read_text())["meta"]["timing"]
        per_case = df.drop_duplicates(["op", "level", "case_id", "backend", "kernel"])
        work = sum(per_case[c].fillna(0).sum() for c in ("golden_s", "kernel_s", "backward_s"))
        progress = [t for t, ln in lines if re.match(r"verify: \d+/\d+ cases done", ln)]
        first_line = progress[0] if progress else float("nan")
        first, last = timing["first_result"] - t0, timing["last_result"] - t0
        reports = timing["reports_start"] - t0
        print(f"warm verify run --level L0 -n {WORKERS}: {len(per_case)} cases, {len(df)} rows")
        print(f"  wall {wall:.1f} s; work (golden + kernel + backward) {work:.1f} s, "
              f"{work / WORKERS:.1f} s per worker")
        print(f"  overhead ratio wall / (work / workers) = {wall / (work / WORKERS):.2f} "
              f"(target <= 1.3)")
        print(f"  start-up and collection (to the first result) {first:.1f} s (first progress "
              f"line at {first_line:.1f} s, target <= 15); items {last - first:.1f} s "
              f"({(last - first) / (len(per_case) / WORKERS) * 1e3:.1f} ms a case a worker, "
              f"of which the work {work / len(per_case) * 1e3:.1f} ms); workers' shut-down "
              f"{reports - last:.1f} s; reports, summary and exit {wall - reports:.1f} s")
        run_dir = base / "warm"
        warm = _rebuild(run_dir)
        shutil.rmtree(run_dir / ".figures", ignore_errors=True)
        cold = _rebuild(run_dir)
        print(f"  verify report of this run ({len(df)} rows): {cold:.2f} s with every figure "
              f"drawn, {warm:.2f} s with the figures cached (target <= 2 s)")


if __name__ == "__main__":
    main()
