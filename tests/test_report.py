"""Reports: the HTML file, JUnit XML, rebuilding from results.json, run-to-run diffs,
progress lines. The browser checks live in test_report_browser.py."""
import copy
import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

import verify
from verify.report import results
from verify.report import html

from helpers import REPO, run_cli


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real run with failures: correct and known-bad RMSProp and Lion kernels."""
    base = tmp_path_factory.mktemp("reports")
    res = verify.run(level="L0", ops=["apply_rms_prop", "lion"], backends=["torch", "mutants"],
                     reports=str(base), run_id="mixed")
    assert res.counts["FAIL"] > 0
    return base / "mixed"


def test_every_run_writes_all_views(run_dir):
    for name in ("results.json", "results.csv", "report.html", "junit.xml", "diff_tables.txt"):
        assert (run_dir / name).stat().st_size > 0, name


def test_report_is_self_contained(run_dir):
    text = (run_dir / "report.html").read_text()
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert "<script src" not in text and "@import" not in text
    doc = json.loads((run_dir / "results.json").read_text())
    for verdict, n in doc["meta"]["counts"].items():
        assert f'<span id="count-{verdict}">{n}</span>' in text
    assert 'id="matrix"' in text and 'id="mutants"' in text and 'id="environment"' in text
    for key in ("torch", "triton", "torch_npu", "device", "git_commit", "command"):
        assert f"<th>{key}</th>" in text
    assert text.count('<tr data-verdict=') == len(doc["rows"])


def test_failing_outputs_get_diff_tables_and_plots(run_dir):
    text = (run_dir / "report.html").read_text()
    details = re.findall(r'<div class="detail" id="detail-(\d+)" data-verdict="(\w+)">', text)
    fails = [i for i, v in details if v == "FAIL"]
    assert fails and len(details) <= html.MAX_FAILING_DETAILS + html.MAX_WORST_PASSING
    assert text.count('class="difftable"') >= len(fails)
    assert text.count('src="data:image/svg+xml;base64,') >= len(fails)


def test_plot_data_is_kept_for_every_float_output(run_dir):
    """Histogram and (2+ dims) heat map for passing outputs too: the report may show any
    row, and the plot data comes from the metrics pass."""
    rows, _ = results.load(run_dir)
    judged = [r for r in rows if r["verdict"] in ("PASS", "FAIL")
              and r["standard"] not in ("expect_error", "exact", "benchmark")
              and r["out_dtype"] in ("fp32", "fp16", "bf16", "fp64")]
    assert judged and all(r.get("histogram") for r in judged)
    wide = [r for r in judged if "x" in str(r["shape"])]
    assert any(r["verdict"] == "PASS" for r in wide)
    assert all(r.get("heatmap") for r in wide)
    failing = [r for r in rows if r["verdict"] == "FAIL" and r["standard"] != "expect_error"]
    assert failing and all(r.get("histogram") and r.get("heatmap") for r in failing)
    r = failing[0]
    n = sum(r["histogram"]["actual"]["counts"]) + r["histogram"]["actual"]["zero"] \
        + r["histogram"]["actual"]["under"] + r["histogram"]["actual"]["over"]
    assert n == r["n"] + r["nan_inf_mismatch"]


def test_junit_xml(run_dir):
    tree = ET.parse(run_dir / "junit.xml")
    cases = tree.getroot().findall(".//testcase")
    rows, _ = results.load(run_dir)
    mutants = results.mutant_summary(rows)
    assert len(cases) == len(rows) + len(mutants)
    failures = tree.getroot().findall(".//failure")
    assert not failures  # every FAIL here is a caught mutant
    names = {c.get("name") for c in cases}
    assert any(n.startswith("L0-level0-fp32-8x8-var_new") for n in names)


def test_junit_failure_carries_metric_and_threshold():
    rows = [{"op": "lion", "level": "L0", "case_id": "c", "backend": "torch", "kernel": "lion",
             "output": "w_new", "verdict": "FAIL", "expected": "PASS", "standard": "cann_v1",
             "reason": "MARE 0.5 >= 10*T 0.00122", "kernel_s": 0.1}]
    from verify.report import junit
    fail = junit.build(rows).getroot().find(".//failure")
    assert fail.get("message") == "cann_v1: MARE 0.5 >= 10*T 0.00122"


def test_report_rebuilds_from_results_json(run_dir, tmp_path):
    import shutil
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    shutil.copy(run_dir / "results.json", copy_dir / "results.json")
    out = run_cli("report", copy_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("report.html", "results.csv", "junit.xml", "diff_tables.txt"):
        assert (copy_dir / name).exists()
    assert (copy_dir / "results.csv").read_text() == (run_dir / "results.csv").read_text()
    a, b = (p.read_text() for p in (run_dir / "report.html", copy_dir / "report.html"))
    assert re.findall(r'id="detail-\d+"', a) == re.findall(r'id="detail-\d+"', b)
    assert run_cli("report", tmp_path / "nope").returncode == 2


KERNEL_VERSION = textwrap.dedent('''
    import verify
    from verify.kernels.torch import optimizers as good

    PLANTED = {planted}

    @verify.kernel("apply_rms_prop", backend="regress")
    def apply_rms_prop(var, ms, mom, grad, **p):
        var_new, ms_new, mom_new = good.apply_rms_prop(var, ms, mom, grad, **p)
        if PLANTED and var.shape == (1, 1):
            var_new = var_new + 1.0                   # a new failure
        if PLANTED:
            var_new = var_new * (1 + 4e-7)            # worse, still within tolerance
        return var_new, ms_new, mom_new
''')


def test_diff_finds_a_planted_regression(tmp_path):
    """Two versions of one user kernel, run one after the other (a user's own kernel
    cannot silently replace a built-in one: that is a duplicate registration)."""
    base = tmp_path / "runs"
    env = {"PYTHONPATH": str(REPO)}
    for run_id, planted in (("before", False), ("after", True)):
        path = tmp_path / f"{run_id}.py"
        path.write_text(KERNEL_VERSION.format(planted=planted))
        out = run_cli("run", "--op", "apply_rms_prop", "--kernels", path, "--backend",
                      "regress", "--reports", base, "--run-id", run_id, env=env)
    assert out.returncode == 1
    same = run_cli("diff", base / "before", base / "before")
    assert same.returncode == 0 and "no regression" in same.stdout
    d = run_cli("diff", base / "before", base / "after")
    assert d.returncode == 1, d.stdout + d.stderr
    assert "new failures" in d.stdout and "tail-fp32-1x1" in d.stdout
    assert "metrics worse by more than 2x" in d.stdout and "REGRESSED" in d.stdout
    page = (base / "after" / "diff-before.html").read_text()
    assert 'id="new-failures"' in page and 'id="worse"' in page
    back = run_cli("diff", base / "after", base / "before")
    assert "1 fixed" in back.stdout


def test_two_thousand_rows_stay_under_20_mb(run_dir):
    rows, meta = results.load(run_dir)
    big = []
    while len(big) < 2000:
        for r in rows:
            r2 = copy.deepcopy(r)
            r2["case_id"] = f"{r['case_id']}-copy{len(big)}"
            big.append(r2)
    text = html.render(big[:2000], meta)
    assert len(text.encode()) < 20 * 1024 * 1024
    assert text.count('<tr data-verdict=') == 2000
    assert text.count('class="detail"') == html.MAX_FAILING_DETAILS + html.MAX_WORST_PASSING


def test_progress_lines_under_xdist(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                          "verify", "--cases-only", "-n", "2", "--level", "L0", "--op", "lion", "--progress-every", "0.0001",
                          "--reports", str(tmp_path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("verify: ")]
    assert lines and re.match(r"verify: \d+/\d+ cases done, \d+ left, now lion, [\d.e+-]+ "
                              r"cases/s, \d+:\d\d elapsed, ETA (\d+:\d\d|unknown)", lines[0])
    assert "precision summary" in out.stdout


def test_heat_map_points_at_a_tail_tile_bug():
    import torch
    from verify.comparator import plotdata
    gen = torch.Generator().manual_seed(3)
    golden = torch.randn(64, 1100, generator=gen, dtype=torch.float64)
    actual = golden.float()
    actual[:, 1024:] += 1e-3  # the last K tile is off
    grid = torch.tensor(plotdata.heatmap(actual, golden, 1e-5, 1.3e-6)["grid"])
    tail_cols = {int(c) for c in (torch.arange(1024, 1100) * grid.shape[1] // 1100)}
    body = [c for c in range(grid.shape[1]) if c not in tail_cols]
    assert grid[:, sorted(tail_cols)].min() > 10 * grid[:, body].max()
    hist = plotdata.histogram(actual, golden, torch.float32)
    start = plotdata.EDGES.index(-4.0)  # every tail element has rel >= 1e-3 / max|g| > 1e-4
    assert sum(hist["actual"]["counts"][start:]) == 64 * 76
