"""The local golden store: content-addressed safetensors blobs, metadata in SQLite.

Layout under the store folder:
    index.sqlite                  key -> content digest (BLAKE3), size, op, case, golden version, created
    blobs/ab/<blake3>.safetensors one file per golden: every step's float64 outputs
    tmp/                          partial writes; renamed into blobs/ only when complete
    locks/<key>.lock              one computation per golden across processes

Why safetensors: a plain header plus raw little-endian tensor bytes, written straight from
tensor memory and read back without pickle, so a golden file is safe to fetch from a
shared service and needs no second copy to write. Why SQLite: many processes (xdist
workers, the service) read and write the index at once with transactions and no server.

Blobs are addressed by their BLAKE3 digest (a cryptographic hash that runs in parallel:
~11 GB/s here against ~1.2 GB/s for SHA-256), so the check on every read stays cheap next
to computing a golden. A corrupt or truncated blob is reported, removed and treated as
missing, so the caller recomputes and replaces it.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import secrets
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch
from blake3 import blake3
from filelock import FileLock
from safetensors import safe_open
from safetensors.torch import save_file

from verify import notices

log = logging.getLogger("verify.store")

KEY_RE = re.compile(r"[0-9a-f]{64}")
READ_CHUNK = 1 << 22
BUSY_TIMEOUT_S = 15.0  # a writer holds the index for milliseconds; longer is a stuck lock
APP_NAME = "kernel-verify"


class StoreUnavailable(Exception):
    """The store cannot be opened or written (read-only, disk full, index locked): the
    run goes on with goldens computed in memory."""


class CorruptBlob(Exception):
    """A blob whose bytes no longer match its content hash."""


class HashMismatch(ValueError):
    """Uploaded or fetched bytes that do not match the hash they were announced with."""


@dataclass
class Entry:
    key: str
    digest: str
    size: int
    op: str
    case_id: str
    golden_version: str
    created: float
    meta: dict

    def as_dict(self) -> dict:
        return {"key": self.key, "digest": self.digest, "size": self.size, "op": self.op,
                "case_id": self.case_id, "golden_version": self.golden_version,
                "created": self.created, "meta": self.meta}


def default_store_dir() -> str:
    """VERIFY_STORE, else ``goldens`` in the user's cache folder (platformdirs: e.g.
    ~/.cache/kernel-verify/goldens on Linux): one store per user, found the same way from
    any folder, never a new store in whatever folder a command runs from. (GoldenStore
    creates it on first write.)"""
    path = os.environ.get("VERIFY_STORE")
    if not path:
        from platformdirs import user_cache_dir
        path = os.path.join(user_cache_dir(APP_NAME, appauthor=False), "goldens")
    return path


def existing_store_dir(path: str | None = None) -> str:
    """The store a reading command (``verify golden ls / check / gc``) uses: it must exist;
    such commands never create one."""
    from verify.errors import ConfigError
    path = path or default_store_dir()
    if not Path(path).is_dir():
        raise ConfigError(f"golden store '{path}' does not exist (--store, VERIFY_STORE; "
                          f"a run or `verify golden warm` creates the default one)")
    if not (Path(path) / "index.sqlite").is_file() and any(Path(path).iterdir()):
        raise ConfigError(f"'{path}' is not a golden store (no index.sqlite in it)")
    return path


def valid_key(key: str) -> bool:
    return isinstance(key, str) and KEY_RE.fullmatch(key) is not None


PARALLEL_HASH_BYTES = 8 << 20  # below this, threads cost more than they save


def new_hasher(size_hint: int = 0):
    return blake3(max_threads=blake3.AUTO if size_hint >= PARALLEL_HASH_BYTES else 1)


def hash_file(path: Path) -> str:
    """BLAKE3 digest of a file; large ones memory-mapped and hashed on every core."""
    size = Path(path).stat().st_size
    if size < PARALLEL_HASH_BYTES:
        return new_hasher().update(Path(path).read_bytes()).hexdigest()
    return new_hasher(size).update_mmap(str(path)).hexdigest()


def hash_bytes(data: bytes) -> str:
    return new_hasher(len(data)).update(data).hexdigest()


def trajectory_to_tensors(traj: list[tuple[torch.Tensor, ...]], outputs: list[str]) -> dict:
    """Named tensors for a safetensors file, each with storage of its own (safetensors
    refuses shared storage; the gradients of x1 and x2 in x1 + x2 are one tensor)."""
    out, seen = {}, set()
    for s, step in enumerate(traj):
        for name, t in zip(outputs, step):
            t = t.detach().contiguous()
            ptr = t.untyped_storage().data_ptr() if t.numel() else None
            out[f"{s}/{name}"] = t.clone() if ptr in seen else t
            if ptr is not None:
                seen.add(ptr)
    return out


def tensors_to_trajectory(tensors: dict, outputs: list[str]) -> list[tuple[torch.Tensor, ...]]:
    steps = 1 + max(int(k.split("/")[0]) for k in tensors) if tensors else 0
    return [tuple(tensors[f"{s}/{name}"] for name in outputs) for s in range(steps)]


_OPEN: "weakref.WeakSet[GoldenStore]" = weakref.WeakSet()


def close_all() -> None:
    """Close every kept index connection of this process: the last one to close folds the
    write-ahead log into index.sqlite, so a reader that cannot write (a read-only copy of
    the store) sees every golden. Called at the end of a run and at exit."""
    for store in list(_OPEN):
        store.close()


atexit.register(close_all)


class GoldenStore:
    """A folder of goldens, safe for many processes at once."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root or default_store_dir())
        self.db_path = self.root / "index.sqlite"
        # a read-only store (a shared cache mounted read-only, say) is read, never written
        self.readonly = (self.root.is_dir() and self.db_path.is_file()
                         and not os.access(self.root, os.W_OK))
        self.rebuilt = None  # (blobs indexed, where the corrupt index was kept) if rebuilt
        if self.readonly:
            with self._db() as db:
                db.execute("SELECT COUNT(*) FROM goldens").fetchone()
            return
        for sub in ("blobs", "tmp", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._create_index()
        except sqlite3.DatabaseError as exc:
            if not _is_corrupt(exc):
                raise
            self.rebuilt = self._rebuild_index()

    def _create_index(self) -> None:
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("""CREATE TABLE IF NOT EXISTS goldens (
                key TEXT PRIMARY KEY, digest TEXT NOT NULL, size INTEGER NOT NULL,
                op TEXT NOT NULL, case_id TEXT NOT NULL, golden_version TEXT NOT NULL,
                created REAL NOT NULL, meta TEXT NOT NULL)""")
            db.execute("CREATE INDEX IF NOT EXISTS goldens_sha ON goldens(digest)")
            db.execute("SELECT COUNT(*) FROM goldens").fetchone()  # reads every page header

    def _rebuild_index(self) -> tuple[int, str]:
        """A corrupt index is kept aside and rebuilt from the blobs' own metadata (each
        blob records its key and what it was computed from); blobs whose bytes no longer
        match their name are left out."""
        kept = self.root / f"index.sqlite.corrupt-{int(time.time())}"
        self.close()
        os.replace(self.db_path, kept)
        for suffix in ("-wal", "-shm"):
            Path(f"{self.db_path}{suffix}").unlink(missing_ok=True)
        self._create_index()
        n = 0
        for blob in sorted((self.root / "blobs").glob("*/*.safetensors")):
            try:
                if hash_file(blob) != blob.stem:
                    continue
                embedded = blob_metadata(blob)
                key, meta = embedded.get("key", ""), json.loads(embedded.get("meta", "{}"))
            except Exception:  # unreadable: it stays out of the index
                continue
            if valid_key(key):
                self._index(key, blob.stem, blob.stat().st_size, meta)
                n += 1
        return n, str(kept)

    # -- plumbing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """The index, on a connection kept per process and thread: opening one (and its
        pragmas) cost more than the statement itself, several times per golden. A
        connection that raised is closed and not reused."""
        key = (os.getpid(), threading.get_ident())
        cache = self.__dict__.setdefault("_connections", {})
        _OPEN.add(self)
        db = cache.pop(key, None)
        if db is None:
            db = self._connect()
        try:
            yield db
        except BaseException:
            db.close()
            raise
        if not self.__dict__.get("_closed"):
            cache[key] = db
        else:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        if getattr(self, "readonly", False):  # no journal, no locks: nothing is written
            db = sqlite3.connect(f"file:{self.db_path}?mode=ro&immutable=1", uri=True,
                                 timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                 check_same_thread=False)
        else:
            db = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                 check_same_thread=False)
        try:
            db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            # WAL with synchronous NORMAL: a commit is not synced to disk (a power loss may
            # drop the last entries, whose goldens are then recomputed), never corrupts
            db.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        """Close the connections this process keeps to the index."""
        for db in self.__dict__.pop("_connections", {}).values():
            with contextlib.suppress(Exception):
                db.close()

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / f"{digest}.safetensors"

    def _tmp_path(self, key: str) -> Path:
        return self.root / "tmp" / f"{key[:16]}.{os.getpid()}.{secrets.token_hex(4)}.part"

    def lock(self, key: str, timeout: float = -1) -> FileLock:
        """Held while one process computes ``key``; others wait and then read it."""
        return FileLock(str(self.root / "locks" / f"{key}.lock"), timeout=timeout)

    # -- writing --------------------------------------------------------------------------
    def put_tensors(self, key: str, tensors: dict[str, torch.Tensor], meta: dict) -> Entry:
        """Write a golden: temp file, hash, rename into place, then index it. No fsync: a
        blob cut short by a power loss fails its hash on the next read and is recomputed
        (verified_path), so durability costs nothing a golden needs (an fsync per golden
        was a third of judging a recorded call)."""
        tmp = self._tmp_path(key)
        try:
            save_file(tensors, str(tmp), metadata={"key": key, "op": meta.get("op", ""),
                                                   "meta": json.dumps(meta, sort_keys=True)})
            return self._commit(key, tmp, hash_file(tmp), meta)
        finally:
            tmp.unlink(missing_ok=True)

    def writer(self, key: str, max_bytes: int | None = None) -> "BlobWriter":
        """A golden arriving in chunks (an upload, a fetch): write, then commit or abort."""
        return BlobWriter(self, key, max_bytes)

    def put_stream(self, key: str, chunks: Iterable[bytes], expected_digest: str,
                   max_bytes: int | None = None, expect: dict | None = None) -> Entry:
        with self.writer(key, max_bytes) as w:
            for chunk in chunks:
                w.write(chunk)
            return w.commit(expected_digest, expect=expect)

    def _commit(self, key: str, tmp: Path, digest: str, meta: dict) -> Entry:
        final = self.blob_path(digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        if not (final.exists() and hash_file(final) == digest):
            os.replace(tmp, final)  # atomic: readers see the old blob or the whole new one
        return self._index(key, digest, final.stat().st_size, meta)

    def _index(self, key: str, digest: str, size: int, meta: dict) -> Entry:
        entry = Entry(key, digest, size, meta.get("op", ""), meta.get("case_id", ""),
                      meta.get("golden_version", ""), time.time(), meta)
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO goldens VALUES (?,?,?,?,?,?,?,?)",
                       (entry.key, entry.digest, entry.size, entry.op, entry.case_id,
                        entry.golden_version, entry.created, json.dumps(meta, sort_keys=True)))
        return entry

    # -- reading --------------------------------------------------------------------------
    def entry(self, key: str) -> Entry | None:
        with self._db() as db:
            row = db.execute("SELECT * FROM goldens WHERE key=?", (key,)).fetchone()
        return _entry(row) if row else None

    def entries(self, offset: int = 0, limit: int | None = None,
                derived: bool = False) -> list[Entry]:
        """The goldens, oldest first; ``derived``: with the entries kept beside them (a
        case's compute-precision floor), which are no goldens of their own."""
        sql = "SELECT * FROM goldens" + ("" if derived else f" WHERE {_NOT_DERIVED}") + \
            " ORDER BY created, key"
        args: tuple = ()
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            args = (limit, offset)
        with self._db() as db:
            return [_entry(r) for r in db.execute(sql, args).fetchall()]

    def stats(self) -> dict:
        """Goldens and bytes (derived entries' bytes included, their count apart)."""
        with self._db() as db:
            n, size = db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM goldens").fetchone()
            goldens = db.execute(f"SELECT COUNT(*) FROM goldens WHERE {_NOT_DERIVED}").fetchone()[0]
        return {"goldens": goldens, "derived": n - goldens, "bytes": size}

    def verified_path(self, key: str) -> Path | None:
        """The blob of ``key`` after re-hashing it; None when missing. A corrupt blob is
        logged, removed with its entry, and reported as missing."""
        e = self.entry(key)
        if e is None:
            return None
        path = self.blob_path(e.digest)
        if not path.exists():
            log.warning("golden %s: blob %s is missing; it will be recomputed", key[:12],
                        path.name)
            self.remove(key)
            return None
        actual = hash_file(path)
        if actual != e.digest:
            notices.warn(f"golden {key[:12]} ({e.op} {e.case_id}): blob {path.name[:16]} is "
                         f"corrupt (digest {actual[:12]}); removed and recomputed")
            self.remove(key, drop_blob=True)
            return None
        return path

    def get_tensors(self, key: str) -> dict[str, torch.Tensor] | None:
        """The golden of ``key``, or None. Its blob must hash to the digest the index
        holds and must itself name ``key``: an index row pointed at another valid blob
        is caught, dropped and recomputed."""
        path = self.verified_path(key)
        if path is None:
            return None
        out = {}
        with safe_open(str(path), framework="pt") as f:
            bound = (f.metadata() or {}).get("key")
            if bound != key:
                notices.warn(f"golden {key[:12]}: the index points at blob {path.name[:16]}, "
                             f"which was computed for key {str(bound)[:12]}; index row "
                             f"dropped, the golden recomputed")
                with self._db() as db:
                    db.execute("DELETE FROM goldens WHERE key=?", (key,))
                return None
            for name in f.keys():
                out[name] = f.get_tensor(name)
        return out

    def iter_blob(self, key: str) -> tuple[Entry, Iterator[bytes]] | None:
        """Entry and the blob's bytes in chunks (no hash check: the reader checks)."""
        e = self.entry(key)
        if e is None or not self.blob_path(e.digest).exists():
            return None
        path = self.blob_path(e.digest)

        def chunks():
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(READ_CHUNK), b""):
                    yield chunk

        return e, chunks()

    # -- maintenance ----------------------------------------------------------------------
    def remove(self, key: str, drop_blob: bool = False) -> None:
        e = self.entry(key)
        with self._db() as db:
            db.execute("DELETE FROM goldens WHERE key=?", (key,))
        if e is not None and (drop_blob or not self._referenced(e.digest)):
            self.blob_path(e.digest).unlink(missing_ok=True)

    def _referenced(self, digest: str) -> bool:
        with self._db() as db:
            return db.execute("SELECT 1 FROM goldens WHERE digest=? LIMIT 1",
                              (digest,)).fetchone() is not None

    def check(self) -> list[tuple[Entry, str]]:
        """Re-hash every blob; (entry, problem) for each missing or corrupt one, and for an
        index row that points at a valid blob computed for another key."""
        bad = []
        for e in self.entries(derived=True):
            path = self.blob_path(e.digest)
            if not path.exists():
                bad.append((e, "missing blob"))
            elif hash_file(path) != e.digest:
                bad.append((e, "content hash mismatch"))
            else:
                try:
                    bound = blob_metadata(path).get("key")
                except Exception as exc:  # not safetensors at all
                    bad.append((e, f"unreadable blob: {exc}"))
                    continue
                if bound != e.key:
                    bad.append((e, f"the index row points at the blob of another key "
                                   f"({str(bound)[:16]})"))
        return bad

    def gc(self, live_keys: set[str], stale_tmp_s: float = 3600) -> dict:
        """Drop entries no case refers to, blobs no entry refers to, old partial writes."""
        removed = [e for e in self.entries(derived=True) if e.key not in live_keys]
        with self._db() as db:
            for e in removed:
                db.execute("DELETE FROM goldens WHERE key=?", (e.key,))
            kept = {r[0] for r in db.execute("SELECT digest FROM goldens").fetchall()}
        freed = 0
        for blob in (self.root / "blobs").glob("*/*.safetensors"):
            if blob.stem not in kept:
                freed += blob.stat().st_size
                blob.unlink(missing_ok=True)
        now = time.time()
        for part in (self.root / "tmp").glob("*.part"):
            # a partial write whose writer is gone (killed with -9, say) at once; any
            # other once it is old
            if not _writer_alive(part) or now - part.stat().st_mtime > stale_tmp_s:
                freed += part.stat().st_size
                part.unlink(missing_ok=True)
        for lock in (self.root / "locks").glob("*.lock"):
            if lock.stem not in live_keys:
                lock.unlink(missing_ok=True)
        return {"entries_removed": len(removed), "bytes_freed": freed}


def _writer_alive(part: Path) -> bool:
    """Whether the process that writes ``part`` (its pid is in the name) still runs here."""
    try:
        pid = int(part.name.split(".")[1])
    except (IndexError, ValueError):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BlobWriter:
    """Streams bytes into a temp file while hashing; ``commit`` checks the announced hash
    and the safetensors header, then renames the file into place. Leaving the ``with``
    block without a commit removes the temp file."""

    def __init__(self, store: GoldenStore, key: str, max_bytes: int | None):
        self.store, self.key, self.max_bytes = store, key, max_bytes
        self.tmp = store._tmp_path(key)
        self._file = open(self.tmp, "wb")
        self._hash = new_hasher()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.max_bytes is not None and self.size > self.max_bytes:
            raise OverflowError(f"body larger than the limit of {self.max_bytes} bytes")
        self._hash.update(chunk)
        self._file.write(chunk)

    def commit(self, expected_digest: str, expect: dict | None = None,
               check=None) -> Entry:
        """Check the bytes against the announced digest and the blob against its key (the
        key it names must be this one; ``expect``: metadata fields it must carry, e.g. a
        client's own golden version and input fingerprint), then put it in place. The
        index takes the blob's own metadata, never a header's."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        actual = self._hash.hexdigest()
        if actual != expected_digest:
            raise HashMismatch(f"content hash {actual} != announced {expected_digest}")
        meta = bound_metadata(self.tmp, self.key, expect)
        problem = check(meta) if check is not None else ""
        if problem:  # the registry's own record check: refused before it is in place
            raise RecordRejected(problem)
        return self.store._commit(self.key, self.tmp, actual, meta)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "BlobWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.abort()


# a derived entry's meta (json.dumps with sort_keys) holds '"derived": {...}'
_NOT_DERIVED = "meta NOT LIKE '%\"derived\": {%'"


class RecordRejected(ValueError):
    """A blob whose record the registry can see is wrong (another golden version for the
    op, inputs that are not its case's)."""


def blob_metadata(path: Path) -> dict:
    """The string metadata a golden blob carries (key, op, meta: what it was computed
    from)."""
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text or "file is encrypted" in text


def _entry(row) -> Entry:
    key, sha, size, op, case_id, version, created, meta = row
    return Entry(key, sha, size, op, case_id, version, created, json.loads(meta))


class BindingMismatch(HashMismatch):
    """A valid blob that was not computed for this key, or from other code or inputs."""


def bound_metadata(path: Path, key: str, expect: dict | None = None) -> dict:
    """The metadata of the golden blob at ``path``, after checking that it parses as
    safetensors, names ``key``, and carries the ``expect`` fields unchanged."""
    try:
        with safe_open(str(path), framework="pt") as f:
            list(f.keys())
            embedded = dict(f.metadata() or {})
    except Exception as exc:
        raise HashMismatch(f"not a safetensors file: {exc}") from exc
    if embedded.get("key") != key:
        raise BindingMismatch(f"the blob was computed for key {str(embedded.get('key'))[:16]}, "
                              f"not {key[:16]}")
    try:
        meta = json.loads(embedded.get("meta", "{}"))
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise BindingMismatch("the blob carries no readable record of what it was computed from")
    for field, want in (expect or {}).items():
        if meta.get(field) != want:
            raise BindingMismatch(f"{field} of the blob is {meta.get(field)!r}, this client's "
                                  f"is {want!r}")
    return meta
