"""Every run ends when it is told to, and with its report: SIGTERM and SIGKILL leave no
process behind, a case stuck past its limit under -n 0 ends the run with its rows written,
a bad -k is a usage error before any folder exists."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import REPO

SLEEPY = '''
import pathlib, signal, time, verify

CALLS = []

@verify.kernel("lion", backend="sleepy")
def lion(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    """The first call returns; the next never does, not even to SIGALRM."""
    CALLS.append(1)
    if len(CALLS) > 1:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        pathlib.Path("sleeping").write_text("")
        time.sleep(1000)
    return weight * (1 - lr * weight_decay), exp_avg
'''


def _processes_with(token: str) -> list[int]:
    """Pids whose environment carries ``token``: the run's processes and all they started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if token.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _start(tmp_path, *args, plugin=False):
    token = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), "VERIFY_TEST_RUN": token}
    (tmp_path / "k.py").write_text(SLEEPY)
    if plugin:
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "verify",
               "--cases-only", "--kernels", "k.py", *args]
    else:
        cmd = [sys.executable, "-m", "verify.cli", "run", "--kernels", "k.py", *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, token


def _wait_for_workers(tmp_path, seconds=120.0):
    """Until the kernel is in its endless sleep (it says so with a file)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if (tmp_path / "sleeping").exists():
            time.sleep(0.5)
            return
        time.sleep(0.2)
    raise AssertionError("the run's kernel did not start")


def _gone(token, seconds=15.0) -> list[int]:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        left = _processes_with(token)
        if not left:
            return []
        time.sleep(0.2)
    left = _processes_with(token)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


SELECTION = ("--level", "L0", "--op", "lion", "--dtype", "fp32", "--backend", "sleepy")


@pytest.mark.parametrize("plugin", [False, True], ids=["verify-run", "pytest-plugin"])
def test_sigterm_ends_every_process_and_writes_the_rows_so_far(tmp_path, plugin):
    proc, token = _start(tmp_path, *SELECTION, "--reports", "rep", "--run-id", "t",
                         plugin=plugin)
    _wait_for_workers(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert _gone(token) == [], "processes of the run outlived it"
    assert time.monotonic() - t0 < 20
    assert proc.returncode == 2, proc.stdout.read()[-2000:] + proc.stderr.read()[-2000:]
    doc = json.loads((tmp_path / "rep" / "t" / "results.json").read_text())
    assert "interrupted (SIGTERM)" in doc["meta"]["interrupted"]
    assert any(r["verdict"] in ("PASS", "FAIL") for r in doc["rows"])   # the first case ran
    assert any("not run" in r["reason"] or "no result" in r["reason"] for r in doc["rows"]
               if r["verdict"] == "ERROR")


def test_sigkill_of_the_parent_leaves_no_process(tmp_path):
    proc, token = _start(tmp_path, *SELECTION, "--reports", "rep")
    _wait_for_workers(tmp_path)   # the guard, the run and its worker are up
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _gone(token) == [], "the run's children outlived a SIGKILL of its parent"


def test_a_stuck_case_under_n0_ends_the_run_with_its_report(tmp_path):
    proc, token = _start(tmp_path, *SELECTION, "-n", "0", "--case-timeout", "2",
                         "--reports", "rep", "--run-id", "s")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    assert "never returned to Python" in err
    doc = json.loads((tmp_path / "rep" / "s" / "results.json").read_text())
    stuck = [r for r in doc["rows"] if "never returned to Python" in (r["reason"] or "")]
    assert len(stuck) == 1 and stuck[0]["verdict"] == "ERROR"
    assert any(r["verdict"] in ("PASS", "FAIL") for r in doc["rows"])
    assert "stuck" in doc["meta"]["interrupted"]
    assert _gone(token) == []


def test_a_bad_keyword_is_a_usage_error_without_a_report_folder(tmp_path):
    proc, token = _start(tmp_path, "--level", "L0", "--op", "lion", "-k", "(((",
                         "--reports", "rep")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "-k" in err and "INTERNALERROR" not in out + err, err
    assert not (tmp_path / "rep").exists()
    proc, token = _start(tmp_path, "--level", "L0", "--op", "lion", "-k", "(((",
                         "--reports", "rep2", plugin=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4 and "INTERNALERROR" not in out + err, out + err
    assert not (tmp_path / "rep2").exists()


SPAWNS = '''
import subprocess, sys, verify

@verify.kernel("lion", backend="spawner")
def lion(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    """Leaves a grandchild behind: a shell that starts a long sleep and exits."""
    subprocess.Popen(["sh", "-c", "sleep 600 &"])
    return weight, exp_avg
'''


def test_processes_a_kernel_starts_do_not_outlive_the_run(tmp_path):
    token = uuid.uuid4().hex
    (tmp_path / "k.py").write_text(SPAWNS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "VERIFY_TEST_RUN": token}
    out = subprocess.run([sys.executable, "-m", "verify.cli", "run", "--kernels", "k.py",
                          "--level", "L0", "--op", "lion", "--dtype", "fp32", "--backend",
                          "spawner", "--reports", "rep"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout[-1500:] + out.stderr[-1500:]   # FAIL rows
    assert _gone(token, seconds=5) == [], "a kernel's child process outlived the run"


def test_a_case_keeps_the_callers_alarm():
    """verify.running.runner.run_case puts an embedding program's own signal.alarm back."""
    from verify.running import deadline
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.5)
        with deadline.time_limit(5):
            time.sleep(0.2)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.8 < left < 1.4
        time.sleep(1.6)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
