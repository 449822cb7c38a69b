"""Golden registry benchmarks, each measured side by side in one run:

1. cold vs warm: `verify.run` with an empty store, then again with every golden stored,
   per op (run time and golden time) at L0 and L1;
2. a ~100 MB golden fetched from `verify serve` on loopback vs read from the local store;
3. 50 concurrent clients reading stored goldens for 30 s: requests/s, p50 / p99, errors.
"""
from __future__ import annotations

import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

import verify
from verify.specs import registry
from verify.golden.registry_client import RegistryClient
from verify.golden.store import GoldenStore

LOAD_SECONDS = float(os.environ.get("BENCH_LOAD_SECONDS", "30"))
CLIENTS = 50
READ_TOKEN = "bench-read"  # reads need a token: the load test measures the checked path


def cold_vs_warm(level: str, tmp: Path) -> None:
    print(f"\n1. cold vs warm goldens at {level} (in-process verify.run, per op)")
    print(f"  {'op':34s} {'run cold':>9s} {'run warm':>9s} {'ratio':>6s}   "
          f"{'golden cold':>11s} {'golden warm':>11s} {'ratio':>7s}")
    tot = [0.0, 0.0, 0.0, 0.0]
    for op in registry.ops():
        store = str(tmp / f"{level}-{op}")
        times, golden = [], []
        for _ in range(2):
            t0 = time.perf_counter()
            res = verify.run(level=level, ops=[op], store=store, reports=False)
            times.append(time.perf_counter() - t0)
            seen = {}
            for r in res.rows:
                if r.get("golden_s") is not None:
                    seen[(r["case_id"], r["kernel"])] = r["golden_s"]
            golden.append(sum(seen.values()))
        tot = [a + b for a, b in zip(tot, times + golden)]
        print(f"  {op:34s} {times[0]:8.2f}s {times[1]:8.2f}s {times[0] / times[1]:5.1f}x   "
              f"{golden[0]:10.3f}s {golden[1]:10.3f}s {golden[0] / max(golden[1], 1e-9):6.1f}x")
    print(f"  {'all ops':34s} {tot[0]:8.2f}s {tot[1]:8.2f}s {tot[0] / tot[1]:5.1f}x   "
          f"{tot[2]:10.3f}s {tot[3]:10.3f}s {tot[2] / max(tot[3], 1e-9):6.1f}x")


def network_shape(tmp: Path) -> None:
    """One AdamW case at [7168, 4096] fp32: a golden of 0.7 GB that is worth storing."""
    import json
    print("\n1b. cold vs warm where the golden dominates: AdamW [7168, 4096] fp32")
    cases = tmp / "net_cases"
    cases.mkdir()
    (cases / "apply_adam_w_v2.json").write_text(json.dumps({
        "op": "apply_adam_w_v2", "levels": {"L2": [
            {"id": "net", "shape": [7168, 4096], "dtype": "fp32"}]}}))
    store = str(tmp / "net_store")
    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        res = verify.run(level="L2", cases=str(cases), store=store, reports=False)
        out.append((time.perf_counter() - t0, res.rows[0]["golden_s"], res.rows[0]["golden_source"]))
    (rc, gc, sc), (rw, gw, sw) = out
    print(f"  golden: {sc} {gc:.2f} s, then {sw} {gw:.2f} s = {gc / gw:.1f}x faster")
    print(f"  whole run (inputs, kernel, golden, 3 comparisons with floor): {rc:.2f} s cold, "
          f"{rw:.2f} s warm = {rc / rw:.1f}x")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(store_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "VERIFY_REGISTRY_TOKEN": "bench",        # tokens travel in the
           "VERIFY_REGISTRY_READ_TOKEN": READ_TOKEN}              # environment, not argv
    proc = subprocess.Popen([sys.executable, "-m", "verify.cli", "serve", "--store",
                             str(store_dir), "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("service did not start")


def fetch_vs_local(tmp: Path) -> None:
    print("\n2. a ~100 MB golden: fetched from the service vs read from the local store")
    served = GoldenStore(tmp / "served")
    key = "f" * 64
    golden = torch.randn(100 * (1 << 20) // 8, dtype=torch.float64)
    entry = served.put_tensors(key, {"0/out": golden}, {"op": "bench"})
    proc, url = start_service(tmp / "served")
    try:
        rows = []
        for i in range(3):
            local = GoldenStore(tmp / f"client{i}")
            client = RegistryClient(url, read_token=READ_TOKEN)
            t0 = time.perf_counter()
            assert client.fetch(key, local)
            t_fetch = time.perf_counter() - t0
            client.close()
            t0 = time.perf_counter()
            got = local.get_tensors(key)
            t_local = time.perf_counter() - t0
            assert torch.equal(got["0/out"], golden)
            rows.append((t_fetch, t_local))
        mb = entry.size / 1e6
        fetch = min(r[0] for r in rows)
        local = min(r[1] for r in rows)
        print(f"  blob {mb:.1f} MB; best of 3")
        print(f"  fetch from service (stream, hash, fsync, index): {fetch * 1e3:7.1f} ms = "
              f"{mb / fetch:7.1f} MB/s")
        print(f"  read from local store (re-hash and load):        {local * 1e3:7.1f} ms = "
              f"{mb / local:7.1f} MB/s")
        print(f"  fetch / local time ratio: {fetch / local:.2f}")
    finally:
        proc.terminate()
        proc.wait()


async def _client(url: str, keys: list[str], deadline: float, lat: list, errors: list):
    async with httpx.AsyncClient(base_url=url, timeout=30,
                                 headers={"Authorization": f"Bearer {READ_TOKEN}"}) as http:
        while time.perf_counter() < deadline:
            key = random.choice(keys)
            t0 = time.perf_counter()
            try:
                r = await http.get(f"/v1/goldens/{key}")
                if r.status_code != 200 or not r.content:
                    errors.append(r.status_code)
            except httpx.HTTPError as exc:
                errors.append(type(exc).__name__)
            lat.append(time.perf_counter() - t0)


def load(tmp: Path) -> None:
    print(f"\n3. {CLIENTS} concurrent clients reading stored goldens for {LOAD_SECONDS:.0f} s")
    store_dir = tmp / "load"
    verify.run(level="L0", store=str(store_dir), reports=False)
    keys = [e.key for e in GoldenStore(store_dir).entries()]
    sizes = [e.size for e in GoldenStore(store_dir).entries()]
    proc, url = start_service(store_dir)
    try:
        lat: list = []
        errors: list = []
        deadline = time.perf_counter() + LOAD_SECONDS

        async def main():
            await asyncio.gather(*(_client(url, keys, deadline, lat, errors)
                                   for _ in range(CLIENTS)))

        t0 = time.perf_counter()
        asyncio.run(main())
        elapsed = time.perf_counter() - t0
        lat.sort()
        print(f"  {len(keys)} goldens of {min(sizes)}..{max(sizes)} bytes "
              f"(median {int(statistics.median(sizes))})")
        print(f"  {len(lat)} requests in {elapsed:.1f} s = {len(lat) / elapsed:.0f} req/s; "
              f"p50 {lat[len(lat) // 2] * 1e3:.1f} ms, p99 {lat[int(len(lat) * 0.99)] * 1e3:.1f} ms; "
              f"errors {len(errors)}")
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    """BENCH_ONLY=load (or cold, net, fetch) runs one part."""
    only = os.environ.get("BENCH_ONLY")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if only in (None, "cold"):
            for level in ("L0", "L1"):
                cold_vs_warm(level, tmp)
        if only in (None, "net"):
            network_shape(tmp)
        if only in (None, "fetch"):
            fetch_vs_local(tmp)
        if only in (None, "load"):
            load(tmp)


if __name__ == "__main__":
    main()
