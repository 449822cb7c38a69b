"""Both floors' figures are computed once per golden and kept beside it in the store
(verify/golden/floors.py): compare with a known floor gives the figures of compare's own
floor bit for bit; a warm run reads them, computes none and writes the same rows; gc
keeps them with their golden; the audit recomputes them and catches a tampered one."""
import dataclasses
import json
import math
from dataclasses import asdict

import pytest
import torch

import verify
from verify.comparator.comparison import compare, output_floor
from verify.comparator.metrics import measure_all, measure_floor, round_once
from verify.golden import floors
from verify.golden.store import GoldenStore


def _same(x, y):
    return x == y or (isinstance(x, float) and isinstance(y, float)
                      and math.isnan(x) and math.isnan(y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_known_floor_gives_compare_s_own_floor_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(1)
    for case, shape in enumerate([(1000,), (37, 129), (2, 70000)]):
        g = torch.randn(shape, generator=gen, dtype=torch.float64) * 10.0 ** (2 * case - 2)
        flat = g.view(-1)
        flat[::97], flat[5::101], flat[7::89] = float("nan"), float("inf"), 1e-40
        flat[9::83] = 1e38 if dtype == torch.float32 else 7e4  # overflows the dtype
        a = g.to(dtype)
        a.view(-1)[::13] += 0.01
        for std in ("cann_v1", "cann_v2", "allclose", "ulp", "abs_threshold",
                    {"name": "allclose", "atol": 1e-3, "rtol": 1e-2, "scale": 4.0}):
            own = compare(a, g, dtype=dtype, standard=std)
            known = compare(a, g, dtype=dtype, standard=std,
                            floor=output_floor(g, dtype, std))
            mine, kept = asdict(own.floor), asdict(known.floor)
            assert all(_same(mine[k], kept[k]) for k in mine), (std, shape)
            assert own.histogram == known.histogram and own.warning == known.warning
            assert _same(own.floor_margin, known.floor_margin) and own.verdict == known.verdict


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_floor_alone_is_the_rounded_golden_measured_as_an_output(dtype):
    """measure_floor rounds each block in cache; the figures are those of the whole golden
    rounded first (round_once) and measured as a kernel's output, bit for bit: NaN / Inf
    in the golden, finite values the rounding overflows, subnormals, signed zeros, a
    partial last block."""
    gen = torch.Generator().manual_seed(7)
    g = torch.randn(3 * 65536 + 1001, generator=gen, dtype=torch.float64)
    g[::211], g[3::307], g[5::401] = float("nan"), -float("inf"), 2.0 ** -140
    g[7::503] = 3.5e38 if dtype == torch.float32 else 7e4  # rounds to Inf
    g[9::601], g[11::701] = -0.0, 1e-30
    g[:65536] *= 1e-3  # a block of another scale
    for atol, rtol, scale in ((None, None, 1.0), (1e-3, 1e-2, 4.0), (0.0, 1e-9, 1.0)):
        m, hist = measure_floor(g, dtype, atol=atol, rtol=rtol, scale=scale)
        ref = measure_all(round_once(g, dtype), g, dtype, atol=atol, rtol=rtol, scale=scale,
                          floor=False)
        mine, theirs = asdict(m), asdict(ref.metrics)
        apart = [k for k in mine if k not in ("argmax_abs", "argmax_rel")
                 and not _same(mine[k], theirs[k])]
        assert not apart, (atol, rtol, scale, apart)
        assert hist == ref.histogram["actual"] and sum(hist["counts"]) > 0
    with pytest.raises(ValueError, match="float64"):
        measure_floor(g, torch.float64)


def test_a_warm_run_reads_the_floors_and_writes_the_same_rows(tmp_path, monkeypatch):
    store = tmp_path / "store"
    ops = ["softmax", "apply_adam_w_v2"]  # one output; three outputs over several steps
    cold = verify.run(level="L0", ops=ops, backends=["torch"], store=store, reports=False)
    kept = [e for e in GoldenStore(store).entries(derived=True)
            if (e.meta.get("derived") or {}).get("kind") == floors.KIND]
    assert kept and all(e.meta.get("figures") for e in kept)
    calls = []
    real_floor, real_compare = floors.output_floor, floors.compare
    monkeypatch.setattr(floors, "output_floor", lambda *a, **k: calls.append(1) or
                        real_floor(*a, **k))
    monkeypatch.setattr(floors, "compare", lambda *a, **k: calls.append(2) or
                        real_compare(*a, **k))
    warm = verify.run(level="L0", ops=ops, backends=["torch"], store=store, reports=False)
    assert calls == []  # neither floor computed again
    skip = {"golden_source", "golden_s", "kernel_s", "backward_s", "worker"}
    key = lambda r: (r["op"], r["case_id"], r["kernel"], r["output"])  # noqa: E731
    a, b = {key(r): r for r in cold.rows}, {key(r): r for r in warm.rows}
    assert a.keys() == b.keys() and len(a) > 40
    for k in a:
        fields = (set(a[k]) | set(b[k])) - skip
        assert all(_same(a[k].get(f), b[k].get(f)) for f in fields), k


def test_gc_keeps_the_floors_and_the_audit_recomputes_them(tmp_path):
    from verify.golden import audit, compute_floor as cfl
    from verify.cases import selection
    store_dir = tmp_path / "store"
    verify.run(level="L0", ops=["rms_norm"], backends=["torch"], store=store_dir,
               reports=False)
    store = GoldenStore(store_dir)
    kept = [e for e in store.entries(derived=True)
            if (e.meta.get("derived") or {}).get("kind") == floors.KIND]
    assert kept
    live = cfl.live_golden_keys([selection.builtin_cases_dir()])
    assert {e.key for e in kept} <= live
    assert store.gc(live)["entries_removed"] == 0
    first = kept[0]
    assert audit.audit_entry(store, first.key).status == audit.OK
    # a figure changed in the store: the audit recomputes it and says so
    meta = dict(first.meta)
    figures = json.loads(json.dumps(meta["figures"]))
    sub = next(k for k in figures if k.startswith("out|"))
    figures[sub]["metrics"]["mere"] = 0.5
    meta["figures"] = figures
    store.put_tensors(first.key, {"figures": torch.zeros(1)}, meta)
    finding = audit.audit_entry(store, first.key)
    assert finding.status == audit.DIFFERS and "differ" in finding.detail, finding


def _floor_entries(store_dir):
    return [e for e in GoldenStore(store_dir).entries(derived=True)
            if (e.meta.get("derived") or {}).get("kind") == floors.KIND]


def test_floors_travel_through_the_registry_and_a_forged_one_is_disputed(tmp_path,
                                                                          monkeypatch):
    """Machine a computes the goldens and their floors and pushes both; machine b fetches
    both and computes neither floor; floors forged by a writer are caught by a client that
    recomputes what it fetches, disputed, and its rows are the honest ones."""
    from helpers import Service
    import httpx
    from verify.golden.registry_client import DISPUTED_HEADER
    ops, skip = ["softmax"], {"golden_source", "golden_s", "kernel_s", "backward_s", "worker",
                              "warning"}
    key = lambda r: (r["case_id"], r["kernel"], r["output"])  # noqa: E731
    svc = Service(tmp_path / "served", token="t0ken")
    forged_svc = Service(tmp_path / "forged", token="t0ken")
    try:
        monkeypatch.setenv("VERIFY_REGISTRY_TOKEN", "t0ken")
        a = verify.run(level="L0", ops=ops, backends=["torch"], store=tmp_path / "a",
                       registry=svc.url, reports=False)
        pushed = _floor_entries(tmp_path / "served")
        assert pushed and {e.key for e in pushed} == {e.key for e in _floor_entries(
            tmp_path / "a")}
        assert httpx.get(f"{svc.url}/v1/stats").json()["goldens"] == len(
            GoldenStore(tmp_path / "a").entries())  # the floors are not counted as goldens
        real_floor = floors.output_floor  # a writer whose output floors are wrong
        monkeypatch.setattr(floors, "output_floor", lambda *x, **k: (lambda kf: kf and type(kf)(
            dataclasses.replace(kf.metrics, mere=kf.metrics.mere * 3 + 1e-3), kf.histogram))(
            real_floor(*x, **k)))
        verify.run(level="L0", ops=ops, backends=["torch"], store=tmp_path / "f",
                   registry=forged_svc.url, reports=False)
        monkeypatch.setattr(floors, "output_floor", real_floor)
        monkeypatch.delenv("VERIFY_REGISTRY_TOKEN")
        calls = []
        real_compare = floors.compare
        monkeypatch.setattr(floors, "output_floor", lambda *x, **k: calls.append(1) or
                            real_floor(*x, **k))
        monkeypatch.setattr(floors, "compare", lambda *x, **k: calls.append(2) or
                            real_compare(*x, **k))
        b = verify.run(level="L0", ops=ops, backends=["torch"], store=tmp_path / "b",
                       registry=svc.url, reports=False, verify_fetched=0)
        assert calls == [] and {r["golden_source"] for r in b.rows} == {"registry"}
        assert len(_floor_entries(tmp_path / "b")) == len(pushed)
        rows_a, rows_b = {key(r): r for r in a.rows}, {key(r): r for r in b.rows}
        assert rows_a.keys() == rows_b.keys()
        for k in rows_a:
            fields = (set(rows_a[k]) | set(rows_b[k])) - skip
            assert all(_same(rows_a[k].get(f), rows_b[k].get(f)) for f in fields), k
        c = verify.run(level="L0", ops=ops, backends=["torch"], store=tmp_path / "c",
                       registry=forged_svc.url, reports=False, verify_fetched=1)
        assert calls  # every fetched figure recomputed
        assert any("floor figures" in w and "differ from a recomputation" in w
                   for w in c.warnings), c.warnings
        rows_c = {key(r): r for r in c.rows}
        for k in rows_a:
            assert _same(rows_a[k].get("floor_mere"), rows_c[k].get("floor_mere")), k
        forged = _floor_entries(tmp_path / "forged")
        assert any(httpx.get(f"{forged_svc.url}/v1/goldens/{e.key}").headers.get(
            DISPUTED_HEADER) for e in forged)
    finally:
        svc.stop()
        forged_svc.stop()
