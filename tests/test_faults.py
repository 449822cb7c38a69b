"""Faults become rows, never a green run: a kernel that exits, a worker that dies, a
kernel module that exits at import."""
import json
import re
import xml.etree.ElementTree as ET

from helpers import run_cli

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
