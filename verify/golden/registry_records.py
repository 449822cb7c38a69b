"""What the golden registry knows of each key beyond its bytes: who wrote it (a token id,
never the token), whether a client disputed it, and whether a blob's record is one the
registry can see is wrong before it takes it.

A write token holder can upload a wrong golden with a record that looks right (the case,
the golden version and the inputs' fingerprint are all computable from the public case
file). Clients therefore recompute a sample of what they fetch and dispute a key that
differs; a disputed key is served with ``X-Golden-Disputed``, which every client treats as
absent, until an admin resolves it. Records are a table beside the store's index, in the
same SQLite file.
"""
from __future__ import annotations

import hashlib
import json
import math
import time

from verify.golden.store import GoldenStore

DISPUTED_HEADER = "X-Golden-Disputed"
WRITER_ID_CHARS = 16
MAX_CHECKED_ELEMENTS = 1 << 26  # inputs the registry regenerates to check a record's fingerprint


def token_id(token: str | None) -> str:
    """A writer's id: a hash prefix of its token (the token itself is never stored)."""
    if not token:
        return "anonymous"
    return hashlib.sha256(token.encode()).hexdigest()[:WRITER_ID_CHARS]


class Records:
    def __init__(self, store: GoldenStore):
        self.store = store
        with store._db() as db:
            db.execute("""CREATE TABLE IF NOT EXISTS registry_records (
                key TEXT PRIMARY KEY, writer TEXT, written REAL, disputed REAL,
                disputed_by TEXT, detail TEXT)""")
            db.execute("CREATE INDEX IF NOT EXISTS records_writer ON registry_records(writer)")

    def wrote(self, key: str, writer: str) -> None:
        with self.store._db() as db:
            db.execute("INSERT OR REPLACE INTO registry_records (key, writer, written) "
                       "VALUES (?, ?, ?)", (key, writer, time.time()))

    def of(self, key: str) -> dict:
        with self.store._db() as db:
            row = db.execute("SELECT writer, written, disputed, disputed_by, detail FROM "
                             "registry_records WHERE key=?", (key,)).fetchone()
        if row is None:
            return {}
        writer, written, disputed, by, detail = row
        return {"writer": writer, "written": written, "disputed": disputed,
                "disputed_by": by, "detail": detail}

    def all(self) -> dict[str, dict]:
        with self.store._db() as db:
            rows = db.execute("SELECT key, writer, disputed, detail FROM registry_records"
                              ).fetchall()
        return {k: {"writer": w, "disputed": d, "detail": t} for k, w, d, t in rows}

    def dispute(self, key: str, by: str, detail: str) -> None:
        with self.store._db() as db:
            db.execute("INSERT OR IGNORE INTO registry_records (key) VALUES (?)", (key,))
            db.execute("UPDATE registry_records SET disputed=?, disputed_by=?, detail=? "
                       "WHERE key=?", (time.time(), by, detail[:2000], key))

    def resolve(self, key: str) -> None:
        with self.store._db() as db:
            db.execute("UPDATE registry_records SET disputed=NULL, disputed_by=NULL, "
                       "detail=NULL WHERE key=?", (key,))

    def forget(self, key: str) -> None:
        with self.store._db() as db:
            db.execute("DELETE FROM registry_records WHERE key=?", (key,))


def record_problem(key: str, meta: dict) -> str:
    """Why the registry refuses a blob's record ('' when it takes it): for an op declared
    here, the key must be the one the case record gives under the op's current golden
    version (a floors entry's: that of its golden's floor figures), and the record's inputs fingerprint the one its case's inputs give (checked
    when the inputs are small enough to regenerate). An op this registry does not know is
    taken as it is: only clients can check it."""
    from verify.golden import audit
    from verify.specs import registry
    from verify.specs import inputs as inp
    from verify.golden import floors
    derived = meta.get("derived")
    if derived and (not isinstance(derived, dict) or derived.get("kind") != floors.KIND):
        return ("derived entries other than a golden's floor figures (a compute-precision "
                "floor's trajectory) are not shared through the registry")
    if derived and not isinstance(meta.get("figures"), dict):
        return "a floors entry must carry its figures (meta 'figures', an object)"
    try:
        spec = registry.op(meta.get("op", ""))
    except Exception:
        return ""
    try:
        case = audit.case_from_meta(meta)
    except (KeyError, TypeError, ValueError) as exc:
        return f"no usable record of its case: {exc}"
    want = case.golden_key(spec.golden_version)
    if derived:  # the floors of the case's golden, under the key they are kept by
        if derived.get("of") != want or floors.store_key(want) != key:
            return (f"the record does not give this key as the floor figures of its case's "
                    f"golden under op '{spec.name}''s current golden version "
                    f"{spec.golden_version}")
    elif want != key:
        return (f"the record does not give this key under op '{spec.name}''s current golden "
                f"version {spec.golden_version} (another version, or another case)")
    sha = meta.get("inputs_sha")
    size = sum(max(1, math.prod(s)) for s in case.input_shapes.values())
    if sha and size <= MAX_CHECKED_ELEMENTS:
        got = inp.fingerprint(inp.make_inputs(case))
        if got != sha:
            return f"its inputs fingerprint {sha} is not its case's ({got})"
    return ""


def listing(entry_dict: dict, record: dict) -> dict:
    """A /v1/goldens item: the entry, its writer's id and any dispute."""
    return {**entry_dict, "writer": record.get("writer"),
            "disputed": bool(record.get("disputed")),
            **({"dispute": record.get("detail")} if record.get("disputed") else {})}


def disputed_header(record: dict) -> dict:
    if not record.get("disputed"):
        return {}
    return {DISPUTED_HEADER: json.dumps({"since": record["disputed"],
                                         "detail": (record.get("detail") or "")[:500]})}
