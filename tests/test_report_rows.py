"""Every kind of row renders in every view: report.html, junit.xml, results.csv, the
terminal summary and `verify report` (a report is never lost to one odd row)."""
import csv
import textwrap
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from verify.cases import case as cases
from verify.specs import registry
from verify.report import results
from verify.running import runner

from helpers import run_cli, write_cases

USER_OP = '''
import torch
import verify


def _check(x):
    if x.dim() != 2:
        raise ValueError("x must be 2-D")


@verify.declare_op("kinds_argmax", inputs=[verify.InputSpec("x")],
                   outputs=[verify.OutputSpec("idx", "int64"), verify.OutputSpec("y")],
                   dtypes=["fp32"], standard="cann_v2", validate=_check, ranks=(2, 3))
def kinds_argmax(x):
    return x.argmax(-1), x * 2


@verify.kernel("kinds_argmax", backend="kinds")
def argmax_ok(x):
    _check(x)
    return x.argmax(-1), x * 2


@verify.kernel("kinds_argmax", backend="kinds")
def argmax_wrong(x):
    """Off-by-one indices and a scaled y: FAIL with metrics and an integer FAIL."""
    return (x.argmax(-1) + 1) % max(x.shape[-1], 1), x * 2.01


@verify.kernel("kinds_argmax", backend="kinds")
def nan_out(x):
    """Accepts a 3-D x (an expect_error FAIL) and returns NaN."""
    return x.argmax(-1), torch.full_like(x, float("nan"))


@verify.kernel("kinds_argmax", backend="kinds")
def raises(x):
    raise RuntimeError("this kernel is broken")


verify.register_backend(verify.Backend("kinds_offline", check=lambda: (False, "no such device")))


@verify.kernel("kinds_argmax", backend="kinds_offline")
def offline(x):
    return x.argmax(-1), x * 2
'''

CASES = {"op": "kinds_argmax", "levels": {"L0": [
    {"id": "s", "shape": [8, 16], "dtype": "fp32"},
    {"id": "empty", "shape": [0, 16], "dtype": "fp32"},
    {"id": "bad", "shape": [2, 3, 4], "dtype": "fp32", "expect_error": "ValueError"},
]}}


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory, module_registrations):
    tmp = tmp_path_factory.mktemp("kinds")
    (tmp / "kinds.py").write_text(textwrap.dedent(USER_OP))
    registry.load_user_module(str(tmp / "kinds.py"))
    path = write_cases(tmp / "cases", CASES)
    user_cases = {c.id.split("-")[0]: c for c in cases.load_file(path)}
    by_name = {k.name: k for k in registry.kernels("kinds_argmax")}

    rows = []

    def pick(case, kern, verdict, output=None):
        got = [r for r in runner.run_case(case, kern) if r["verdict"] == verdict
               and (output is None or r["output"] == output)]
        assert got, (case.id, kern.name, verdict, output)
        rows.append(got[0])

    pick(user_cases["s"], by_name["argmax_ok"], "PASS", "y")
    pick(user_cases["s"], by_name["argmax_wrong"], "FAIL", "y")        # values, metrics
    pick(user_cases["s"], by_name["argmax_wrong"], "FAIL", "idx")      # integer output
    pick(user_cases["s"], by_name["nan_out"], "FAIL", "y")             # metrics are NaN
    pick(user_cases["bad"], by_name["nan_out"], "FAIL")                # expect_error FAIL
    pick(user_cases["bad"], by_name["argmax_ok"], "PASS")              # expect_error PASS
    pick(user_cases["s"], by_name["raises"], "ERROR")
    pick(user_cases["s"], by_name["offline"], "SKIP")
    pick(user_cases["empty"], by_name["argmax_ok"], "PASS", "y")       # empty tensors
    builtin = {c.op: c for c in cases.load_dir(cases.Path(cases.__file__).parents[2] /
                                                "test_cases", ["rmsnorm_without_weight",
                                                               "moe_routing"])
               if c.level == "L0" and not c.expect_error and c.dtype == "fp32"}
    pick(builtin["rmsnorm_without_weight"], registry.kernels("rmsnorm_without_weight",
                                                             ["torch"])[0], "PASS", "grad_x")
    pick(builtin["moe_routing"], registry.kernels("moe_routing", ["torch"])[0], "PASS",
         "indices")                                                    # top-k set
    run_dir = results.write(rows, tmp / "run", {"run_id": "kinds", "level": "L0"})
    return rows, run_dir


def test_every_view_holds_every_row(every_kind):
    rows, run_dir = every_kind
    page = (run_dir / "report.html").read_text()
    assert page.count("<tr data-verdict=") == len(rows)
    for r in rows:
        assert f"{r['level']}-{r['case_id']}" in page
    suites = ET.parse(run_dir / "junit.xml").getroot()
    assert sum(1 for _ in suites.iter("testcase")) == len(rows)
    with open(run_dir / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert "expect_error" in page and "this kernel is broken" in page


def test_the_terminal_summary_and_verify_report_take_every_row(every_kind):
    rows, run_dir = every_kind
    short = results.summary_text(rows)
    full = results.summary_text(rows, verbose=True)
    assert "verdicts per op and kernel" in short and "kinds:argmax_wrong" in short
    assert "SKIP 1 row(s) of backend kinds_offline: no such device" in short
    assert full.count("kinds_argmax") > short.count("kinds_argmax")
    out = run_cli("report", run_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rebuilt" in out.stdout


def test_skip_is_never_a_failure_colour(every_kind):
    from verify.report import html
    assert html._worst({"PASS", "SKIP"}) == "PASS"
    assert html._worst({"SKIP"}) == "SKIP"
    assert html._worst({"SKIP", "FAIL"}) == "FAIL"
    page = (every_kind[1] / "report.html").read_text()
    skip_css = page.split(".SKIP {")[1].split("}")[0]
    fail_css = page.split(".FAIL {")[1].split("}")[0]
    assert skip_css != fail_css and "#fff3bf" not in skip_css  # not the old warning yellow


def _histogram_by_torch(actual, golden, dtype):
    """The report's histogram computed the straightforward way, tensor op by tensor op."""
    from verify.comparator import metrics
    from verify.comparator import plotdata as p
    g = golden.to(torch.float64).reshape(-1)
    out = {}
    for name, a in (("actual", actual.reshape(-1)), ("floor", metrics.round_once(g, dtype))):
        a64 = a.to(torch.float64)
        err = (a64 - g).abs() / (g.abs() + 1e-7)
        bad = (a64.isnan() != g.isnan()) | ((a64.isinf() | g.isinf()) & (a64 != g))
        lg = torch.log10(torch.nan_to_num(torch.where(bad, torch.inf, err), nan=0.0))
        finite = lg[torch.isfinite(lg)]
        inside = finite[(finite >= p.BIN_LO) & (finite < p.BIN_HI)]
        idx = ((inside - p.BIN_LO) * p.BINS_PER_DECADE).floor().to(torch.int64)
        out[name] = {"counts": torch.bincount(idx, minlength=len(p.EDGES) - 1).tolist(),
                     "zero": int(torch.isneginf(lg).sum()),
                     "under": int((finite < p.BIN_LO).sum()),
                     "over": int((finite >= p.BIN_HI).sum()) + int(torch.isposinf(lg).sum())}
    return out


def test_the_compiled_histogram_gives_the_same_figures():
    from verify.comparator import plotdata
    gen = torch.Generator().manual_seed(4)
    g = torch.randn(300_000, generator=gen, dtype=torch.float64)
    g[:50], g[50:60], g[60:100] = float("nan"), float("inf"), 0.0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = (g * (1 + 1e-3 * torch.randn(g.shape, generator=gen, dtype=torch.float64))).to(dtype)
        a[:25], a[70:80], a[200:210] = 1.0, float("nan"), float("-inf")
        assert plotdata.histogram(a, g, dtype) == _histogram_by_torch(a, g, dtype), dtype


def test_histogram_bins_hold_at_their_edges():
    """The metrics pass bins without log10 per element: values at and one ulp either side
    of every bin edge land where floor((log10(rel) + 12) * 4) puts them."""
    import math

    from verify.comparator import metrics
    from verify.comparator import plotdata
    rels = []
    for k in range(len(plotdata.EDGES)):
        edge = 10.0 ** plotdata.EDGES[k]
        for x in (edge, math.nextafter(edge, 0), math.nextafter(edge, math.inf),
                  metrics._threshold(k + 1)):
            rels += [x, math.nextafter(x, 0)]
    rels = np.array(rels + [1e-300, 5e-324, 1e300, 2.0 ** -1022])
    g = np.zeros(len(rels))
    a = rels * 1e-7  # rel = |a| / (0 + 1e-7): within an ulp of the edges above
    want = np.zeros(len(plotdata.EDGES) + 2, dtype=np.int64)
    for av in a:
        rel = abs(av - 0.0) / (0.0 + 1e-7)
        if rel == 0:
            want[len(plotdata.EDGES) - 1] += 1
            continue
        lg = math.log10(rel)
        if lg < plotdata.EDGES[0]:
            want[len(plotdata.EDGES)] += 1
        elif lg >= plotdata.EDGES[-1]:
            want[len(plotdata.EDGES) + 1] += 1
        else:
            # the product can round up to 60 just under 1e3: still the last bin
            want[min(int(math.floor((lg - plotdata.EDGES[0]) * 4)), 59)] += 1
    n_bins = len(plotdata.EDGES) - 1
    want = {"counts": want[:n_bins].tolist(), "zero": int(want[n_bins]),
            "under": int(want[n_bins + 1]), "over": int(want[n_bins + 2])}
    # float64 actual: the pass bins by a table of exponent and top significand bits and
    # bins exactly what falls in a cell at an edge; every value here is near one, and
    # each must still land in log10's bin
    got = metrics.measure_all(torch.from_numpy(a), torch.from_numpy(g), torch.float64)[2]
    assert got["actual"] == want


def test_log_uniform_errors_over_every_bin_land_in_log10_s_bins():
    """Relative errors spread evenly in log10 from 1e-14 to 1e5 (every bin, every table
    cell between, under and over): the pass's histogram is the torch one, for the kernel
    and for the floor, whatever the output dtype."""
    gen = torch.Generator().manual_seed(6)
    n = 400_000
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    rel = 10.0 ** (torch.rand(n, generator=gen, dtype=torch.float64) * 19 - 14)
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    a64 = g + sign * rel * (g.abs() + 1e-7)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        from verify.comparator import plotdata
        a = a64.to(dtype)
        assert plotdata.histogram(a, g, dtype) == _histogram_by_torch(a, g, dtype), dtype


def test_metrics_are_the_same_with_or_without_plot_data():
    """The block pass is compiled with each set of per-element errors kept (none, the
    relative errors, both): the metrics and the floor's figures agree to the last bit."""
    from dataclasses import asdict

    from verify.comparator import metrics
    gen = torch.Generator().manual_seed(8)
    for shape, dtype in (((3, 70001), torch.float32), ((257, 513), torch.bfloat16),
                         ((65537,), torch.float16)):
        g = torch.randn(shape, generator=gen, dtype=torch.float64)
        g.view(-1)[::101], g.view(-1)[3::211] = float("nan"), float("inf")
        a = (g * (1 + 1e-3 * torch.randn(shape, generator=gen, dtype=torch.float64))).to(dtype)
        plain = metrics.measure_pair(a, g, floor=True)
        for heat in (None, "rel", "tol"):
            full = metrics.measure_all(a, g, floor=True, hist=True, heat=heat)
            for x, y in ((plain[0], full.metrics), (plain[1], full.floor)):
                dx, dy = asdict(x), asdict(y)
                assert all(dx[k] == dy[k] or (dx[k] != dx[k] and dy[k] != dy[k]) for k in dx), \
                    (shape, dtype, heat)


def test_every_float_output_gets_its_histogram_from_the_metrics_pass():
    from verify.comparator import comparison
    from verify.comparator import plotdata
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(3000, generator=gen, dtype=torch.float64)
    a = (g * (1 + 1e-2 * torch.randn(g.shape, generator=gen, dtype=torch.float64))).bfloat16()
    v = comparison.compare(a, g, dtype=torch.bfloat16, standard="cann_v1")
    assert v.histogram == plotdata.histogram(a, g, torch.bfloat16)
    assert v.histogram == _histogram_by_torch(a, g, torch.bfloat16)


@pytest.mark.parametrize("shape", [(64, 1100), (100, 7), (2, 3, 40), (33, 65), (70000, 3),
                                   (70001, 1), (3, 70001), (2100, 2000), (1, 1), (3000, 64),
                                   (5, 3000), (40000, 2), (9000, 31), (1100, 63), (700, 255)])
def test_heat_map_comes_from_the_metrics_pass(shape):
    """The pass's heat map equals the torch one (adaptive max pooling over columns, rows
    binned): rows up to 2048 wide (column maxima row by row), wider ones (a vectorised max
    per window), narrow ones (column maxima per row bin), windows that overlap (32 not
    dividing the columns), rows split across the pass's blocks and chunks, misplaced and
    matching NaN / Inf, both measures."""
    from verify.comparator import comparison
    from verify.comparator import plotdata
    gen = torch.Generator().manual_seed(sum(shape))
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    a = (g * (1 + 1e-3 * torch.randn(shape, generator=gen, dtype=torch.float64))).float()
    flat_a, flat_g = a.view(-1), g.view(-1)
    if flat_a.numel() > 40:
        flat_a[7], flat_a[20], flat_g[20], flat_a[33] = float("nan"), float("inf"), \
            float("inf"), 1e30
        flat_a[-1] += 0.5  # the last element's cell stands out
    for standard, atol, rtol in (("cann_v1", None, None), ("allclose", 1e-5, 1.3e-6)):
        v = comparison.compare(a, g, standard=standard)
        assert v.heatmap == plotdata.heatmap(a, g, atol, rtol), standard
        assert v.heatmap["measure"] == ("d/(atol+rtol|g|)" if atol else "d/(|g|+1e-7)")
        if flat_a.numel() > 40:  # the last element's error is in the last cell
            d = abs(float(flat_a[-1]) - float(flat_g[-1]))
            last = d / (atol + rtol * abs(float(flat_g[-1]))) if atol else \
                d / (abs(float(flat_g[-1])) + 1e-7)
            assert v.heatmap["grid"][-1][-1] >= 0.99 * last


def test_heat_map_values_keep_three_significant_digits():
    """The compiled rounding of the heat map's cells gives float(f"{v:.3g}") for every
    value: ties, powers of ten, beyond the exact powers, subnormals, zero, inf, NaN,
    negatives."""
    from verify.comparator.metrics import three_digits
    rng = np.random.default_rng(0)
    v = np.abs(rng.standard_normal((300, 64))) * 10.0 ** rng.uniform(-40, 40, (300, 64))
    v[0, :14] = [0, 1e300, 1e-300, 5e-324, 123.5, np.inf, np.nan, 1.235, 0.1235, 1e-7, 1e7,
                 999.5, 99.95, 1e22]
    v[1, :6] = [-1.5, -np.inf, 1e23, 1e-23, 2.5e-22, 1.2345e22]
    want = [[float(f"{x:.3g}") for x in row] for row in v.tolist()]
    assert np.array_equal(np.array(three_digits(v)), np.array(want), equal_nan=True)


def _pooled_by_reference(errors: np.ndarray, rows: int, cols: int) -> list:
    """The heat map's cells from float64 errors, by NumPy: adaptive max pooling of each
    row over min(cols, 32) windows, rows binned into min(rows, 32), to three digits."""
    from verify.comparator.metrics import three_digits
    gr, gc = min(rows, 32), min(cols, 32)
    e = errors.reshape(rows, cols)
    grid = np.zeros((gr, gc))
    for w in range(gc):
        s, t = w * cols // gc, -(-(w + 1) * cols // gc)
        for i in range(gr):
            r0, r1 = -(-i * rows // gr), -(-(i + 1) * rows // gr)
            grid[i, w] = e[r0:r1, s:t].max()
    return three_digits(grid)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16,
                                   torch.float16])
def test_a_heat_cell_on_a_rounding_to_three_digits_is_recomputed_exactly(dtype, monkeypatch):
    """The pass keeps each error's heat-map key (its bits over 2^31, rounded up), and a
    cell whose key's span straddles a rounding to three digits is recomputed from the
    data. Cells whose largest error is put just under 1.235e-3 (relative error) or
    1.235 (allclose's measure), 1e-9 of it below where float(f"{v:.3g}") turns up (the
    key's span reaches past it), come out as the errors of the masked one-loop
    reference (tests/masked_block.py, float64, NaN / Inf pairs 0 or 1e300) pooled by
    NumPy give, 1.23e-3 and 1.23, and are the ones recomputed."""
    import masked_block
    from verify.comparator import metrics
    rows, cols = 70, 100
    gen = torch.Generator().manual_seed(4)
    a = (torch.rand(rows, cols, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    g = a.double() * (1 + 1e-6 * torch.randn(a.shape, generator=gen, dtype=torch.float64))
    atol, rtol = 1e-5, 1.3e-6
    flat_a, flat_g = a.view(-1), g.view(-1)
    flat_a[[3, 5]], flat_g[[4, 5]] = float("nan"), float("nan")  # a mismatch, the same NaN
    planted = [(10, 17), (40, 63), (69, 99)]
    seen = []
    real = metrics._exact_heat_cell
    monkeypatch.setattr(metrics, "_exact_heat_cell",
                        lambda *args: seen.append(args[-5:-1]) or real(*args))
    for measure, t in (("rel", 1.235e-3 * (1 - 1e-9)), ("tol", 1.235 * (1 - 1e-9))):
        for r, col in planted:  # a = 1.0 exactly; the golden solves err(a, g) = t
            flat_a[r * cols + col] = 1.0
            flat_g[r * cols + col] = (1.0 - t * 1e-7) / (1 + t) if measure == "rel" else \
                (1.0 - t * atol) / (1 + t * rtol)
        a_np = a.to(torch.float32).numpy() if dtype in (torch.bfloat16, torch.float16) \
            else a.numpy()
        g_np = g.numpy().reshape(-1)
        a_flat = a_np.reshape(-1)
        abits, aexp, aman = metrics._bits_of(a_flat)
        c = metrics._constants(dtype, atol, rtol)
        n = rows * cols
        rels, tols = np.zeros(n), np.zeros(n)
        variant = masked_block.masked_rels if measure == "rel" else masked_block.masked_tols
        variant(a_flat, abits, aexp, aman, g_np, g_np.view(np.int64), 0, n, c,
                np.zeros(metrics.N_SLOTS), rels, tols, np.zeros(n, np.uint32))
        errors = rels if measure == "rel" else tols
        seen.clear()
        got = metrics.measure_all(a, g, dtype, atol=atol, rtol=rtol, heat=measure).heatmap
        assert got["grid"] == _pooled_by_reference(errors, rows, cols), (dtype, measure)
        cells = {(-(-i * rows // 32), w * cols // 32)  # each recomputed cell's first row
                 for i, w in ((r * 32 // rows, col * 32 // cols) for r, col in planted)}
        assert cells <= {(r0, c0) for r0, _, c0, _ in seen}, (dtype, measure, seen)
        assert got["grid"][0][0] == 1e300  # the misplaced NaN
        assert {got["grid"][i][w] for i, w in ((r * 32 // rows, col * 32 // cols)
                                               for r, col in planted)} == {float(f"{t:.3g}")}
