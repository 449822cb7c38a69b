"""Judging what really ran: msprobe dumps made by msprobe itself, NPU-named records with a
correct NPU's outputs (msprobe's own CPU bench functions) and planted wrong ones,
verify.capture -> judge -> replay, and every bad input.

The dumps are made in the msprobe test venv (tests/helpers.msprobe_python: SKIP with the
reason where it cannot be built); capture and the bad inputs need no msprobe.
"""
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import verify
from verify.cases import recorded
from helpers import REPO, msprobe_python, run_cli

DATA = REPO / "tests" / "data"
sys.path.insert(0, str(DATA))
from msprobe_tiny_llama import TinyLlama  # noqa: E402


def _dump(tmp_path_factory, dtype: str) -> Path:
    python = msprobe_python()
    out = tmp_path_factory.mktemp(f"dump-{dtype}")
    proc = subprocess.run([str(python), str(DATA / "msprobe_tiny_llama.py"), str(out), dtype],
                          capture_output=True, text=True, timeout=600, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def bf16_dump(tmp_path_factory):
    return _dump(tmp_path_factory, "bfloat16")


@pytest.fixture(scope="module")
def fp32_dump(tmp_path_factory):
    return _dump(tmp_path_factory, "float32")


@pytest.fixture(scope="module")
def npu_dump(tmp_path_factory):
    python = msprobe_python()
    out = tmp_path_factory.mktemp("npu-records")
    proc = subprocess.run([str(python), str(DATA / "msprobe_npu_records.py"), str(out)],
                          capture_output=True, text=True, timeout=600, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _judged(result):
    return {(r["record"], r["output"]): r["verdict"] for r in result.rows}


@pytest.mark.parametrize("which", ["bf16_dump", "fp32_dump"])
def test_every_judged_call_of_a_real_msprobe_dump_passes(which, request, tmp_path):
    dump = request.getfixturevalue(which)
    result = verify.judge(dump, reports=tmp_path / "r")
    rows = result.rows
    assert rows and all(r["verdict"] == "PASS" for r in rows), \
        [(r["record"], r["output"], r["reason"]) for r in rows if r["verdict"] != "PASS"]
    judged = {r["record"].rsplit(".", 2)[0] for r in rows}
    assert {"Functional.embedding", "Functional.rms_norm", "Functional.linear",
            "Torch.matmul", "Torch.softmax", "Functional.silu",
            "Functional.cross_entropy"} <= judged
    # the backward records that are the inputs' gradients are judged too
    assert {"Functional.silu.0.backward", "Torch.softmax.0.backward"} <= \
        {r["record"] for r in rows}
    for r in rows:
        assert r["kernel"] == "recorded:pytorch" and r["level"] == "recorded"
        assert r["step"] == 0 and r["case_id"] == r["record"]
    # nothing silently dropped: the records no op binds, and the backward records of
    # composite calls, are listed by API with counts
    listed = {e["api"]: e for e in result.not_judged}
    assert listed["Tensor.__add__"]["count"] == 2
    assert "no op binds it" in listed["Tensor.__add__"]["reason"]
    assert "not the gradient" in listed["Functional.linear (backward)"]["reason"]
    meta = json.loads((result.run_dir / "results.json").read_text())["meta"]
    assert meta["recorded"]["not_judged"] == result.not_judged
    assert "Tensor.__add__ x2 (no op binds it)" in result.summary()
    n_records = sum(len(json.loads(p.read_text())["data"])
                    for p in Path(dump).rglob("dump.json"))
    assert meta["recorded"]["records"] == n_records
    assert len(rows) + sum(e["count"] for e in result.not_judged) >= n_records - 1


def _bad_silu_and_rms_norm(src: Path, dst: Path) -> set[str]:
    """A copy of the dump whose rms_norm and silu outputs are a buggy kernel's outputs on
    the same inputs (the mutants of those ops)."""
    from verify.kernels.mutants import framework_ops as bad
    shutil.copytree(src, dst)
    data = next(dst.rglob("dump_tensor_data"))
    planted = set()
    for name, fn in (("Functional.rms_norm.0.forward",
                      lambda a: bad.sum_not_mean(a[0], a[2], eps=1e-6)),
                     ("Functional.silu.0.forward", lambda a: bad.quick_gelu_sigmoid(a[0]))):
        args = [torch.load(data / f"{name}.input.{i}.pt") if (data / f"{name}.input.{i}.pt")
                .exists() else None for i in range(3)]
        torch.save(fn(args), data / f"{name}.output.0.pt")
        planted.add(name)
    return planted


def test_a_mix_level_dump_fills_the_module_column_from_construct_json(tmp_path):
    python = msprobe_python()
    out = tmp_path / "mix"
    out.mkdir()
    proc = subprocess.run([str(python), str(DATA / "msprobe_tiny_llama.py"), str(out),
                           "bfloat16"], capture_output=True, text=True, timeout=600, cwd=out,
                          env={**os.environ, "MSPROBE_LEVEL": "mix"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = verify.judge(out, reports=False)
    by = {r["record"]: r for r in result.rows}
    assert all(r["verdict"] == "PASS" for r in result.rows)
    assert by["Functional.linear.0.forward"]["module"] == "Module.blocks.0.qkv.Linear.forward.0"
    assert by["Functional.embedding.0.forward"]["module"] == "Module.emb.Embedding.forward.0"


def test_a_buggy_kernels_outputs_fail_exactly_those_records(bf16_dump, tmp_path):
    planted = _bad_silu_and_rms_norm(bf16_dump, tmp_path / "bad")
    result = verify.judge(tmp_path / "bad", reports=False)
    failed = {r["record"] for r in result.rows if r["verdict"] == "FAIL"}
    assert failed == planted
    assert result.exit_status == 1
    assert all(r["verdict"] == "PASS" for r in result.rows if r["record"] not in planted)


def test_npu_records_with_a_correct_npus_outputs_pass_and_planted_bugs_fail(npu_dump):
    result = verify.judge(npu_dump, reports=False)
    by_record = {}
    for r in result.rows:
        by_record.setdefault(r["record"], set()).add(r["verdict"])
    apis = {"NPU.npu_rms_norm", "NPU.npu_swiglu", "NPU.npu_rotary_mul",
            "NPU.npu_apply_adam_w", "NPU.npu_moe_gating_top_k_softmax",
            "NPU.npu_fusion_attention"}
    for api in apis:
        assert by_record[f"{api}.0.forward"] == {"PASS"}, api
        assert "FAIL" in by_record[f"{api}.1.forward"], api
    assert {r["kernel"] for r in result.rows} == {"recorded:npu"}
    # npu_rms_norm's second output is the op's rstd, judged in fp32
    rstd = [r for r in result.rows if r["record"] == "NPU.npu_rms_norm.0.forward"
            and r["output"] == "rstd"]
    assert rstd and rstd[0]["out_dtype"] == "fp32" and rstd[0]["verdict"] == "PASS"


def test_shards_of_a_judged_dump_merge_with_its_not_judged_list(bf16_dump, tmp_path):
    for i in (1, 2):
        proc = run_cli("judge", bf16_dump, "--shard", f"{i}/2", "-n", "0", "--reports",
                       tmp_path, "--run-id", f"s{i}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("merge", "--out", tmp_path / "m", tmp_path / "s1", tmp_path / "s2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Tensor.__add__ x2 (no op binds it)" in proc.stdout
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    whole = verify.judge(bf16_dump, reports=False)
    assert sorted(r["record"] for r in merged["rows"]) == sorted(r["record"] for r in
                                                                  whole.rows)


def test_replaying_a_dump_runs_a_kernel_on_the_recorded_inputs(bf16_dump, tmp_path):
    good = verify.run(cases=str(bf16_dump), backends=["torch"], reports=False)
    assert good.rows and {r["verdict"] for r in good.rows} == {"PASS"}
    assert {r["level"] for r in good.rows} == {"recorded"}
    bad = verify.run(cases=str(bf16_dump), backends=["mutants"], reports=False)
    caught = {m["op"] for m in bad.mutants if m["caught"]}
    assert {"rms_norm", "silu", "softmax", "linear"} <= caught


# -- capture ---------------------------------------------------------------------------
def _model_step(model, ids, vocab):
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, vocab), ids.reshape(-1))
    loss.backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


def test_capture_judge_replay_round_trip_changes_nothing_the_model_computes(tmp_path):
    torch.manual_seed(0)
    model = TinyLlama(32, 16, 1).to(torch.bfloat16)
    ids = torch.randint(0, 32, (2, 8))
    ref_logits, ref_grads = _model_step(model, ids, 32)
    model.zero_grad()
    with verify.capture(tmp_path / "cap") as cap:
        logits, grads = _model_step(model, ids, 32)
    assert torch.equal(logits, ref_logits)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    assert cap.calls >= 10
    judged = verify.judge(tmp_path / "cap", reports=False)
    assert judged.rows and {r["verdict"] for r in judged.rows} == {"PASS"}
    assert {r["kernel"] for r in judged.rows} == {"recorded:cpu"}
    assert {"Functional.rms_norm", "Functional.linear", "Torch.softmax", "Functional.silu",
            "Functional.cross_entropy", "Functional.embedding"} <= {
        r["record"].rsplit(".", 2)[0] for r in judged.rows}
    replay = verify.run(cases=str(tmp_path / "cap"), backends=["mutants"], ops=["rms_norm"],
                        reports=False)
    assert {m["kernel"] for m in replay.mutants if m["caught"]} == {"sum_not_mean",
                                                                     "weight_ignored"}


def test_capture_deduplicates_tensors_and_calls(tmp_path):
    x = torch.randn(4, 32)
    with verify.capture(tmp_path / "cap") as cap:
        for _ in range(3):
            F.silu(x)
        F.silu(x * 2)
    assert cap.calls == 4
    assert cap.blobs == 4  # x, silu(x), 2x, silu(2x): each stored once
    idx = recorded.index(tmp_path / "cap")
    calls = sorted(c.source.calls for c in idx.cases)
    assert calls == [1, 3]


def test_capture_limits_say_so_and_count_what_they_left_out(tmp_path):
    x = torch.randn(8, 8)
    with pytest.warns(verify.CaptureLimit, match="max_calls 2 reached"):
        with verify.capture(tmp_path / "cap", max_calls=2) as cap:
            for i in range(5):
                F.silu(x + i)
    assert cap.calls == 2 and cap.skipped == {"Functional.silu": 3}
    result = verify.judge(tmp_path / "cap", reports=False)
    assert len(result.rows) == 2
    assert result.not_judged == [{"api": "Functional.silu", "count": 3,
                                  "reason": cap.limit_message}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with verify.capture(tmp_path / "cap2", max_bytes=300) as cap2:
            F.silu(torch.randn(4, 4))   # 2 x 64 bytes: fits
            F.silu(torch.randn(64, 64))  # 16 KiB: over
    assert cap2.calls == 1 and "max_bytes 300" in cap2.limit_message


def test_capture_records_a_users_own_kernel(tmp_path, module_registrations):
    @verify.kernel("silu", backend="mine")
    def my_silu(x):
        return (x.float() * torch.sigmoid(x.float())).to(x.dtype)

    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with verify.capture(tmp_path / "cap", ops=["silu"]) as cap:
        my_silu(x)
    assert cap.calls == 1  # the kernel, not the torch calls inside it
    result = verify.judge(tmp_path / "cap", reports=False)
    assert [r["record"] for r in result.rows] == ["Kernel.silu.my_silu.0.forward"]
    assert result.rows[0]["verdict"] == "PASS"


# -- bad input -------------------------------------------------------------------------
def _small_dump(tmp_path) -> Path:
    """A dump in msprobe's layout written here: two silu records."""
    d = tmp_path / "dump" / "step0" / "proc1"
    (d / "dump_tensor_data").mkdir(parents=True)
    data = {}
    for n in range(2):
        x = torch.randn(4, 8)
        name = f"Functional.silu.{n}.forward"
        torch.save(x, d / "dump_tensor_data" / f"{name}.input.0.pt")
        torch.save(F.silu(x), d / "dump_tensor_data" / f"{name}.output.0.pt")
        t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 8]}
        data[name] = {"input_args": [{**t, "data_name": f"{name}.input.0.pt"}],
                      "input_kwargs": {}, "output": [{**t, "data_name": f"{name}.output.0.pt"}]}
    (d / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1",
                                             "framework": "pytorch", "dump_data_dir": "/x",
                                             "data": data}))
    return d


def test_calls_alike_in_summaries_are_told_apart_by_content_and_the_index_reads_no_tensor(
        tmp_path, monkeypatch):
    """Dedupe by dump.json's summaries, then by content: a permuted input has the same
    Max / Min / Mean / Norm (judged apart), a repeated call is counted, and the same
    inputs with other outputs are judged apart; calls with distinct summaries cost no
    file read at all."""
    from verify.cases import msprobe_dump
    d = tmp_path / "dump" / "step0" / "proc1"
    (d / "dump_tensor_data").mkdir(parents=True)
    x = torch.randn(4, 8)
    inputs = [x, x.clone(), x.flip(0), x.clone(), torch.randn(4, 8)]
    outputs = [F.silu(t) for t in inputs]
    outputs[3] = outputs[3] * 1.5  # a nondeterministic (or broken) kernel's other result
    data = {}
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 8]}
    for n, (a, o) in enumerate(zip(inputs, outputs)):
        name = f"Functional.silu.{n}.forward"
        torch.save(a, d / "dump_tensor_data" / f"{name}.input.0.pt")
        torch.save(o, d / "dump_tensor_data" / f"{name}.output.0.pt")
        stats = {k: float(f(a)) for k, f in (("Max", torch.max), ("Min", torch.min),
                                               ("Mean", torch.mean), ("Norm", torch.norm))}
        out_stats = {"Max": round(float(o.max()), 3)}
        data[name] = {"input_args": [{**t, **stats, "data_name": f"{name}.input.0.pt"}],
                      "input_kwargs": {},
                      "output": [{**t, **out_stats, "data_name": f"{name}.output.0.pt"}]}
    (d / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1",
                                             "framework": "pytorch", "dump_data_dir": "/x",
                                             "data": data}))
    idx = recorded.index(tmp_path / "dump")
    by = {c.id: c.source for c in idx.cases}
    assert sorted(by) == ["Functional.silu.0.forward", "Functional.silu.2.forward",
                          "Functional.silu.3.forward", "Functional.silu.4.forward"]
    assert by["Functional.silu.0.forward"].same == ("Functional.silu.1.forward",)
    assert by["Functional.silu.0.forward"].calls == 2
    keys = {c.id: c.golden_key("1") for c in idx.cases}
    assert keys["Functional.silu.0.forward"] == keys["Functional.silu.3.forward"]
    assert len({keys["Functional.silu.0.forward"], keys["Functional.silu.2.forward"],
                keys["Functional.silu.4.forward"]}) == 3

    loads = []
    real = msprobe_dump.TensorRef.load
    monkeypatch.setattr(msprobe_dump.TensorRef, "load",
                        lambda self, mmap=False: loads.append(self.path) or real(self, mmap))
    doc = json.loads((d / "dump.json").read_text())
    for n in (1, 2, 3):  # distinct summaries everywhere
        del doc["data"][f"Functional.silu.{n}.forward"]
    (d / "dump.json").write_text(json.dumps(doc))
    assert len(recorded.index(tmp_path / "dump").cases) == 2 and loads == []
    result = verify.judge(tmp_path / "dump", reports=False)
    assert [r["verdict"] for r in result.rows] == ["PASS", "PASS"]


def test_a_truncated_dump_json_is_exit_2_naming_the_file(tmp_path):
    d = _small_dump(tmp_path)
    text = (d / "dump.json").read_text()
    (d / "dump.json").write_text(text[: len(text) * 2 // 3])
    proc = run_cli("judge", tmp_path / "dump", "-n", "0", "--reports", tmp_path / "r")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "dump.json" in proc.stderr and "cut short" in proc.stderr
    assert "Functional.silu.0.forward" in proc.stderr


def test_a_missing_tensor_file_is_that_records_error_row(tmp_path):
    d = _small_dump(tmp_path)
    (d / "dump_tensor_data" / "Functional.silu.1.forward.input.0.pt").unlink()
    result = verify.judge(tmp_path / "dump", reports=False)
    by = {r["record"]: r for r in result.rows}
    assert by["Functional.silu.0.forward"]["verdict"] == "PASS"
    bad = by["Functional.silu.1.forward"]
    assert bad["verdict"] == "ERROR" and "Functional.silu.1.forward.input.0.pt" in bad["reason"]
    assert "missing" in bad["reason"]


def test_a_record_that_does_not_fit_its_binding_is_an_error_row_naming_it(tmp_path):
    d = _small_dump(tmp_path)
    doc = json.loads((d / "dump.json").read_text())
    doc["data"]["Functional.silu.1.forward"]["input_args"].append({"type": "int", "value": 3})
    doc["data"]["Functional.silu.1.forward"]["input_args"].append({"type": "int", "value": 4})
    (d / "dump.json").write_text(json.dumps(doc))
    result = verify.judge(tmp_path / "dump", reports=False)
    bad = [r for r in result.rows if r["record"] == "Functional.silu.1.forward"][0]
    assert bad["verdict"] == "ERROR"
    assert "binding Functional.silu" in bad["reason"] and "op 'silu'" in bad["reason"]


def test_statistics_only_and_mindspore_dumps_are_exit_2_saying_why(tmp_path):
    d = _small_dump(tmp_path)
    doc = json.loads((d / "dump.json").read_text())
    (d / "dump.json").write_text(json.dumps({**doc, "task": "statistics"}))
    proc = run_cli("judge", tmp_path / "dump", "-n", "0")
    assert proc.returncode == 2 and "no tensors: dump with task tensor" in proc.stderr
    (d / "dump.json").write_text(json.dumps({**doc, "framework": "mindspore"}))
    proc = run_cli("judge", tmp_path / "dump", "-n", "0")
    assert proc.returncode == 2 and "MindSpore" in proc.stderr and "not supported" in \
        proc.stderr
    proc = run_cli("judge", tmp_path / "nothing-here", "-n", "0")
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_verify_judge_cli_writes_a_run_and_lists_what_it_did_not_judge(tmp_path):
    d = _small_dump(tmp_path)
    doc = json.loads((d / "dump.json").read_text())
    doc["data"]["Tensor.__add__.0.forward"] = {"input_args": [], "input_kwargs": {},
                                               "output": []}
    (d / "dump.json").write_text(json.dumps(doc))
    proc = run_cli("judge", d / "dump.json", "--reports", tmp_path / "r", "--run-id", "j")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not judged (1 records)" in proc.stdout
    assert "Tensor.__add__ x1 (no op binds it)" in proc.stdout
    run = tmp_path / "r" / "j"
    for name in ("results.csv", "results.json", "report.html", "junit.xml"):
        assert (run / name).is_file()
    html = (run / "report.html").read_text()
    assert 'id="not-judged"' in html and "Tensor.__add__" in html
    import pandas as pd
    df = pd.read_csv(run / "results.csv")
    assert set(df["record"]) == {"Functional.silu.0.forward", "Functional.silu.1.forward"}


def test_verify_ops_lists_an_ops_bindings():
    proc = run_cli("ops", "rms_norm")
    assert proc.returncode == 0
    for name in ("Functional.rms_norm", "Torch.rms_norm", "NPU.npu_rms_norm"):
        assert name in proc.stdout


def test_a_users_op_binds_its_calls_from_the_readme(tmp_path):
    """The README's my_ops.py, in a folder of its own: its bound function is captured
    through its module, an msprobe-named record of its NPU call is judged, and a call it
    does not cover is listed as not judged."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("# my_ops.py\nimport torch\nimport verify\n\n\ndef scaled_silu_call")
    code = readme[start:readme.index("```", start)]
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "my_ops.py").write_text(code)
    script = proj / "use.py"
    script.write_text(
        "import sys, torch, verify\n"
        "sys.path.insert(0, '.')\n"
        "import my_ops\n"
        "x = torch.randn(4, 16, dtype=torch.bfloat16)\n"
        "with verify.capture('calls') as cap:\n"
        "    y = my_ops.fused_scaled_silu(x, 2.0)\n"
        "    my_ops.fused_scaled_silu(torch.randn(1, 1, 1, 1, 2), 2.0)\n"
        "assert cap.calls == 2, cap.calls\n"
        "r = verify.judge('calls', kernels=['my_ops.py'], reports=False)\n"
        "print([(x['record'], x['verdict']) for x in r.rows])\n"
        "print(r.not_judged)\n"
        "assert [x['verdict'] for x in r.rows] == ['PASS']\n"
        "assert r.not_judged[0]['count'] == 1 and 'more than 4 dims' in "
        "r.not_judged[0]['reason']\n")
    env = {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script)], cwd=proj, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ, **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Functional" not in proc.stdout.split("\n")[0]  # the user's call, by its own name
    assert "my_ops.fused_scaled_silu.0.forward" in proc.stdout
