"""One L1 selection three ways, side by side in one run: pytest-xdist (-n 2), --ray local
(a one-node cluster started by the run) and a four-node local cluster (a golden node and
three kernel nodes, all in this process); each from a cold golden store. Prints wall
times, rows identical to the xdist run, Ray's per-task overhead (submission to start,
set-up, case), the cluster's start time and the memory (PSS) of its processes.
Needs the ray extra."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SELECTION = ["--level", "L1", "--op", "apply_rms_prop", "--op", "softmax", "--backend", "torch"]
KEEP = ("verdict", "standard", "reason", "mere", "mare", "max_abs", "max_rel", "rmse", "eb",
        "ulp_max", "margin", "inputs_sha")


def _cli(*args) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "verify.cli", "run", *SELECTION, *args],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    if out.returncode not in (0, 1):
        sys.exit(out.stdout[-2000:] + out.stderr[-3000:])
    return time.perf_counter() - t0


def _rows(run_dir: Path) -> dict:
    doc = json.loads((run_dir / "results.json").read_text())
    return {(r["op"], r["case_id"], r["backend"], r["kernel"], r["output"]):
            tuple(r.get(k) for k in KEEP) for r in doc["rows"]}, doc["meta"]


def _pss_of_ray() -> float:
    """MiB of proportional set size of every Ray process on this machine."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"ray" not in cmd or b"bench_ray" in cmd:
                continue
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _multi_node(tmp: Path) -> tuple[float, float, float, float]:
    """(cluster start s, run wall s, PSS MiB while up, shutdown s) of a 4-node cluster."""
    import ray
    from ray.cluster_utils import Cluster

    import verify
    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"golden": 1}, "object_store_memory": 96 << 20})
    for _ in range(3):
        cluster.add_node(num_cpus=1, resources={"NPU": 2}, object_store_memory=96 << 20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    up = time.perf_counter() - t0
    pss = _pss_of_ray()
    t1 = time.perf_counter()
    verify.run(level="L1", ops=["apply_rms_prop", "softmax"], backends=["torch"],
               store=str(tmp / "store-nodes"), reports=str(tmp), run_id="nodes", ray="auto",
               progress_every=0)
    wall = time.perf_counter() - t1
    t2 = time.perf_counter()
    ray.shutdown()
    cluster.shutdown()
    return up, wall, pss, time.perf_counter() - t2


def main() -> None:
    import ray
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    print(f"load average before: {os.getloadavg()[0]:.2f} (2-core machine)")
    t_x = _cli("-n", "2", "--reports", str(tmp), "--run-id", "xdist", "--store",
               str(tmp / "store-x"))
    t_l = _cli("--ray", "local", "--reports", str(tmp), "--run-id", "local", "--store",
               str(tmp / "store-l"), "--progress-every", "0")
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=256 << 20)
    start_local = time.perf_counter() - t0
    pss_local = _pss_of_ray()
    t0 = time.perf_counter()
    ray.shutdown()
    stop_local = time.perf_counter() - t0
    up, t_n, pss_nodes, stop_nodes = _multi_node(tmp)
    xdist, _ = _rows(tmp / "xdist")
    print(f"L1 selection ({' '.join(SELECTION)}): {len(xdist)} rows, goldens computed "
          f"(cold store) in each run")
    print(f"{'executor':<34}{'wall s':>8}{'identical rows':>16}{'submit->start':>15}"
          f"{'(process)':>10}{'setup':>8}{'case':>8}")
    print(f"{'-n 2 (pytest-xdist)':<34}{t_x:8.1f}{'-':>16}")
    for label, run_id, wall in (("--ray local (cluster start incl.)", "local", t_l),
                                ("4-node local cluster", "nodes", t_n)):
        rows, meta = _rows(tmp / run_id)
        same = sum(1 for k, v in xdist.items() if rows.get(k) == v)
        info = meta["ray"]
        print(f"{label:<34}{wall:8.1f}{f'{same}/{len(xdist)}':>16}"
              f"{info['median_submit_to_start_s']:15.2f}{info['median_process_start_s']:10.2f}"
              f"{info['median_setup_s']:8.2f}"
              f"{info['median_case_s']:8.2f}")
    print(f"one-node cluster: start {start_local:.1f} s, PSS of Ray's processes "
          f"{pss_local:.0f} MiB, shutdown {stop_local:.1f} s")
    print(f"4-node cluster: start {up:.1f} s, PSS {pss_nodes:.0f} MiB, shutdown "
          f"{stop_nodes:.1f} s")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
