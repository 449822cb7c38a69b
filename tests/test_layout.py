"""The house by stage (docs/architecture.md): at most 8 modules at the top of verify/,
every import (function-level ones too) points to the same stage or a lower one, no
import circle anywhere, and the old flat paths still import, with a warning."""
import ast
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from helpers import REPO

PKG = REPO / "verify"
RANK = {"errors": 0, "notices": 0, "_moved": 0, "comparator": 1, "specs": 2, "cases": 3,
        "golden": 4, "report": 5, "running": 6, "api": 7, "cli": 7, "": 8}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, modules) -> set[str]:
    """The verify modules ``name`` imports anywhere in its body, resolved to modules."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
        for t in targets:
            while t and t not in modules and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in modules and t not in (name, "verify"):
                found.add(t)
    return found


@pytest.fixture(scope="module")
def graph():
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def _rank(module: str) -> int:
    parts = module.split(".")
    return RANK[parts[1] if len(parts) > 1 else ""]


def test_at_most_eight_modules_sit_at_the_top_of_verify():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 8, top
    for sub in ("comparator", "specs", "cases", "golden", "report", "running"):
        doc = ast.get_docstring(ast.parse((PKG / sub / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"verify/{sub}/__init__.py says what it may import"


def test_every_import_points_to_its_own_stage_or_a_lower_one(graph):
    upward = [(a, b) for a, deps in graph.items() for b in deps if _rank(b) > _rank(a)]
    assert upward == []


def test_no_import_circle_anywhere(graph):
    seen, on_path, circles = set(), [], []

    def visit(m):
        if m in on_path:
            circles.append(on_path[on_path.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        on_path.append(m)
        for d in sorted(graph[m]):
            visit(d)
        on_path.pop()
    for m in sorted(graph):
        visit(m)
    assert circles == []


def test_the_checker_sees_a_circle_and_an_upward_arrow(tmp_path):
    """The two checks above catch what they claim: a planted circle and arrow."""
    modules = {"verify.comparator.a": tmp_path / "a.py", "verify.comparator.b": tmp_path / "b.py",
               "verify.running.r": tmp_path / "r.py"}
    modules["verify.comparator.a"].write_text("def f():\n    from verify.comparator import b\n")
    modules["verify.comparator.b"].write_text("from verify.comparator import a\n"
                                              "from verify.running import r\n")
    modules["verify.running.r"].write_text("")
    g = {m: _imports(m, p, modules) for m, p in modules.items()}
    assert g["verify.comparator.a"] == {"verify.comparator.b"}
    assert "verify.comparator.a" in g["verify.comparator.b"]
    assert [(a, b) for a, deps in g.items() for b in deps if _rank(b) > _rank(a)] == [
        ("verify.comparator.b", "verify.running.r")]


def test_old_import_paths_work_with_a_deprecation_warning():
    code = ("import warnings\nwarnings.simplefilter('error')\n"
            "import verify\n"
            "from verify.specs import registry\n"
            "from verify.comparator import comparison, metrics\n"
            "for old, new in (('verify.registry', registry), ('verify.comparison', comparison),"
            " ('verify.metrics', metrics)):\n"
            "    try:\n"
            "        __import__(old)\n"
            "    except DeprecationWarning as w:\n"
            "        assert new.__name__ in str(w), w\n"
            "    else:\n"
            "        raise SystemExit(old + ' gave no warning')\n"
            "warnings.simplefilter('ignore')\n"
            "import verify.registry as r\n"
            "from verify.metrics import measure_all\n"
            "from verify.cases import Case\n"
            "from verify import results\n"
            "assert r is registry and measure_all is metrics.measure_all\n"
            "assert r.op('softmax').name == 'softmax' and Case.__module__ == 'verify.cases.case'\n"
            "assert results.__name__ == 'verify.report.results'\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_the_public_names_are_unchanged():
    import verify
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in verify.__all__:
            getattr(verify, name)
    assert callable(verify.compare) and callable(verify.run) and callable(verify.ops)
    assert callable(verify.judge) and callable(verify.capture)


def test_two_runs_in_two_threads_each_get_their_own_settings_and_rows(tmp_path):
    """One run context per run (verify/running/context.py): two verify.run calls at once
    in one process, with other stores, ops, timing and time limits, before the op pack
    is loaded, each write their own goldens and rows and keep their own settings."""
    code = '''
import sys, threading
import verify
from verify.golden.store import GoldenStore
results, errors = {}, []
def go(name, ops, store, repeats):
    try:
        results[name] = verify.run(level="L0", ops=ops, backends=["torch"], store=store,
                                   time=repeats, case_timeout=120, reports=False)
    except BaseException as exc:
        errors.append(f"{name}: {type(exc).__name__}: {exc}")
a = threading.Thread(target=go, args=("a", ["lion"], sys.argv[1], 2))
b = threading.Thread(target=go, args=("b", ["softmax"], sys.argv[2], 0))
a.start(); b.start(); a.join(); b.join()
assert not errors, errors
ra, rb = results["a"], results["b"]
assert {r["op"] for r in ra.rows} == {"lion"} and {r["op"] for r in rb.rows} == {"softmax"}
assert all(r["verdict"] == "PASS" for r in ra.rows + rb.rows)
# --time ran for a's kernels only
assert all(r.get("kernel_median_s") for r in ra.rows)
assert not any(r.get("kernel_median_s") for r in rb.rows)
ka = {e.meta["op"] for e in GoldenStore(sys.argv[1]).entries()}
kb = {e.meta["op"] for e in GoldenStore(sys.argv[2]).entries()}
assert ka == {"lion"} and kb == {"softmax"}, (ka, kb)
# a warning raised inside one run is that run's alone
from verify import notices
def warned(name):
    with notices.collecting():
        notices.warn(f"only {name}'s")
        results[name] = notices.drain()
t = [threading.Thread(target=warned, args=(n,)) for n in ("x", "y")]
[x.start() for x in t]; [x.join() for x in t]
assert results["x"] == ["only x's"] and results["y"] == ["only y's"], results
print("ok", len(ra.rows), len(rb.rows))
'''
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "sa"),
                           str(tmp_path / "sb")], capture_output=True, text=True, cwd=REPO,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), \
        proc.stdout[-1000:] + proc.stderr[-3000:]


def test_the_pytest_plugin_keeps_each_runs_books_on_its_own_config(tmp_path):
    """No run's state lives in the plugin module: two pytest runs in one process (-n 0)
    each end with their own rows, plan and report; the module holds no mutable
    containers."""
    from verify.running import pytest_plugin
    mutable = sorted(n for n, v in vars(pytest_plugin).items()
                     if isinstance(v, (list, dict, set)) and not n.startswith("__"))
    assert mutable == [], mutable
    code = '''
import json, sys, pytest
from pathlib import Path
rep, store = sys.argv[1], sys.argv[2]
common = ["-p", "verify", "-q", "-n", "0", "--cases-only", "--level", "L0",
          "--backend", "torch", "--reports", rep, "--store", store, "-p", "no:cacheprovider"]
first = pytest.main(common + ["--op", "lion", "--run-id", "a"])
second = pytest.main(common + ["--op", "softmax", "--run-id", "b"])
ops = {}
for rid in ("a", "b"):
    rows = json.loads((Path(rep) / rid / "results.json").read_text())["rows"]
    ops[rid] = sorted({r["op"] for r in rows}), len(rows), sorted({r["verdict"] for r in rows})
print("ok", int(first), int(second), json.dumps(ops))
'''
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r"),
                           str(tmp_path / "s")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("ok 0 0 "), proc.stdout[-2000:]
    ops = json.loads(last.split(" ", 3)[3])
    assert ops["a"][0] == ["lion"] and ops["b"][0] == ["softmax"], ops
    assert ops["a"][2] == ["PASS"] and ops["b"][2] == ["PASS"], ops
