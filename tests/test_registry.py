"""The golden store and the registry service, for real: a `verify serve` process on a
loopback port, several processes and threads writing at once, corrupt and partial files."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pandas as pd
import pytest

import verify
from verify.golden.store import GoldenStore, hash_bytes

from helpers import REPO, Service, golden_blob, put_golden, run_cli, write_cases


@pytest.fixture
def service(tmp_path):
    svc = Service(tmp_path / "served", token="t0ken", max_body_mb=1)
    yield svc
    svc.stop()


KEY = "ab" * 32


def blob(value: float = 1.0, key: str | None = None) -> bytes:
    return golden_blob(value, key or KEY)


def sha(data: bytes) -> str:
    return hash_bytes(data)


def put(url, key, data, token="t0ken", announced=None):
    return put_golden(url, key, data, token, announced=announced)


def test_round_trip_and_read_endpoints(service):
    data = blob(2.0)
    assert put(service.url, KEY, data).status_code == 201
    assert put(service.url, KEY, data).status_code == 200  # already there
    got = httpx.get(f"{service.url}/v1/goldens/{KEY}")
    assert got.status_code == 200 and got.content == data
    assert got.headers["x-content-blake3"] == sha(data)
    head = httpx.head(f"{service.url}/v1/goldens/{KEY}")
    assert head.status_code == 200 and head.headers["content-length"] == str(len(data))
    assert httpx.get(f"{service.url}/v1/goldens/{'cd' * 32}").status_code == 404
    listing = httpx.get(f"{service.url}/v1/goldens", params={"limit": 1}).json()
    assert listing["total"] == 1 and listing["items"][0]["key"] == KEY
    stats = httpx.get(f"{service.url}/v1/stats").json()
    assert stats["goldens"] == 1 and stats["reads"] == 1 and stats["writes"] == 2
    spec = httpx.get(f"{service.url}/openapi.json").json()
    assert {"/v1/goldens/{key}", "/v1/goldens", "/v1/stats", "/healthz"} <= set(spec["paths"])
    assert {"get", "put", "head"} <= set(spec["paths"]["/v1/goldens/{key}"])


def test_writes_need_the_token(service):
    data = blob()
    assert put(service.url, KEY, data, token=None).status_code == 401
    assert put(service.url, KEY, data, token="wrong").status_code == 403
    assert httpx.head(f"{service.url}/v1/goldens/{KEY}").status_code == 404


@pytest.mark.parametrize("bad", ["abc", "AB" * 32, "g" * 64, "..%2F..%2Fetc%2Fpasswd"])
def test_bad_keys_are_400(service, bad):
    assert httpx.get(f"{service.url}/v1/goldens/{bad}").status_code in (400, 404)
    r = put(service.url, bad, blob())
    assert r.status_code in (400, 404)
    if "%2F" not in bad:
        assert r.status_code == 400


def test_oversized_bodies_are_413_and_bad_hashes_400(service):
    big = b"\0" * (2 << 20)  # 2 MiB against a 1 MiB limit
    assert put(service.url, KEY, big).status_code == 413

    def chunked():  # no Content-Length: refused while streaming
        for _ in range(3):
            yield b"\0" * (1 << 19)
    r = httpx.put(f"{service.url}/v1/goldens/{KEY}", content=chunked(),
                  headers={"Authorization": "Bearer t0ken", "X-Content-BLAKE3": "0" * 64})
    assert r.status_code == 413
    assert put(service.url, KEY, blob(), announced="0" * 64).status_code == 400
    assert put(service.url, KEY, b"not a safetensors file").status_code == 400
    assert httpx.get(f"{service.url}/v1/stats").json()["goldens"] == 0
    assert not list((service.store_dir / "tmp").glob("*.part"))


def test_eight_concurrent_puts_of_one_key_leave_one_intact_blob(service):
    data = blob(3.0)
    codes = []
    threads = [threading.Thread(target=lambda: codes.append(put(service.url, KEY, data).status_code))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) <= {200, 201} and len(codes) == 8
    blobs = list((service.store_dir / "blobs").glob("*/*.safetensors"))
    assert len(blobs) == 1 and blobs[0].read_bytes() == data
    assert not list((service.store_dir / "tmp").glob("*.part"))
    assert httpx.get(f"{service.url}/v1/goldens/{KEY}").content == data


def test_runs_share_goldens_through_the_service(service, tmp_path, monkeypatch):
    monkeypatch.setenv("VERIFY_REGISTRY_TOKEN", "t0ken")
    first = verify.run(level="L0", ops=["sgd_momentum"], store=str(tmp_path / "a"),
                       registry=service.url, reports=False, backends=["torch"])
    assert {r["golden_source"] for r in first.rows} == {"computed"}
    monkeypatch.delenv("VERIFY_REGISTRY_TOKEN")
    second = verify.run(level="L0", ops=["sgd_momentum"], store=str(tmp_path / "b"),
                        registry=service.url, reports=False, backends=["torch"])
    assert {r["golden_source"] for r in second.rows} == {"registry"}
    assert second.exit_status == 0
    third = verify.run(level="L0", ops=["sgd_momentum"], store=str(tmp_path / "b"),
                       registry=service.url, reports=False, backends=["torch"])
    assert {r["golden_source"] for r in third.rows} == {"local"}
    for a, b in zip(first.rows, second.rows):
        assert (a["case_id"], a["output"], a["max_abs"]) == (b["case_id"], b["output"], b["max_abs"])


def test_a_run_without_the_token_pushes_nothing(service, tmp_path, monkeypatch):
    monkeypatch.delenv("VERIFY_REGISTRY_TOKEN", raising=False)
    verify.run(level="L0", ops=["lion"], store=str(tmp_path / "a"), registry=service.url,
               reports=False)
    assert httpx.get(f"{service.url}/v1/stats").json()["goldens"] == 0


def test_registry_down_falls_back_unless_required(tmp_path):
    out = run_cli("run", "--op", "lion", "--dtype", "fp32", "--store", tmp_path / "s",
                  "--registry", "http://127.0.0.1:9", "--reports", tmp_path, "--run-id", "r",
                  "--backend", "torch")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "not reachable" in out.stderr
    df = pd.read_csv(tmp_path / "r" / "results.csv")
    assert set(df["golden_source"]) == {"computed"}
    out = run_cli("run", "--op", "lion", "--store", tmp_path / "s", "--registry",
                  "http://127.0.0.1:9", "--registry-required", "--reports", tmp_path)
    assert out.returncode == 2 and "not reachable" in out.stdout + out.stderr


def test_graceful_shutdown_finishes_an_upload_in_flight(tmp_path):
    svc = Service(tmp_path / "served", token="t0ken", max_body_mb=1)
    data = blob(5.0)
    result = {}
    started = threading.Event()

    def slow():
        for i in range(0, len(data), 64):
            started.set()
            time.sleep(0.05)
            yield data[i:i + 64]

    def upload():
        result["status"] = httpx.put(
            f"{svc.url}/v1/goldens/{KEY}", content=slow(), timeout=60,
            headers={"Authorization": "Bearer t0ken", "X-Content-BLAKE3": sha(data),
                     "Content-Length": str(len(data))}).status_code

    t = threading.Thread(target=upload)
    t.start()
    started.wait(10)
    time.sleep(0.2)
    svc.proc.send_signal(signal.SIGTERM)  # uvicorn stops accepting, finishes in-flight
    t.join(60)
    svc.stop()
    assert result.get("status") == 201
    store = GoldenStore(tmp_path / "served")
    assert store.entry(KEY) is not None and store.check() == []


# -- the local store ---------------------------------------------------------------------
def test_corrupt_blob_is_detected_recomputed_and_replaced(tmp_path):
    store_dir = tmp_path / "s"
    first = verify.run(level="L0", ops=["apply_rms_prop"], store=str(store_dir), reports=False,
                       backends=["torch"])
    assert {r["golden_source"] for r in first.rows if r.get("golden_source")} == {"computed"}
    store = GoldenStore(store_dir)
    victim = store.entries()[0]
    path = store.blob_path(victim.digest)
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF  # one flipped byte in the tensor data
    path.write_bytes(bytes(raw))
    assert [e.key for e, _ in store.check()] == [victim.key]
    again = verify.run(level="L0", ops=["apply_rms_prop"], store=str(store_dir), reports=False,
                       backends=["torch"])
    sources = {r["case_id"]: r["golden_source"] for r in again.rows if r.get("golden_source")}
    assert sources[victim.case_id] == "computed"
    assert sum(s == "computed" for s in sources.values()) == 1
    assert again.exit_status == 0 and store.check() == []
    truncated = store.blob_path(store.entries()[1].digest)
    truncated.write_bytes(truncated.read_bytes()[:100])
    out = run_cli("golden", "check", "--store", store_dir)
    assert out.returncode == 1 and "1 corrupt" in out.stdout


WRITER = """
import sys, time
from verify.store import GoldenStore, hash_bytes
store = GoldenStore(sys.argv[1])
with store.writer("{key}") as w:
    w.write(b"x" * 1000)
    print("writing", flush=True)
    time.sleep(60)
    w.commit("0" * 64)
"""


def test_a_killed_writer_leaves_no_visible_partial_golden(tmp_path):
    store_dir = tmp_path / "s"
    GoldenStore(store_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(key=KEY), str(store_dir)],
                            env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.kill()
    proc.wait()
    store = GoldenStore(store_dir)
    assert store.entry(KEY) is None and store.get_tensors(KEY) is None
    assert not list((store_dir / "blobs").glob("*/*"))
    assert len(list((store_dir / "tmp").glob("*.part"))) == 1  # invisible; gc removes it
    store.gc(set(), stale_tmp_s=0)
    assert not list((store_dir / "tmp").glob("*.part"))


TWO_KERNELS = """
import verify
from verify.kernels.torch.optimizers import apply_adam_w_v2
for name in ("a", "b", "c", "d"):
    verify.kernel("apply_adam_w_v2", backend=name)(apply_adam_w_v2)
"""


def test_two_xdist_workers_compute_one_golden_once(tmp_path):
    write_cases(tmp_path / "cases", {"op": "apply_adam_w_v2", "levels": {"L0": [
        {"id": "shared", "shape": [512, 2048], "dtype": "fp32"}]}})
    (tmp_path / "four.py").write_text(TWO_KERNELS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "VERIFY_STORE": str(tmp_path / "s")}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "verify",
                          "--cases-only", "-n", "2", "--level", "L0", "--cases", str(tmp_path / "cases"),
                          "--kernels", str(tmp_path / "four.py"), "--backend", "a",
                          "--backend", "b", "--backend", "c", "--backend", "d",
                          "--reports", str(tmp_path), "--run-id", "x"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = json.loads((tmp_path / "x" / "results.json").read_text())["rows"]
    per_item = {(r["backend"], r["golden_source"]) for r in rows}
    assert len({b for b, _ in per_item}) == 4 and {r["worker"] for r in rows} == {"gw0", "gw1"}
    assert sorted(s for _, s in per_item).count("computed") == 1
    assert len(GoldenStore(tmp_path / "s").entries()) == 1


def test_golden_commands(tmp_path):
    store_dir = tmp_path / "s"
    out = run_cli("golden", "warm", "--level", "L0", "--op", "lion", "--store", store_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    n = len(verify.run(level="L0", ops=["lion"], reports=False, store=str(tmp_path / "x"),
                       backends=["torch"]).rows) // 2
    assert f"{n} goldens ready" in out.stdout and f"{n} computed" in out.stdout
    again = run_cli("golden", "warm", "--level", "L0", "--op", "lion", "--store", store_dir)
    assert f"{n} already stored" in again.stdout
    ls = run_cli("golden", "ls", "--store", store_dir)
    assert ls.returncode == 0 and "lion" in ls.stdout and f"{n} goldens" in ls.stdout
    assert run_cli("golden", "check", "--store", store_dir).returncode == 0
    write_cases(tmp_path / "fewer", {"op": "lion", "defaults": {"seed": 41}, "levels": {"L0": [
        {"id": "small", "shape": [[8, 8], [1, 1], [33, 129]], "dtype": ["fp32", "bf16", "fp16"]}]}},
        name="lion")
    gc = run_cli("golden", "gc", "--store", store_dir, "--cases", tmp_path / "fewer")
    assert gc.returncode == 0 and "removed" in gc.stdout
    kept = GoldenStore(store_dir).entries()
    assert len(kept) == 9 and all(e.case_id.startswith("small-") for e in kept)


def test_a_changed_golden_is_a_new_key():
    import dataclasses
    spec = verify.op("lion")
    from verify.cases import case as case_mod
    case = next(c for c in case_mod.load_dir(REPO / "test_cases", ["lion"]))
    bumped = dataclasses.replace(spec, version="v2-explicit")
    assert case.golden_key(spec.golden_version) != case.golden_key(bumped.golden_version)
