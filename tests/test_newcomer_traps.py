"""The traps a newcomer met writing kernels from the README alone: each now gives a
verdict or a message that says what to do."""
import pytest
import torch

import verify
import verify.specs.registry  # noqa: F401  (verify.specs.registry, below)
from verify.comparator import dtypes as dt
from verify.comparator import metrics
from verify.cases import selection
from verify.errors import ConfigError

KERNELS = '''
import torch, verify

def _norm(x, gamma, beta, epsilon):
    rstd = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + epsilon)
    y = x.float() * rstd * gamma.float()
    if beta is not None:
        y = y + beta.float()
    return y.to(x.dtype), rstd

@verify.kernel("add_rms_norm_bias", backend="newcomer", name="in_place")
def in_place(x1, x2, gamma, beta=None, *, epsilon):
    """vLLM-style fused add + norm: the residual sum is written into x1."""
    x1.add_(x2)
    y, rstd = _norm(x1, gamma, beta, epsilon)
    return y, rstd, x1

@verify.kernel("add_rms_norm_bias", backend="newcomer", name="swapped", forward_only=True)
def swapped(x1, x2, gamma, beta=None, *, epsilon):
    x = x1 + x2
    y, rstd = _norm(x, gamma, beta, epsilon)
    return x, rstd, y          # y and x in the wrong order

@verify.kernel("add_rms_norm_bias", backend="newcomer", name="wrong_dtype", forward_only=True)
def wrong_dtype(x1, x2, gamma, beta=None, *, epsilon):
    x = x1 + x2
    y, rstd = _norm(x, gamma, beta, epsilon)
    return y.double(), rstd, x
'''


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory, module_registrations):
    tmp = tmp_path_factory.mktemp("newcomer")
    (tmp / "mine.py").write_text(KERNELS)
    res = verify.run(level="L0", ops=["add_rms_norm_bias"], backends=["newcomer"],
                     kernels=[str(tmp / "mine.py")], dtypes=["fp32"], reports=False)
    return res, str(tmp / "mine.py")


def _judged(rows, kernel):
    """The kernel's judged rows, less the multi-dim gamma cases (these kernels normalise
    the last dim only: a shape error of their own)."""
    return [r for r in rows if r["kernel"] == kernel and r["standard"] != "expect_error"
            and not r["case_id"].startswith("multi-dim")]


def test_an_in_place_kernel_keeps_its_forward_rows(newcomer):
    rows = _judged(newcomer[0].rows, "in_place")
    forward = [r for r in rows if not r["output"].startswith("grad_")]
    grads = [r for r in rows if r["output"].startswith("grad_")]
    assert forward and {r["verdict"] for r in forward} == {"PASS"}
    assert grads and {r["verdict"] for r in grads} == {"ERROR"}
    assert all("forward_only=True" in r["reason"] and "in place" in r["reason"]
               for r in grads)


def test_outputs_in_the_wrong_order_are_named(newcomer):
    rows = _judged(newcomer[0].rows, "swapped")
    y = [r for r in rows if r["output"] == "y"]
    assert y and all(r["verdict"] == "FAIL" for r in y)
    assert all("y matches the golden of output x: outputs in the wrong order?" in r["reason"]
               for r in y)


def test_an_output_of_the_wrong_dtype_points_at_the_kernels_file(newcomer):
    rows, path = newcomer
    bad = [r for r in _judged(rows.rows, "wrong_dtype") if r["output"] == "y"]
    assert bad and {r["verdict"] for r in bad} == {"ERROR"}
    assert all(path in r["reason"] and "verify/runner.py" not in r["reason"] for r in bad)


def test_unknown_names_get_did_you_mean_or_the_kernels_hint():
    with pytest.raises(ConfigError, match="did you mean 'lion'"):
        selection.expand_op_names(["lino"])
    with pytest.raises(ConfigError, match="declared in a --kernels module"):
        selection.expand_op_names(["qqq_private_fusion"])
    with pytest.raises(ConfigError, match="did you mean 'triton'"):
        verify.specs.registry.backend("tritn")


def test_a_uniform_scale_error_is_not_called_a_conversion():
    g = torch.randn(4096, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    n = 128
    scaled = metrics.round_once(g * (1 - 1 / (2 * n)), torch.bfloat16)   # a 1/(2N) too small
    v = verify.compare(scaled, g, dtype="bf16", standard="cann_v1")
    assert "not a conversion" in v.warning and "truncating" not in v.warning
    f32 = g.to(torch.float32)
    truncated = (f32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    v = verify.compare(truncated, g, dtype="bf16", standard="cann_v1")
    assert "a truncating conversion" in v.warning


def test_a_wrong_registry_token_is_one_line_with_the_hint(tmp_path, monkeypatch):
    from helpers import Service
    svc = Service(tmp_path / "served", token="the-right-one")
    try:
        monkeypatch.setenv("VERIFY_REGISTRY_TOKEN", "a-wrong-one")
        res = verify.run(level="L0", ops=["lion"], backends=["torch"], registry=svc.url,
                         store=str(tmp_path / "store"), reports=False)
    finally:
        svc.stop()
    assert {r["verdict"] for r in res.rows} == {"PASS"}
    refused = [w for w in res.warnings if "HTTP 40" in w]
    assert len(refused) == 1, res.warnings
    assert "VERIFY_REGISTRY_TOKEN" in refused[0]


def test_the_report_shows_the_command_as_typed(monkeypatch):
    from verify.report import results
    monkeypatch.delenv("VERIFY_COMMAND", raising=False)
    site = "/venv/lib/python3.11/site-packages/verify/cli.py"
    assert results.command_line([site, "run", "--level", "L0", "--op", "a b"]) == \
        "verify run --level L0 --op 'a b'"
    assert results.command_line(["/venv/bin/verify", "run"]) == "verify run"
    assert results.command_line(["/venv/lib/site-packages/pytest/__main__.py", "-p",
                                 "verify"]) == "pytest -p verify"
    monkeypatch.setenv("VERIFY_COMMAND", "verify run --level L1")
    assert results.command_line() == "verify run --level L1"


def test_the_report_opens_with_a_verdict_per_kernel(newcomer, tmp_path):
    from verify.report import results
    results.write(newcomer[0].rows, tmp_path, {"run_id": "x", "level": "L0"})
    html = (tmp_path / "report.html").read_text()
    top = html.index('id="kernel-verdicts"')
    assert top < html.index('id="summary"') < html.index('id="results"')
    table = html[top:html.index("</table>", top)]
    for kernel in ("in_place", "swapped", "wrong_dtype"):
        assert f"newcomer:{kernel}" in table
    assert 'href="#row-0"' in table          # the first failing row comes first
    body = html[html.index('id="results"'):]
    first = body[body.index('<tr data-verdict='):][:40]
    assert 'data-verdict="ERROR"' in first or 'data-verdict="FAIL"' in first


def test_rows_that_did_not_pass_are_one_line_each_at_the_terminals_width(newcomer):
    from verify.report import results
    rows = [r for r in newcomer[0].rows if r["verdict"] in ("FAIL", "ERROR")]
    assert rows
    for width in (80, 120, 200):
        lines = results.one_line_rows(rows, width)
        assert len(lines) == len(rows) + 1          # a header, then one line per row
        assert all(len(line) <= width for line in lines), width
    text = results.summary_text(newcomer[0].rows, width=100)
    assert "why, in full:" in text and rows[0]["reason"][:60] in text
