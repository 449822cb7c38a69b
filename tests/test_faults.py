"""Faults become rows, never a green run: a kernel that exits, a worker that dies, a
kernel module that exits at import."""
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

from helpers import REPO, run_cli

EXITING = '''
import os
import sys
import torch
import verify


@verify.kernel("lion", backend="faulty")
def exits(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    sys.exit(0)


@verify.kernel("lion", backend="dies")
def dies(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    if weight.shape == (8, 8) and weight.dtype == torch.float32:
        os._exit(1)                       # takes its process down, as a segfault would
    return weight, exp_avg.float()
'''


def test_a_kernel_that_calls_sys_exit_is_an_error_row(tmp_path):
    (tmp_path / "k.py").write_text(EXITING)
    out = run_cli("run", "--level", "L0", "--op", "lion", "--kernels", tmp_path / "k.py",
                  "--backend", "faulty", "--reports", tmp_path, "--run-id", "x")
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    rows = json.loads((tmp_path / "x" / "results.json").read_text())["rows"]
    assert rows and all(r["verdict"] == "ERROR" and "SystemExit(0)" in r["reason"]
                        for r in rows if r["standard"] != "expect_error")


def test_a_worker_that_dies_leaves_an_error_row_and_exit_1(tmp_path):
    (tmp_path / "k.py").write_text(EXITING)
    out = run_cli("run", "--level", "L0", "--op", "lion", "--kernels", tmp_path / "k.py",
                  "--backend", "dies", "-n", "2", "-k", "small", "--reports", tmp_path,
                  "--run-id", "x")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    doc = json.loads((tmp_path / "x" / "results.json").read_text())
    lost = [r for r in doc["rows"] if r["reason"].startswith("no result")]
    assert len(lost) == 1 and lost[0]["case_id"] == "small-fp32-8x8", lost
    assert lost[0]["verdict"] == "ERROR" and doc["meta"]["counts"]["ERROR"] >= 1
    suite = ET.parse(tmp_path / "x" / "junit.xml").getroot()
    assert sum(int(s.get("errors", 0)) for s in suite.iter("testsuite")) >= 1
    assert re.search(r"ERROR 1[,;]", out.stdout), out.stdout[-1500:]  # the totals line


def test_a_kernel_module_that_exits_at_import_is_a_usage_error(tmp_path):
    (tmp_path / "bye.py").write_text("import sys\nsys.exit(0)\n")
    out = run_cli("run", "--level", "L0", "--op", "lion", "--kernels", tmp_path / "bye.py",
                  "--reports", tmp_path)
    assert out.returncode == 2 and "sys.exit(0)" in out.stderr, out.stderr


MISBEHAVING = '''
import ctypes
import os
import signal
import threading
import time
import torch
import verify


def _target(weight):
    return weight.shape == (8, 8) and weight.dtype == torch.float32


def _fine(weight, exp_avg):
    return weight.clone(), exp_avg.float()


@verify.kernel("lion", backend="hangs")
def hangs(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    if _target(weight):
        time.sleep(10**6)
    return _fine(weight, exp_avg)


@verify.kernel("lion", backend="stuck")
def stuck(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    if _target(weight):  # no signal reaches it: only ending its worker stops it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(10**6)
    return _fine(weight, exp_avg)


@verify.kernel("lion", backend="segfaults")
def segfaults(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    if _target(weight):
        ctypes.string_at(0)
    return _fine(weight, exp_avg)


@verify.kernel("lion", backend="exits")
def exits(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    if _target(weight):
        os._exit(3)
    return _fine(weight, exp_avg)


@verify.kernel("lion", backend="threads")
def threads(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    threading.Thread(target=time.sleep, args=(10**6,)).start()  # not a daemon
    return _fine(weight, exp_avg)


@verify.kernel("lion", backend="compares")
def compares(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    big = torch.zeros(3 << 16, dtype=torch.float64)  # three blocks: the pass's threads
    verify.compare(big.float(), big)
    return _fine(weight, exp_avg)
'''


def test_a_serial_run_isolates_hangs_and_crashes_into_error_rows(tmp_path):
    """No -n: kernels run in one isolated worker. A hang is stopped at --case-timeout, a
    kernel that never returns to Python ends its worker, a segfault and an os._exit cost
    their item; every other item still runs, and each cause is named."""
    (tmp_path / "k.py").write_text(MISBEHAVING)
    out = run_cli("run", "--level", "L0", "--op", "lion", "--kernels", tmp_path / "k.py",
                  "--backend", "hangs", "--backend", "stuck", "--backend", "segfaults",
                  "--backend", "exits", "-k", "small and fp32", "--case-timeout", "2",
                  "--reports", tmp_path, "--run-id", "x", timeout=300)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    rows = json.loads((tmp_path / "x" / "results.json").read_text())["rows"]
    errors = {r["backend"]: r["reason"] for r in rows if r["verdict"] == "ERROR"}
    assert set(errors) == {"hangs", "stuck", "segfaults", "exits"}, errors
    assert errors["hangs"].startswith("timed out after 2 s while running the kernel")
    assert "never returned to Python" in errors["stuck"]
    assert "signal 11 (SIGSEGV)" in errors["segfaults"] and "k.py" in errors["segfaults"]
    assert "exited with status 3" in errors["exits"]
    # the other cases of every kernel ran and were judged (the kernels return the inputs)
    judged = {(r["backend"], r["case_id"]) for r in rows if r["verdict"] in ("PASS", "FAIL")}
    assert {b for b, _ in judged} == set(errors) and len(judged) == 4 * 2


def test_threads_left_running_do_not_keep_an_in_process_run_alive(tmp_path):
    (tmp_path / "k.py").write_text(MISBEHAVING)
    out = run_cli("run", "--level", "L0", "--op", "lion", "--kernels", tmp_path / "k.py",
                  "--backend", "threads", "-n", "0", "-k", "small and fp32 and 8x8",
                  "--reports", tmp_path, "--run-id", "x", timeout=120)
    assert out.returncode == 1 and "still running" in out.stderr, out.stderr[-2000:]
    assert "1 thread(s)" in out.stderr and "verify-pass" not in out.stderr, out.stderr[-2000:]
    assert (tmp_path / "x" / "results.json").exists()


def test_the_comparators_own_threads_are_not_reported_as_left_running(tmp_path):
    """A compare over several blocks starts the comparator's pool threads (block_threads),
    which idle between compares: an in-process run does not take them for a kernel's."""
    (tmp_path / "k.py").write_text(MISBEHAVING)
    out = run_cli("run", "--level", "L0", "--op", "lion", "--kernels", tmp_path / "k.py",
                  "--backend", "compares", "-n", "0", "-k", "small and fp32 and 8x8",
                  "--reports", tmp_path, "--run-id", "x", timeout=120)
    assert "still running" not in out.stderr, out.stderr[-2000:]
    rows = json.loads((tmp_path / "x" / "results.json").read_text())["rows"]
    assert rows and all(r["verdict"] in ("PASS", "FAIL") for r in rows), rows


VIA_API = """
import json, sys
import verify
from verify import registry
registry.load_user_module(sys.argv[1])
run = verify.run(level="L0", ops=["lion"], backends=["hangs"], dtypes=["fp32"],
                 reports=False, store=sys.argv[2], case_timeout=1)
print(json.dumps([[r["case_id"], r["verdict"], r["reason"]] for r in run.rows]))
"""


def test_verify_run_stops_a_hung_kernel_at_case_timeout(tmp_path):
    """In its own process: the kernels registered here must not reach other tests."""
    (tmp_path / "k.py").write_text(MISBEHAVING)
    out = subprocess.run([sys.executable, "-c", VIA_API, str(tmp_path / "k.py"),
                          str(tmp_path / "s")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    errors = [r for r in rows if r[1] == "ERROR"]
    assert len(errors) == 1 and errors[0][0] == "small-fp32-8x8", rows
    assert errors[0][2].startswith("timed out after 1 s")


def test_a_kernel_module_that_os_exits_at_import_is_a_usage_error(tmp_path):
    (tmp_path / "gone.py").write_text("import os\nos._exit(0)\n")
    out = run_cli("run", "--level", "L0", "--op", "lion", "--kernels", tmp_path / "gone.py",
                  "--reports", tmp_path)
    assert out.returncode == 2 and "os._exit" in out.stderr, out.stderr[-1500:]


STOPS_THE_REGISTRY = '''
import os, signal
import verify


@verify.kernel("lion", backend="stopper")
def stopper(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    pid = int(os.environ["REGISTRY_PID"])
    try:
        os.kill(pid, signal.SIGKILL)   # the registry dies mid-run
    except ProcessLookupError:
        pass
    return weight.clone(), exp_avg.float()
'''


def test_a_registry_lost_mid_run_with_registry_required_is_error_rows(tmp_path):
    from helpers import Service
    svc = Service(tmp_path / "served", token=None)
    try:
        (tmp_path / "k.py").write_text(STOPS_THE_REGISTRY)
        out = run_cli("run", "--level", "L0", "--op", "lion", "--dtype", "fp32",
                      "--kernels", tmp_path / "k.py", "--backend", "stopper",
                      "--registry", svc.url, "--registry-required", "--store", tmp_path / "s",
                      "--reports", tmp_path, "--run-id", "x",
                      env={"REGISTRY_PID": str(svc.proc.pid)})
    finally:
        svc.stop()
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    rows = json.loads((tmp_path / "x" / "results.json").read_text())["rows"]
    assert rows and all(r["verdict"] == "ERROR" and "registry unavailable" in r["reason"]
                        for r in rows), [r["reason"] for r in rows]
