"""Small shared pieces of the harness's own tests."""
import json
import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VERIFY = [sys.executable, "-m", "verify.cli"]


def write_cases(folder: Path, doc: dict, name: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name or doc.get('op', 'case')}.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def run_cli(*args, cwd=None, env=None, timeout=600):
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("COLUMNS", "200")
    return subprocess.run([*VERIFY, *map(str, args)], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """``verify serve`` as a real process on a loopback port."""

    def __init__(self, store_dir, token="t0ken", max_body_mb=1, read_token=None,
                 admin_token=None, tls=None):
        """Tokens travel in the environment (never the command line); ``tls``: (cert, key)
        PEM files to serve HTTPS with."""
        import time

        import httpx
        self.port = free_port()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.store_dir = store_dir
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for name, value in (("VERIFY_REGISTRY_TOKEN", token),
                            ("VERIFY_REGISTRY_READ_TOKEN", read_token),
                            ("VERIFY_REGISTRY_ADMIN_TOKEN", admin_token)):
            env.pop(name, None)
            if value:
                env[name] = value
        args = [*VERIFY, "serve", "--store", str(store_dir), "--port", str(self.port),
                "--max-body-mb", str(max_body_mb)]
        if tls:
            args += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1,
                             verify=ssl.create_default_context(cafile=str(tls[0])) if tls else True).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("verify serve did not come up")

    def stop(self, sig=None):
        import signal
        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.stdout.read() if self.proc.stdout else ""


def golden_blob(value: float, key: str) -> bytes:
    """A golden blob as the store writes one: it names its key and what it was computed
    from in its own metadata."""
    import torch
    from safetensors.torch import save
    meta = {"op": "t", "golden_version": "v1", "inputs_sha": "i1"}
    return save({"0/out": torch.full((4, 4), value, dtype=torch.float64)},
                metadata={"key": key, "op": "t", "meta": json.dumps(meta)})


def put_golden(url, key, data, token, meta='{"op": "t"}', announced=None, params=None):
    """PUT ``data`` as the golden ``key`` (the BLAKE3 digest announced unless given)."""
    import httpx

    from verify.golden.store import hash_bytes
    headers = {"X-Content-BLAKE3": announced or hash_bytes(data), "X-Golden-Meta": meta}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.put(f"{url}/v1/goldens/{key}", content=data, headers=headers, timeout=30,
                     params=params)


MSPROBE = "mindstudio-probe==26.2.0"
VENV = Path(os.environ.get("VERIFY_MSPROBE_VENV",
                           Path.home() / ".cache" / "kernel-verify-tests" / "msprobe-26.2.0"))

def msprobe_python() -> Path:
    """The python of a venv with torch 2.13.0 (CPU) and mindstudio-probe 26.2.0, built
    once under the user's cache folder; SKIP where it cannot be built (no index). Built
    under a file lock and marked complete only when both installs are done: pytest-xdist's
    workers ask at once, and one that took a half-built venv (its python there, msprobe
    not yet) failed with `No module named 'msprobe'`."""
    import pytest
    from filelock import FileLock
    python = VENV / "bin" / "python"
    done = VENV / ".complete"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(VENV) + ".lock", timeout=2400):
        if done.exists():
            return python
        if python.exists() and subprocess.run(  # built before there were marks
                [str(python), "-c", "import msprobe, numpy, torch"], capture_output=True,
                timeout=600).returncode == 0:
            done.write_text(MSPROBE + "\n")
            return python
        shutil.rmtree(VENV, ignore_errors=True)  # a build cut short: start again
        try:
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
            for spec in ("torch==2.13.0", MSPROBE):  # torch first: the CPU build, as pinned
                subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", spec],
                               check=True, timeout=1200, capture_output=True)
        except (subprocess.SubprocessError, OSError) as exc:
            shutil.rmtree(VENV, ignore_errors=True)
            pytest.skip(f"cannot build a venv with {MSPROBE}: {exc}")
        done.write_text(MSPROBE + "\n")
    return python
