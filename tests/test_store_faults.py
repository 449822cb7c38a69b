"""A store that degrades: full disk, locked, corrupt or read-only index, swapped blobs.
The run goes on with goldens computed in memory, one warning says what to do, no
computed golden becomes an ERROR row; a corrupt index is rebuilt from the blobs."""
import json
import os
import sqlite3
import subprocess
import sys

import pytest

import verify
from verify.golden import store as store_mod
from verify.golden.store import GoldenStore

from helpers import REPO, run_cli

FULL_DISK = """
import json, resource, signal, sys
import verify
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails (EFBIG)
resource.setrlimit(resource.RLIMIT_FSIZE, (24 << 10, 24 << 10))
run = verify.run(level="L0", ops=["lion"], dtypes=["fp32"], store=sys.argv[1],
                 reports=False, backends=["torch"])
print(json.dumps({"counts": run.counts, "warnings": run.warnings,
                  "sources": sorted({r["golden_source"] for r in run.rows})}))
"""


def _lion(store, **kw):
    return verify.run(level="L0", ops=["lion"], dtypes=["fp32"], store=str(store),
                      reports=False, backends=["torch"], **kw)


def test_a_full_disk_degrades_the_store_not_the_run(tmp_path):
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path / "s")],
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["counts"]["ERROR"] == 0 and doc["counts"]["PASS"] > 0, doc
    degraded = [w for w in doc["warnings"] if "degraded" in w]
    assert len(degraded) == 1 and "--store" in degraded[0], doc["warnings"]
    assert "Traceback" not in out.stderr


def test_a_corrupt_index_is_rebuilt_from_the_blobs(tmp_path):
    first = _lion(tmp_path / "s")
    n = len(GoldenStore(tmp_path / "s").entries(derived=True))  # every blob, floors too
    (tmp_path / "s" / "index.sqlite").write_bytes(b"garbage, not SQLite" * 100)
    for suffix in ("-wal", "-shm"):
        (tmp_path / "s" / f"index.sqlite{suffix}").unlink(missing_ok=True)
    again = _lion(tmp_path / "s")
    assert again.exit_status == 0 == first.exit_status
    assert {r["golden_source"] for r in again.rows} == {"local"}
    assert any(f"rebuilt from {n} blobs" in w for w in again.warnings), again.warnings
    assert list((tmp_path / "s").glob("index.sqlite.corrupt-*"))


def test_a_locked_index_degrades_after_a_short_wait(tmp_path, monkeypatch):
    GoldenStore(tmp_path / "s")
    monkeypatch.setattr(store_mod, "BUSY_TIMEOUT_S", 0.5)
    holder = sqlite3.connect(tmp_path / "s" / "index.sqlite", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        run = _lion(tmp_path / "s")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert run.counts["ERROR"] == 0 and run.exit_status == 0
    assert {r["golden_source"] for r in run.rows} == {"computed"}
    (warning,) = [w for w in run.warnings if "degraded" in w]
    assert "locked" in warning and "another process" in warning


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only permissions")
def test_a_read_only_store_degrades(tmp_path):
    _lion(tmp_path / "s")
    for path in [tmp_path / "s", *(tmp_path / "s").rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        run = _lion(tmp_path / "s")
    finally:
        for path in [tmp_path / "s", *(tmp_path / "s").rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert run.counts["ERROR"] == 0 and run.exit_status == 0
    assert any("degraded" in w for w in run.warnings)


def test_a_swapped_blob_is_caught_and_recomputed(tmp_path):
    _lion(tmp_path / "s")
    store = GoldenStore(tmp_path / "s")
    a, b = store.entries()[:2]
    with sqlite3.connect(store.db_path) as db:  # a's row now names b's (valid) blob
        db.execute("UPDATE goldens SET digest=?, size=? WHERE key=?", (b.digest, b.size, a.key))
    assert store.get_tensors(a.key) is None and store.entry(a.key) is None
    run = _lion(tmp_path / "s")
    sources = {r["case_id"]: r["golden_source"] for r in run.rows}
    assert sources[a.case_id] == "computed" and run.exit_status == 0


def test_store_or_reports_naming_a_file_is_exit_2_at_once(tmp_path):
    (tmp_path / "f").write_text("")
    out = run_cli("run", "--op", "lion", "--store", tmp_path / "f", "--reports", tmp_path)
    assert out.returncode == 2 and "not a folder" in out.stderr, out.stderr[-1500:]


def test_warnings_reach_the_summary_and_the_report_past_log_capture(tmp_path):
    """A corrupt blob recomputed in an isolated worker: the warning is in the terminal
    summary and in report.html, not lost to pytest's log capture."""
    _lion(tmp_path / "s")
    store = GoldenStore(tmp_path / "s")
    victim = store.entries()[0]
    path = store.blob_path(victim.digest)
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    out = run_cli("run", "--op", "lion", "--dtype", "fp32", "--backend", "torch", "--store",
                  tmp_path / "s", "--reports", tmp_path, "--run-id", "w")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "warning: golden" in out.stdout and "corrupt" in out.stdout, out.stdout[-2000:]
    html = (tmp_path / "w" / "report.html").read_text()
    assert "run-warnings" in html and "corrupt" in html
    meta = json.loads((tmp_path / "w" / "results.json").read_text())["meta"]
    assert any("corrupt" in w for w in meta["warnings"])


def test_check_finds_an_index_row_pointing_at_another_keys_blob(tmp_path):
    import torch

    from verify.golden.store import GoldenStore
    store = GoldenStore(tmp_path / "s")
    a, b = "a" * 64, "b" * 64
    store.put_tensors(a, {"x": torch.zeros(3, dtype=torch.float64)}, {"op": "t"})
    eb = store.put_tensors(b, {"x": torch.ones(3, dtype=torch.float64)}, {"op": "t"})
    with store._db() as db:  # a's row now names b's (valid) blob
        db.execute("UPDATE goldens SET digest=? WHERE key=?", (eb.digest, a))
    problems = {e.key: why for e, why in store.check()}
    assert a in problems and "another key" in problems[a] and b not in problems


def test_gc_removes_partial_writes_of_killed_writers_at_once(tmp_path):
    import subprocess
    import sys

    from verify.golden.store import GoldenStore
    store = GoldenStore(tmp_path / "s")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    orphan = tmp_path / "s" / "tmp" / f"{'c' * 16}.{dead}.abcd1234.part"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"x" * 100)
    alive = tmp_path / "s" / "tmp" / f"{'d' * 16}.{os.getpid()}.abcd1234.part"
    alive.write_bytes(b"y")
    store.gc(set())
    assert not orphan.exists() and alive.exists()


def test_a_read_only_intact_store_is_read(tmp_path, monkeypatch):
    """A shared store this user may not write (a cache mounted read-only): its goldens are
    read, not recomputed, and nothing is written to it. (Root writes through permission
    bits, so the store's unwritability is what os.access reports here.)"""
    import verify
    store = tmp_path / "shared"
    verify.run(level="L0", ops=["lion"], backends=["torch"], dtypes=["fp32"],
               store=str(store), reports=False)
    before = {p: p.stat().st_mtime_ns for p in store.rglob("*")}
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if (
        mode == os.W_OK and os.path.abspath(path) == str(store)) else real(path, mode, *a, **k))
    res = verify.run(level="L0", ops=["lion"], backends=["torch"], dtypes=["fp32"],
                     store=str(store), reports=False)
    sources = {r["golden_source"] for r in res.rows if r.get("golden_source")}
    assert sources == {"local"}, sources
    assert {p: p.stat().st_mtime_ns for p in store.rglob("*")} == before
    assert not res.warnings
