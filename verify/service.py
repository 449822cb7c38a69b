"""The golden registry as an HTTP service (FastAPI under uvicorn): ``verify serve``.

    GET  /v1/goldens/{key}   the blob, streamed, with X-Content-BLAKE3 and X-Golden-Meta
    HEAD /v1/goldens/{key}   the same headers, no body
    PUT  /v1/goldens/{key}   upload (bearer token); checked against X-Content-BLAKE3
    GET  /v1/goldens         list, paged (?offset=&limit=)
    GET  /v1/stats           counts and bytes stored, requests served
    GET  /healthz            liveness
    GET  /openapi.json       the OpenAPI description (FastAPI), /docs to browse it

Reads are open; writes need ``Authorization: Bearer <token>`` (401 without, 403 wrong or
no token configured). Keys must be 64 hex digits (400 otherwise). Uploads larger than the
set maximum are refused (413). Writes go to a temp file and are renamed into place only
when complete and hash-checked, so a stopped server never leaves a partial golden.
"""
from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time

import anyio
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .registry_client import HASH_HEADER, META_HEADER
from .store import GoldenStore, HashMismatch, new_hasher, valid_key

log = logging.getLogger("verify.service")
DEFAULT_MAX_BODY = 8 << 30  # 8 GiB: a [7168, 24576] AdamW golden is ~4 GiB


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


def create_app(store: GoldenStore, token: str | None = None,
               max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    app = FastAPI(title="kernel-verify golden registry", version="1",
                  description="float64 goldens, content-addressed, computed once and "
                              "fetched by every machine.")
    counters = _Counters()
    started = time.time()

    def bad_key(key: str) -> JSONResponse | None:
        if not valid_key(key):
            return _error(400, "a golden key is 64 lowercase hex digits (sha256)")
        return None

    def auth_error(request: Request) -> JSONResponse | None:
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            return _error(401, "writes need Authorization: Bearer <token>")
        given = header[7:].strip()
        if not token or not hmac.compare_digest(given.encode(), token.encode()):
            return _error(403, "this token may not write to the registry")
        return None

    def headers_for(entry) -> dict:
        return {HASH_HEADER: entry.digest, META_HEADER: json.dumps(entry.meta),
                "Content-Length": str(entry.size), "Content-Type": "application/octet-stream"}

    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}

    @app.get("/v1/stats")
    def stats():
        return {**store.stats(), **counters.values, "uptime_s": round(time.time() - started, 1)}

    @app.get("/v1/goldens")
    def list_goldens(offset: int = Query(0, ge=0), limit: int = Query(100, ge=1, le=1000)):
        total = store.stats()["goldens"]
        items = [e.as_dict() for e in store.entries(offset=offset, limit=limit)]
        return {"total": total, "offset": offset, "limit": limit, "items": items}

    @app.head("/v1/goldens/{key}")
    def head_golden(key: str):
        if (err := bad_key(key)) is not None:
            return err
        entry = store.entry(key)
        if entry is None or not store.blob_path(entry.digest).exists():
            return Response(status_code=404)
        return Response(status_code=200, headers=headers_for(entry))

    @app.get("/v1/goldens/{key}")
    def get_golden(key: str):
        if (err := bad_key(key)) is not None:
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
    async def put_golden(key: str, request: Request):
        if (err := bad_key(key)) is not None:
            return err
        if (err := auth_error(request)) is not None:
            counters.add("rejected_writes")
            return err
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
            meta = json.loads(request.headers.get(META_HEADER, "{}"))
        except ValueError:
            return _error(400, f"{META_HEADER} must be JSON")
        existed = store.entry(key) is not None
        try:
            with store.writer(key, max_bytes=max_body) as w:
                async for chunk in request.stream():
                    await anyio.to_thread.run_sync(w.write, chunk)
                entry = await anyio.to_thread.run_sync(w.commit, announced, meta)
        except OverflowError as exc:
            counters.add("rejected_writes")
            return _error(413, str(exc))
        except HashMismatch as exc:
            counters.add("rejected_writes")
            return _error(400, str(exc))
        counters.add("writes")
        return JSONResponse({"key": key, "digest": entry.digest, "size": entry.size},
                            status_code=200 if existed else 201)

    return app


def serve(store_dir: str, host: str = "127.0.0.1", port: int = 8470, token: str | None = None,
          max_body: int = DEFAULT_MAX_BODY, log_level: str = "info") -> None:
    import uvicorn

    token = token or os.environ.get("VERIFY_REGISTRY_TOKEN") or None
    app = create_app(GoldenStore(store_dir), token=token, max_body=max_body)
    mode = "read-write (bearer token set)" if token else "read-only (no token: writes get 403)"
    print(f"golden registry on http://{host}:{port} serving {store_dir}, {mode}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=30)
