"""What keeps the harness out of the way: each xdist worker gets its share of the cores,
golden versions are computed once per piece of code, a rebuilt report reuses its
figures."""
import json
import os

from helpers import run_cli

THREADS = '''
import torch
import verify
from verify import runner


@verify.kernel("lion", backend="counts")
def counts(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):
    runner.note("torch_threads", torch.get_num_threads())
    return weight.clone(), exp_avg.float()
'''


def test_each_worker_gets_its_share_of_the_cores(tmp_path):
    (tmp_path / "k.py").write_text(THREADS)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = run_cli("run", "--level", "L0", "--op", "lion", "--kernels", tmp_path / "k.py",
                  "--backend", "counts", "-n", "2", "-k", "small and fp32",
                  "--reports", tmp_path, "--run-id", "x", env=env)
    assert out.returncode in (0, 1), out.stdout[-2000:] + out.stderr[-2000:]
    rows = json.loads((tmp_path / "x" / "results.json").read_text())["rows"]
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert {r["torch_threads"] for r in rows} == {share}


def test_golden_versions_read_each_piece_of_code_once():
    from verify.specs import golden_version
    from verify.specs import registry
    import verify.kernels  # noqa: F401
    golden_version._source.cache_clear()
    for name in registry.ops()[:6]:
        golden_version.fingerprint(registry.op(name).golden_fn)
    first = golden_version._source.cache_info()
    for name in registry.ops()[:6]:  # again: every piece of code is read already
        golden_version.fingerprint(registry.op(name).golden_fn)
    again = golden_version._source.cache_info()
    assert first.hits > 0 and again.misses == first.misses and again.hits > first.hits


def test_a_rebuilt_report_reuses_its_figures(tmp_path, monkeypatch):
    import verify
    from verify.report import results
    from verify.report import plots
    run = verify.run(level="L0", ops=["lion"], dtypes=["fp32"], backends=["torch"],
                     reports=tmp_path, run_id="r", store=str(tmp_path / "s"))
    assert list((tmp_path / "r" / ".figures").glob("*.txt"))
    rendered = []
    real = plots._render
    monkeypatch.setattr(plots, "_render", lambda row: rendered.append(1) or real(row))
    rows, meta = results.load(run.run_dir)
    results.write_views(rows, run.run_dir, meta)
    assert rendered == []
    page = (run.run_dir / "report.html").read_text()
    assert "data:image/svg+xml;base64," in page
