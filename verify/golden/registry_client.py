"""Client of the golden registry service (``verify serve``), over HTTP with httpx.

Downloads stream into the local store, hash-checked against the service's
``X-Content-BLAKE3``; uploads stream from the local blob with the hash announced up front.
"""
from __future__ import annotations

import json
import os
import ssl

from verify.errors import ConfigError
from verify.golden.store import GoldenStore

REGISTRY_EXTRA = "pip install 'kernel-verify[registry]'"


def _httpx():
    """httpx, installed with the registry extra (it is not imported otherwise: its anyio
    would load a pytest plugin into every pytest run of the environment)."""
    try:
        import httpx
    except ImportError:
        raise ConfigError(f"the golden registry client needs httpx: {REGISTRY_EXTRA}") from None
    return httpx

HASH_HEADER = "X-Content-BLAKE3"
META_HEADER = "X-Golden-Meta"
DISPUTED_HEADER = "X-Golden-Disputed"  # a client's recomputation differed: treat as absent
CHUNK = 1 << 20


class RegistryUnavailable(Exception):
    """The service could not be reached or answered with a server error."""


class RegistryClient:
    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0,
                 read_token: str | None = None):
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("VERIFY_REGISTRY_TOKEN")
        self.read_token = (read_token if read_token is not None
                           else os.environ.get("VERIFY_REGISTRY_READ_TOKEN") or self.token)
        httpx = _httpx()
        self._http_error = httpx.HTTPError
        # https with a private CA: VERIFY_REGISTRY_CA names its certificate (PEM)
        ca = os.environ.get("VERIFY_REGISTRY_CA")
        verify = ssl.create_default_context(cafile=ca) if ca else True
        self._http = httpx.Client(base_url=self.url, timeout=timeout, verify=verify)
        self.disputed_seen: set[str] = set()  # keys the registry served as disputed
        self.audit_mode = False  # an audit fetches disputed goldens too, to judge them

    @staticmethod
    def _auth(token: str | None) -> dict:
        return {"Authorization": f"Bearer {token}"} if token else {}

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw):
        try:
            resp = self._http.request(method, path, **kw)
        except self._http_error as exc:
            raise RegistryUnavailable(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 500:
            raise RegistryUnavailable(f"{self.url}{path}: HTTP {resp.status_code}")
        return resp

    def healthy(self) -> bool:
        try:
            return self._call("GET", "/healthz").status_code == 200
        except RegistryUnavailable:
            return False

    def exists(self, key: str) -> bool:
        return self._call("HEAD", f"/v1/goldens/{key}",
                          headers=self._auth(self.read_token)).status_code == 200

    def keys(self, page: int = 1000) -> list[str]:
        """Every key the service holds (paged through /v1/goldens)."""
        return [item["key"] for item in self.items(page)]

    def fetch(self, key: str, store: GoldenStore, expect: dict | None = None) -> bool:
        """Stream ``key`` into the local store; False when the service does not have it.
        The blob must hash to the announced digest, name ``key`` and carry the ``expect``
        fields (this client's golden version and input fingerprint): else ValueError, and
        nothing is stored."""
        path = f"/v1/goldens/{key}"
        try:
            with self._http.stream("GET", path, headers=self._auth(self.read_token)) as resp:
                if resp.status_code == 404:
                    return False
                if resp.status_code in (401, 403):
                    raise RegistryUnavailable(f"{self.url}{path}: HTTP {resp.status_code} "
                                              f"(set VERIFY_REGISTRY_READ_TOKEN)")
                if resp.status_code != 200:
                    raise RegistryUnavailable(f"{self.url}{path}: HTTP {resp.status_code}")
                if resp.headers.get(DISPUTED_HEADER) and not self.audit_mode:  # absent
                    self.disputed_seen.add(key)
                    return False
                store.put_stream(key, resp.iter_bytes(CHUNK), resp.headers[HASH_HEADER],
                                 expect=expect)
                return True
        except self._http_error as exc:
            raise RegistryUnavailable(f"{self.url}: {type(exc).__name__}: {exc}") from exc

    def dispute(self, key: str, detail: str) -> int:
        """Report that this client's recomputation of ``key`` differs (read token)."""
        resp = self._call("POST", f"/v1/goldens/{key}/dispute", json={"detail": detail},
                          headers=self._auth(self.read_token))
        return resp.status_code

    def resolve(self, key: str, action: str, admin_token: str | None) -> tuple[int, str]:
        """The admin's decision on a disputed key: 'keep' or 'drop'."""
        resp = self._call("POST", f"/v1/goldens/{key}/resolve", params={"action": action},
                          headers=self._auth(admin_token))
        return resp.status_code, resp.text

    def items(self, page: int = 1000) -> list[dict]:
        """Every listed golden with its writer's id and dispute state."""
        out, offset = [], 0
        while True:
            resp = self._call("GET", "/v1/goldens", params={"offset": offset, "limit": page},
                              headers=self._auth(self.read_token))
            if resp.status_code != 200:
                raise RegistryUnavailable(f"{self.url}/v1/goldens: HTTP {resp.status_code}")
            items = resp.json()["items"]
            out += items
            if len(items) < page:
                return out
            offset += page

    def push(self, key: str, store: GoldenStore) -> int:
        """Upload the local blob of ``key``; returns the HTTP status (201, 200, 401, ...)."""
        got = store.iter_blob(key)
        if got is None:
            raise KeyError(key)
        entry, chunks = got
        headers = {HASH_HEADER: entry.digest, META_HEADER: json.dumps(entry.meta),
                   "Content-Length": str(entry.size), **self._auth(self.token)}
        return self._call("PUT", f"/v1/goldens/{key}", content=chunks, headers=headers).status_code
