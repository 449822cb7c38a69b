"""Goldens that cannot be poisoned silently: write-once keys, read / write / admin tokens
from the environment, blobs bound to their key, provenance checked by clients, TLS, slow
clients cut off, and `verify golden audit` recomputing what a registry serves."""
import json
import socket
import ssl
import subprocess
import time

import httpx
import pytest
from safetensors import safe_open
from safetensors.torch import save as st_save

import verify
from verify.golden.store import GoldenStore

from helpers import Service, golden_blob, put_golden, run_cli

KEY = "ab" * 32
OTHER = "cd" * 32


def blob(value: float, key: str = KEY) -> bytes:
    return golden_blob(value, key)


def put(url, key, data, token="w", meta='{"op": "t"}', params=None):
    return put_golden(url, key, data, token, meta=meta, params=params)


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    s = Service(tmp_path_factory.mktemp("served"), token="w", read_token="r", admin_token="a")
    yield s
    s.stop()


def test_keys_are_write_once_and_only_the_admin_replaces(svc):
    first, second = blob(1.0), blob(2.0)
    assert put(svc.url, KEY, first).status_code == 201
    assert put(svc.url, KEY, first).status_code == 200           # the same bytes: idempotent
    r = put(svc.url, KEY, second)
    assert r.status_code == 409 and "write-once" in r.json()["detail"]
    assert put(svc.url, KEY, second, params={"replace": "true"}).status_code == 403
    assert put(svc.url, KEY, second, token="a", params={"replace": "true"}).status_code == 200
    got = httpx.get(f"{svc.url}/v1/goldens/{KEY}", headers={"Authorization": "Bearer r"})
    assert got.content == second


def test_reads_need_the_read_token_when_one_is_set(svc):
    put(svc.url, OTHER, blob(3.0, key=OTHER))
    url = f"{svc.url}/v1/goldens/{OTHER}"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer nope"}).status_code == 403
    for token in ("r", "w", "a"):
        assert httpx.get(url, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert httpx.get(f"{svc.url}/v1/goldens").status_code == 401
    assert httpx.get(f"{svc.url}/healthz").status_code == 200
    assert put(svc.url, "ef" * 32, blob(1.0, key="ef" * 32), token="r").status_code == 403


@pytest.mark.parametrize("key, data, meta, why", [
    ("12" * 32, lambda: blob(1.0, key=KEY), '{"op": "t"}', "computed for key"),
    ("34" * 32, lambda: blob(1.0, key="34" * 32), "[1, 2]", "JSON object"),
    ("56" * 32, lambda: blob(1.0, key="56" * 32), "not json", "JSON object"),
])
def test_bad_uploads_are_400_before_anything_is_stored(svc, key, data, meta, why):
    r = put(svc.url, key, data(), meta=meta)
    assert r.status_code == 400 and why in r.json()["detail"], r.text
    assert httpx.head(f"{svc.url}/v1/goldens/{key}",
                      headers={"Authorization": "Bearer r"}).status_code == 404


def test_a_key_with_a_trailing_newline_is_400(svc):
    r = httpx.put(f"{svc.url}/v1/goldens/{'78' * 32}%0A", content=b"x",
                  headers={"Authorization": "Bearer w"})
    assert r.status_code == 400


def test_a_client_that_sends_headers_slowly_is_cut_off(svc):
    port = int(svc.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 25:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                closed = True
                break
            try:
                sock.settimeout(1)
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
        assert closed and time.monotonic() - t0 < 20, "slow headers were never timed out"


def test_the_token_is_never_taken_from_the_command_line(tmp_path):
    out = run_cli("serve", "--store", tmp_path / "s", "--token", "secret")
    assert out.returncode == 2 and "process list" in out.stderr


def test_a_client_rejects_a_golden_computed_from_other_code(tmp_path, monkeypatch):
    """A golden whose record names another golden version (or other inputs) is refused by
    the client and computed locally, with a warning the run reports."""
    served = tmp_path / "served"
    first = verify.run(level="L0", ops=["lion"], dtypes=["fp32"], store=str(served),
                       reports=False, backends=["torch"])
    assert first.exit_status == 0
    store = GoldenStore(served)
    victim = store.entries()[0]
    with safe_open(str(store.blob_path(victim.digest)), framework="pt") as f:
        md = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta = json.loads(md["meta"])
    meta["golden_version"] = "someone-elses-code"
    md["meta"] = json.dumps(meta)
    forged = st_save(tensors, metadata=md)
    store.remove(victim.key, drop_blob=True)
    s = Service(served, token="w")
    try:
        assert put(s.url, victim.key, forged).status_code == 201
        run = verify.run(level="L0", ops=["lion"], dtypes=["fp32"], store=str(tmp_path / "c"),
                         registry=s.url, reports=False, backends=["torch"])
    finally:
        s.stop()
    sources = {r["case_id"]: r["golden_source"] for r in run.rows}
    assert sources[victim.case_id] == "computed"
    assert any("rejected" in w and "golden_version" in w for w in run.warnings), run.warnings


def test_audit_finds_a_poisoned_golden_on_the_registry(tmp_path):
    """A write-token holder uploads a golden with the right key and record but wrong
    values (a sign flip): only recomputing shows it, and the audit does."""
    made = tmp_path / "made"
    verify.run(level="L0", ops=["lion"], dtypes=["fp32"], store=str(made), reports=False,
               backends=["torch"])
    store = GoldenStore(made)
    entries = store.entries()
    victim = entries[0]
    with safe_open(str(store.blob_path(victim.digest)), framework="pt") as f:
        md = dict(f.metadata())
        tensors = {k: -f.get_tensor(k) for k in f.keys()}
    s = Service(tmp_path / "served", token="w")
    try:
        assert put(s.url, victim.key, st_save(tensors, metadata=md)).status_code == 201
        for e in entries[1:]:
            data = store.blob_path(e.digest).read_bytes()
            assert put(s.url, e.key, data).status_code == 201
        out = run_cli("golden", "audit", "--registry", s.url)
        sample = run_cli("golden", "audit", "--registry", s.url, "--sample", "0.01")
    finally:
        s.stop()
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 differ" in out.stdout and victim.key[:16] in out.stdout, out.stdout
    assert f"audited 1 of {len(entries)}" in sample.stdout, sample.stdout


def test_tls_when_given_a_certificate(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                           "2", "-subj", "/CN=127.0.0.1", "-addext",
                           "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                           str(cert)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"openssl cannot make a test certificate: {made.stderr[-300:]}")
    s = Service(tmp_path / "served", token="w", tls=(cert, key))
    try:
        assert s.url.startswith("https://")
        with pytest.raises(httpx.HTTPError):  # an unknown CA is refused
            httpx.get(f"{s.url}/healthz")
        monkeypatch.setenv("VERIFY_REGISTRY_TOKEN", "w")
        monkeypatch.setenv("VERIFY_REGISTRY_CA", str(cert))
        run = verify.run(level="L0", ops=["lion"], dtypes=["fp32"], store=str(tmp_path / "a"),
                         registry=s.url, reports=False, backends=["torch"])
        served = httpx.get(f"{s.url}/v1/stats", verify=ssl.create_default_context(cafile=str(cert))).json()["goldens"]
    finally:
        s.stop()
    assert run.exit_status == 0 and served == len({r["case_id"] for r in run.rows})
