"""Fuzz the case loader at scale: N random mutations of the real case files, each loaded
in-process under a time limit, then a sample run through `verify run`.

    python benchmarks/fuzz_case_files.py [N] [CLI_RUNS]     (default 2000, 30)

Prints files tried, loaded, refused (exit 2 with a message naming the file), tracebacks
and hangs (both must be 0), the largest memory growth of one load, and for the CLI
sample: exit 2, normal runs (0 or 1), anything else.
"""
from __future__ import annotations

import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from case_mutations import mutate, random_json  # noqa: E402

import verify.kernels  # noqa: E402,F401
from verify.cases import case as cases
from verify.running import deadline  # noqa: E402
from verify.errors import ConfigError  # noqa: E402

LOAD_LIMIT_S = 10


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    cli_runs = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    seeds = sorted((REPO / "test_cases").glob("*.json"))
    rng = random.Random(2026)
    counts = {"loaded": 0, "refused": 0, "traceback": 0, "hang": 0}
    worst_growth, slowest = 0.0, 0.0
    loaded_files, refused_files, problems = [], [], []
    with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
        tmp = Path(d)
        for i in range(n):
            seed = rng.choice(seeds)
            data = mutate(seed.read_bytes(), rng, random_json(rng), rng.random() < 0.4)
            folder = tmp / f"f{i}"
            folder.mkdir()
            path = folder / seed.name
            path.write_bytes(data)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t0 = time.perf_counter()
            try:
                with deadline.time_limit(LOAD_LIMIT_S):
                    cases.load_file(path)
                counts["loaded"] += 1
                loaded_files.append(path)
            except ConfigError:
                counts["refused"] += 1
                refused_files.append(path)
            except deadline.CaseTimeout:
                counts["hang"] += 1
                problems.append((path, "hang"))
            except Exception as exc:  # noqa: BLE001 (what we are counting)
                counts["traceback"] += 1
                problems.append((path, f"{type(exc).__name__}: {exc}"[:200]))
            slowest = max(slowest, time.perf_counter() - t0)
            grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
            worst_growth = max(worst_growth, grown)
        print(f"case loader: {n} mutated files tried: {counts['loaded']} loaded, "
              f"{counts['refused']} refused with a ConfigError, tracebacks "
              f"{counts['traceback']}, hangs {counts['hang']}; slowest load {slowest:.2f} s, "
              f"largest memory growth of one load {worst_growth:.0f} MiB")
        for path, what in problems[:10]:
            print(f"  {path}: {what}")
        cli = {"exit 2": 0, "normal run": 0, "other": 0}
        sample = (rng.sample(refused_files, min(len(refused_files), cli_runs // 2))
                  + rng.sample(loaded_files, min(len(loaded_files), cli_runs - cli_runs // 2)))
        for path in sample:
            try:
                out = subprocess.run(
                    [sys.executable, "-m", "verify.cli", "run", "--level", "L0", "--cases",
                     str(path.parent), "--backend", "torch", "-n", "0", "--case-timeout", "60",
                     "--store", str(tmp / "store"), "--reports", str(tmp / "reports")],
                    capture_output=True, text=True, timeout=900, cwd=tmp)
            except subprocess.TimeoutExpired:
                cli["other"] += 1
                print(f"  {path}: the CLI run hung")
                continue
            traceback = "Traceback" in out.stderr
            if out.returncode == 2 and not traceback:
                cli["exit 2"] += 1
            elif out.returncode in (0, 1) and not traceback:
                cli["normal run"] += 1
            else:
                cli["other"] += 1
                print(f"  {path}: exit {out.returncode}: {out.stderr[-300:]}")
        print(f"verify run on {len(sample)} of them: {cli['exit 2']} exit 2, "
              f"{cli['normal run']} normal runs (exit 0 or 1), {cli['other']} other "
              f"(tracebacks, hangs)")


if __name__ == "__main__":
    main()
