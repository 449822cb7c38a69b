"""Small shared pieces of the harness's own tests."""
import json
import os
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
    return subprocess.run([*VERIFY, *map(str, args)], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
