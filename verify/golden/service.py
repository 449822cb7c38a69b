"""The golden registry as an HTTP service (FastAPI under uvicorn): ``verify serve``.

    GET  /v1/goldens/{key}   the blob, streamed, with X-Content-BLAKE3 and X-Golden-Meta
    HEAD /v1/goldens/{key}   the same headers, no body
    PUT  /v1/goldens/{key}   upload (write token); checked against X-Content-BLAKE3
    GET  /v1/goldens         list, paged (?offset=&limit=)
    POST /v1/goldens/{key}/dispute   a client's recomputation differs (read token)
    POST /v1/goldens/{key}/resolve   ?action=keep|drop: an admin ends a dispute
    GET  /v1/stats           counts and bytes stored, requests served
    GET  /healthz            liveness (always open)
    GET  /openapi.json       the OpenAPI description (FastAPI), /docs to browse it

Tokens (``Authorization: Bearer <token>``), each from the environment or a file, never
the command line: a write token may upload; a read token, when one is set, is needed to
read (the write and admin tokens read too); the admin token may replace a golden.

Keys are write-once: a PUT of the same bytes to an existing key is 200, of other bytes
409, unless the admin token asks for ``?replace=true``. A blob must name the key it is
put under (goldens carry their key and what they were computed from in their own
metadata, which the index takes, never a header's). Keys are exactly 64 hex digits (400
otherwise); bad metadata is 400 before anything is stored; uploads over the maximum are
413; a client that sends its headers or body too slowly is cut off. Writes go to a temp
file, renamed into place only when complete and checked, so a stopped server never
leaves a partial golden. With ``--tls-cert`` and ``--tls-key`` the service speaks HTTPS.

Each key records the id of the token that wrote it (verify/registry_records.py); a blob
whose record this registry can see is wrong (another golden version for a built-in op,
inputs that are not its case's) is refused at PUT (400), so it never blocks an honest
writer's key; a disputed key is served with ``X-Golden-Disputed``, which clients treat
as absent, until the admin resolves it (keep it, or drop it so it can be written again).
"""
from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time

from dataclasses import dataclass
from pathlib import Path

import anyio
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from verify.golden import registry_records as rr
from verify.golden.registry_client import HASH_HEADER, META_HEADER
from verify.golden.store import GoldenStore, HashMismatch, RecordRejected, new_hasher, valid_key

log = logging.getLogger("verify.service")
DEFAULT_MAX_BODY = 8 << 30  # 8 GiB: a [7168, 24576] AdamW golden is ~4 GiB
HEADER_TIMEOUT_S = 10.0     # to send a request's headers
BODY_TIMEOUT_S = 30.0       # between two chunks of an upload
UPLOAD_MIN_RATE = 1 << 20   # bytes/s an upload must average (after a minute's allowance):
UPLOAD_GRACE_S = 60.0       # a client at 1 byte/s is cut off, not served for ever


class _Counters:
    def __init__(self):
        self._lock = threading.Lock()
        self.values = {"reads": 0, "read_bytes": 0, "writes": 0, "rejected_writes": 0,
                       "not_found": 0, "corrupt_reads": 0}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.values[name] += n


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


@dataclass(frozen=True)
class Tokens:
    write: str | None = None
    read: str | None = None   # None: reads are open
    admin: str | None = None  # None: no golden can be replaced


def create_app(store: GoldenStore, token: str | None = None,
               max_body: int = DEFAULT_MAX_BODY, tokens: Tokens | None = None,
               body_timeout: float = BODY_TIMEOUT_S) -> FastAPI:
    """The service over ``store``; ``token`` is the write token (or give ``tokens``)."""
    tokens = tokens or Tokens(write=token)
    app = FastAPI(title="kernel-verify golden registry", version="1",
                  description="float64 goldens, content-addressed, computed once and "
                              "fetched by every machine.")
    counters = _Counters()
    started = time.time()
    records = rr.Records(store)
    from verify.specs import registry as op_registry
    op_registry.load_builtin()  # the ops whose records this registry can check

    def bad_key(key: str) -> JSONResponse | None:
        if not valid_key(key):
            return _error(400, "a golden key is 64 lowercase hex digits (sha256)")
        return None

    def bearer(request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        return header[7:].strip() if header.lower().startswith("bearer ") else None

    def holds(given: str | None, *allowed: str | None) -> bool:
        return given is not None and any(
            t and hmac.compare_digest(given.encode(), t.encode()) for t in allowed)

    def auth_error(request: Request) -> JSONResponse | None:
        given = bearer(request)
        if given is None:
            return _error(401, "writes need Authorization: Bearer <write token>")
        if not holds(given, tokens.write, tokens.admin):
            return _error(403, "this token may not write to the registry")
        return None

    def read_error(request: Request) -> JSONResponse | None:
        if not tokens.read:
            return None
        given = bearer(request)
        if given is None:
            return _error(401, "reads need Authorization: Bearer <read token>")
        if not holds(given, tokens.read, tokens.write, tokens.admin):
            return _error(403, "this token may not read from the registry")
        return None

    def headers_for(entry) -> dict:
        return {HASH_HEADER: entry.digest, META_HEADER: json.dumps(entry.meta),
                "Content-Length": str(entry.size), "Content-Type": "application/octet-stream",
                **rr.disputed_header(records.of(entry.key))}

    def admin_error(request: Request) -> JSONResponse | None:
        given = bearer(request)
        if given is None:
            return _error(401, "this needs Authorization: Bearer <admin token>")
        if not holds(given, tokens.admin):
            return _error(403, "only the admin token may do this")
        return None

    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}

    @app.get("/v1/stats")
    def stats(request: Request):
        if (err := read_error(request)) is not None:
            return err
        return {**store.stats(), **counters.values, "uptime_s": round(time.time() - started, 1)}

    @app.get("/v1/goldens")
    def list_goldens(request: Request, offset: int = Query(0, ge=0),
                     limit: int = Query(100, ge=1, le=1000)):
        if (err := read_error(request)) is not None:
            return err
        total = store.stats()["goldens"]
        known = records.all()
        items = [rr.listing(e.as_dict(), known.get(e.key, {}))
                 for e in store.entries(offset=offset, limit=limit)]
        return {"total": total, "offset": offset, "limit": limit, "items": items}

    @app.post("/v1/goldens/{key}/dispute")
    async def dispute(key: str, request: Request):
        """A client recomputed this golden and got other values: every client treats it
        as absent from now on, until the admin resolves it."""
        if (err := bad_key(key) or read_error(request)) is not None:
            return err
        if store.entry(key) is None:
            return _error(404, "no such golden")
        try:
            body = json.loads((await request.body())[:8192] or b"{}")
        except ValueError:
            body = {}
        detail = str(body.get("detail", "")) if isinstance(body, dict) else ""
        records.dispute(key, rr.token_id(bearer(request)), detail or "no detail given")
        log.warning("golden %s disputed: %s", key[:12], detail[:200])
        return {"key": key, "disputed": True}

    @app.post("/v1/goldens/{key}/resolve")
    def resolve(key: str, request: Request, action: str = Query("keep")):
        """The admin's decision on a disputed key: keep it (the client was wrong), or
        drop it (its bytes go; an honest writer may put the key again)."""
        if (err := bad_key(key) or admin_error(request)) is not None:
            return err
        if action not in ("keep", "drop"):
            return _error(400, "action is keep or drop")
        if store.entry(key) is None:
            return _error(404, "no such golden")
        if action == "drop":
            store.remove(key, drop_blob=True)
            records.forget(key)
        else:
            records.resolve(key)
        return {"key": key, "action": action}

    @app.head("/v1/goldens/{key}")
    def head_golden(key: str, request: Request):
        if (err := bad_key(key) or read_error(request)) is not None:
            return err
        entry = store.entry(key)
        if entry is None or not store.blob_path(entry.digest).exists():
            return Response(status_code=404)
        return Response(status_code=200, headers=headers_for(entry))

    @app.get("/v1/goldens/{key}")
    def get_golden(key: str, request: Request):
        if (err := bad_key(key) or read_error(request)) is not None:
            return err
        got = store.iter_blob(key)
        if got is None:
            counters.add("not_found")
            return _error(404, "no such golden")
        entry, chunks = got

        def checked():
            # hashed on the way out: a blob found corrupt is dropped from the store (the
            # client, which checks the same hash, discards what it received)
            h = new_hasher()
            for chunk in chunks:
                h.update(chunk)
                yield chunk
            counters.add("reads")
            counters.add("read_bytes", entry.size)
            if h.hexdigest() != entry.digest:
                counters.add("corrupt_reads")
                log.warning("golden %s: stored blob is corrupt; removed", key[:12])
                store.remove(key, drop_blob=True)

        return StreamingResponse(checked(), headers=headers_for(entry),
                                 media_type="application/octet-stream")

    @app.put("/v1/goldens/{key}")
    async def put_golden(key: str, request: Request, replace: bool = False):
        if (err := bad_key(key)) is not None:
            return err
        if (err := auth_error(request)) is not None:
            counters.add("rejected_writes")
            return err
        if replace and not holds(bearer(request), tokens.admin):
            counters.add("rejected_writes")
            return _error(403, "replacing a golden needs the admin token")
        announced = request.headers.get(HASH_HEADER, "").lower()
        if not valid_key(announced):
            return _error(400, f"{HASH_HEADER} must carry the body's BLAKE3 digest (64 hex)")
        length = request.headers.get("content-length")
        if length is not None and not length.isdigit():
            return _error(400, "Content-Length must be a number")
        if length is not None and int(length) > max_body:
            counters.add("rejected_writes")
            return _error(413, f"body of {length} bytes is over the limit of {max_body}")
        try:
            header_meta = json.loads(request.headers.get(META_HEADER, "{}"))
        except ValueError:
            header_meta = None
        if not isinstance(header_meta, dict):
            return _error(400, f"{META_HEADER} must be a JSON object")
        existing = store.entry(key)
        if existing is not None and existing.digest != announced and not replace:
            counters.add("rejected_writes")
            return _error(409, f"golden {key[:16]} exists with other content (digest "
                               f"{existing.digest[:16]}); goldens are write-once (the admin "
                               f"token may replace one with ?replace=true)")
        total_deadline = time.monotonic() + UPLOAD_GRACE_S + int(length or 0) / UPLOAD_MIN_RATE
        try:
            with store.writer(key, max_bytes=max_body) as w:
                stream = request.stream().__aiter__()
                while True:
                    left = total_deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError("upload too slow")
                    with anyio.fail_after(min(body_timeout, left)):
                        try:
                            chunk = await stream.__anext__()
                        except StopAsyncIteration:
                            break
                    await anyio.to_thread.run_sync(w.write, chunk)
                entry = await anyio.to_thread.run_sync(
                    lambda: w.commit(announced, check=lambda meta: rr.record_problem(key, meta)))
        except TimeoutError:
            counters.add("rejected_writes")
            return _error(408, f"no body bytes for {body_timeout:g} s, or the upload averaged "
                               f"under {UPLOAD_MIN_RATE} bytes/s past a {UPLOAD_GRACE_S:g} s "
                               f"allowance")
        except OverflowError as exc:
            counters.add("rejected_writes")
            return _error(413, str(exc))
        except (HashMismatch, RecordRejected) as exc:
            counters.add("rejected_writes")
            return _error(400, str(exc))
        counters.add("writes")
        if existing is None or replace:
            records.wrote(key, rr.token_id(bearer(request)))
        return JSONResponse({"key": key, "digest": entry.digest, "size": entry.size},
                            status_code=200 if existing is not None else 201)

    return app


def read_token(env: str, file: str | None, what: str) -> str | None:
    """A token from its file (first line) or, without one, the environment."""
    if file:
        from verify.errors import ConfigError
        try:
            text = Path(file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{what} token file {file}: {exc}") from None
        if not text:
            raise ConfigError(f"{what} token file {file} is empty")
        return text
    return os.environ.get(env) or None


class _TimedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on request headers: a client that
    connects and sends its headers slowly (or never) is disconnected after
    HEADER_TIMEOUT_S, where uvicorn alone would wait forever."""

    def connection_made(self, transport):
        super().connection_made(transport)
        self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        self._header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def _headers_late(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._header_deadline.cancel()  # headers complete: the body has its own limit

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._header_deadline.cancel()
        if not self.transport.is_closing():
            self._arm_header_deadline()  # the next request on this connection

    def connection_lost(self, exc):
        self._header_deadline.cancel()
        super().connection_lost(exc)


def serve(store_dir: str, host: str = "127.0.0.1", port: int = 8470,
          max_body: int = DEFAULT_MAX_BODY, log_level: str = "info",
          tokens: Tokens | None = None, tls_cert: str | None = None,
          tls_key: str | None = None) -> None:
    import uvicorn

    tokens = tokens or Tokens(write=os.environ.get("VERIFY_REGISTRY_TOKEN") or None)
    app = create_app(GoldenStore(store_dir), max_body=max_body, tokens=tokens)
    mode = ("read-write (write token set)" if tokens.write
            else "read-only (no write token: writes get 403)")
    if tokens.read:
        mode += ", reads need a token"
    scheme = "https" if tls_cert else "http"
    print(f"golden registry on {scheme}://{host}:{port} serving {store_dir}, {mode}",
          flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, http=_TimedH11,
                timeout_keep_alive=5, timeout_graceful_shutdown=30,
                ssl_certfile=tls_cert, ssl_keyfile=tls_key)
