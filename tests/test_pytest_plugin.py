"""Case items under pytest and pytest-xdist: readable ids, -k selection, one merged report."""
import json
import os
import subprocess
import sys

import verify

from helpers import REPO


def pytest_run(*args, cwd=REPO, plugin=True, own_tests=False):
    """pytest in a subprocess, the harness's plugin switched on with -p verify (a path
    given as an option value, --reports /tmp/x, can make pytest choose another rootdir,
    where this repo's conftest.py is not read)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    early = ["-p", "verify"] if plugin else []
    if plugin and not own_tests:  # this repo's own tests are the harness's: not here
        early.append("--cases-only")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *early,
                           *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_xdist_workers_merge_into_one_report(tmp_path):
    out = pytest_run("--level", "L0", "--op", "lion", "-n", "2", "-v", "--reports", tmp_path,
                     "--run-id", "x")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "lion[L0-small-bf16-8x8-torch]" in out.stdout
    doc = json.loads((tmp_path / "x" / "results.json").read_text())
    rows = doc["rows"]
    expected = verify.run(level="L0", ops=["lion"], reports=False).rows
    assert len(rows) == len(expected)
    assert sorted((r["case_id"], r["output"]) for r in rows) == \
        sorted((r["case_id"], r["output"]) for r in expected)
    assert {r["worker"] for r in rows} == {"gw0", "gw1"}
    assert "precision summary" in out.stdout


def test_keyword_selection_by_op_alias(tmp_path):
    out = pytest_run("--level", "L0", "-k", "adamw and bf16", "--collect-only", "-q")
    assert out.returncode == 0, out.stdout + out.stderr
    items = [ln for ln in out.stdout.splitlines() if "::" in ln]
    assert items and all("apply_adam_w_v2[" in ln and "bf16" in ln for ln in items)


def test_a_failing_item_fails_pytest_with_the_reason(tmp_path):
    mod = tmp_path / "bad_lion.py"
    mod.write_text(
        "import verify, torch\n"
        "@verify.kernel('lion', backend='bad')\n"
        "def lion(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):\n"
        "    w = weight.float() - lr * torch.sign(grad.float())\n"
        "    return w.to(weight.dtype), beta2 * exp_avg + (1 - beta2) * grad.float()\n")
    out = pytest_run("--level", "L0", "--kernels", str(mod), "--backend", "bad",
                     "--reports", tmp_path, "-k", "small")
    assert out.returncode == 1
    summary = out.stdout.split("precision summary")[1]
    assert "rows that did not pass" in summary and "w_new" in summary and "FAIL" in summary
    # the worst elements appear once, in the summary, not again in pytest's failure section
    assert "index | weight | grad | exp_avg | golden | actual" in summary
    assert " FAILURES " not in out.stdout and "short test summary" not in out.stdout


def test_the_plugin_is_switched_on_explicitly(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    off = pytest_run("--level", "L0", "-q", "-p", "no:xdist", cwd=tmp_path, plugin=False)
    assert off.returncode == 4 and "--level" in off.stderr  # unknown option: not loaded
    on = pytest_run("--level", "L0", "--op", "lion", "-k", "small and fp32",
                    "--reports", tmp_path, "-q", cwd=tmp_path)
    assert on.returncode == 0 and "verdicts per op and kernel" in on.stdout, \
        on.stdout[-2000:] + on.stderr[-2000:]


def test_plain_test_runs_are_untouched():
    out = pytest_run("--collect-only", "-q", "tests/test_inputs.py")
    assert out.returncode == 0 and "test_inputs.py::" in out.stdout


def test_this_repos_conftest_switches_the_plugin_on():
    out = pytest_run("--level=L0", "--op=lion", "-k", "small and fp32", "--collect-only", "-q",
                     plugin=False)
    assert out.returncode == 0 and "lion[L0-small-fp32-8x8-torch]" in out.stdout, \
        out.stdout[-2000:] + out.stderr[-2000:]


OWN_TEST = '''
def test_my_helper():
    assert 1 + 1 == 2

def test_my_broken_helper():
    assert 1 + 1 == 3
'''


def test_the_projects_own_tests_run_beside_the_case_items(tmp_path):
    """pytest -p verify --level keeps the project's tests (named or found), -k reaches
    them, and their failures count in the exit status."""
    (tmp_path / "test_mine.py").write_text(OWN_TEST)
    out = pytest_run("--level", "L0", "--op", "lion", "-k", "small and fp32 or my_helper",
                     "-n", "0", "--reports", tmp_path / "r", "-q", str(tmp_path / "test_mine.py"),
                     cwd=tmp_path, own_tests=True)
    passed = int(out.stdout.rsplit(" passed", 1)[0].split()[-1])
    assert passed > 1  # the project's test and the case items ran
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    broken = pytest_run("--level", "L0", "--op", "lion", "-k", "small and fp32 or broken",
                        "-n", "0", "--reports", tmp_path / "r2", "-q", cwd=tmp_path,
                        own_tests=True)
    assert broken.returncode == 1, broken.stdout[-2000:]
    assert "test_my_broken_helper" in broken.stdout and "precision summary" in broken.stdout
    only = pytest_run("--level", "L0", "--op", "lion", "-k", "my_helper", "-n", "0", "-q",
                      "--reports", tmp_path / "r3", cwd=tmp_path, own_tests=True)
    assert only.returncode == 0 and "1 passed" in only.stdout, only.stdout[-2000:]
