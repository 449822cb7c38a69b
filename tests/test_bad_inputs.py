"""Every bad input is exit 2 with a message naming the file and field, never a traceback,
a hang or unbounded memory: the case loader is fuzzed with random mutations of the real
case files, and the bad inputs seen in the wild are run through the command line."""
import json
import os
import random
import resource
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from case_mutations import mutate
from helpers import REPO, run_cli, write_cases

import verify.kernels  # noqa: F401  (the built-in ops the case files name)
from verify.cases import case as cases
from verify.errors import ConfigError

SEEDS = sorted((REPO / "test_cases").glob("*.json"))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**12) | st.floats(allow_nan=True)
    | st.text(max_size=12) | st.sampled_from(["fp32", "bf16", "L0", "normal", "given", "x"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5),
    max_leaves=20)


def _load_or_refuse(path: Path) -> str:
    """'loaded' or 'refused' (a ConfigError naming the file); anything else fails."""
    try:
        cases.load_file(path)
        return "loaded"
    except ConfigError as exc:
        assert str(path) in str(exc), exc
        return "refused"


@settings(max_examples=150, deadline=5000, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed_file=st.sampled_from(SEEDS), rng_seed=st.integers(0, 2**32 - 1),
       value=json_values, byte_level=st.booleans())
def test_mutated_case_files_load_or_are_refused(tmp_path, seed_file, rng_seed, value,
                                                byte_level):
    data = mutate(seed_file.read_bytes(), random.Random(rng_seed), value, byte_level)
    path = tmp_path / seed_file.name
    path.write_bytes(data)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _load_or_refuse(path)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 512, f"loading one case file grew the process by {grown_mib:.0f} MiB"


BAD = {
    "utf8": b'{"op": "lion", "levels": {"L0": [\xff]}}',
    "deep": b"[" * 100_000,
    "long_int": b'{"op":"lion","levels":{"L0":[{"id":"a","shape":[8],"seed":'
                + b"9" * 5000 + b"}]}}",
    "empty_shapes": b'{"op":"lion","levels":{"L0":[{"id":"a","shapes":{}}]}}',
    "nan_param": b'{"op":"lion","levels":{"L0":[{"id":"a","shape":[8,8],"params":{"lr":NaN}}]}}',
    "sweep": json.dumps({"op": "lion", "levels": {"L0": [{
        "id": "a", "shape": [[n] for n in range(1, 11)], "dtype": ["fp32", "fp16", "bf16"],
        "dims": {d: list(range(1, 11)) for d in "abcd"}}]}}).encode(),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_case_files_are_exit_2_naming_the_file(tmp_path, kind):
    write_cases(tmp_path / "c", BAD[kind].decode("latin-1"), name="lion")
    (tmp_path / "c" / "lion.json").write_bytes(BAD[kind])
    out = run_cli("run", "--level", "L0", "--cases", tmp_path / "c", "--reports", tmp_path)
    assert out.returncode == 2, out.stdout[-1500:] + out.stderr[-1500:]
    assert "Traceback" not in out.stderr and "lion.json" in out.stderr, out.stderr[-1500:]


def test_a_nan_param_is_accepted_when_the_case_opts_in(tmp_path):
    doc = {"op": "lion", "levels": {"L0": [{"id": "a", "shape": [8, 8], "nonfinite_params": True,
                                            "params": {"lr": float("nan")}}]}}
    path = tmp_path / "lion.json"
    path.write_text(json.dumps(doc))
    (case,) = cases.load_file(path)
    assert case.params["lr"] != case.params["lr"]


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder"])
def test_non_regular_case_files_are_refused_at_once(tmp_path, kind):
    folder = tmp_path / "c"
    folder.mkdir()
    target = folder / "lion.json"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev_zero":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        cases.load_file(target)


@pytest.mark.parametrize("args, words", [
    (["-n", "-1"], "workers"),
    (["--time", "-5"], "--time"),
    (["--case-timeout", "nan"], "--case-timeout"),
    (["--run-id", "../../x"], "run id"),
])
def test_bad_command_lines_are_exit_2(tmp_path, args, words):
    out = run_cli("run", "--level", "L0", "--op", "lion", "--reports", tmp_path, *args)
    assert out.returncode == 2, out.stdout[-1000:] + out.stderr[-1000:]
    assert words in out.stderr and "Traceback" not in out.stderr, out.stderr[-1000:]
    assert not (tmp_path.parent / "x").exists()


def test_reports_naming_a_file_is_exit_2_before_the_run(tmp_path):
    (tmp_path / "file").write_text("")
    out = run_cli("run", "--level", "L0", "--op", "lion", "--reports", tmp_path / "file")
    assert out.returncode == 2 and "not a folder" in out.stderr, out.stderr[-1000:]


def test_two_runs_never_share_a_run_id(tmp_path):
    from verify.report import results
    first = results.reserve_run_dir(tmp_path, "nightly")
    (first / "results.json").write_text("{}")
    with pytest.raises(ConfigError, match="already holds a run"):
        results.reserve_run_dir(tmp_path, "nightly")


def test_a_user_kernel_without_backend_cannot_replace_a_built_in_one(tmp_path):
    from verify.specs import registry
    builtin = [k for k in registry.kernels("lion", ["torch"])]
    assert builtin, "the built-in torch kernel of lion"
    (tmp_path / "mine.py").write_text(
        "import verify\n\n"
        f"@verify.kernel('lion', name={builtin[0].name!r})\n"
        "def lion(weight, grad, exp_avg, *, lr, beta1, beta2, weight_decay):\n"
        "    return weight, exp_avg\n")
    out = run_cli("run", "--level", "L0", "--op", "lion", "--kernels", tmp_path / "mine.py",
                  "--reports", tmp_path)
    assert out.returncode == 2 and "mine.py" in out.stderr, out.stderr[-1500:]


def test_a_kernel_exception_with_a_huge_message_is_clipped_in_its_row():
    from verify.running import runner
    try:
        raise ValueError("x" * (50 << 20))
    except ValueError as exc:
        text = runner._error_text(exc)
    assert len(text) < 3 * runner.MESSAGE_CHARS and "more characters" in text


def test_runs_started_together_with_one_id_claim_the_folder_once(tmp_path):
    """The claim is atomic: of many runs started at once with one --run-id, exactly one
    runs; the others exit 2 with the used-folder message (before: the second took the
    folder the first had just made, and one run's FAILs were in no file)."""
    import subprocess
    import sys

    from helpers import REPO
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "verify.cli", "run", "--level", "L0", "--op", "lion",
           "--dtype", "fp32", "--backend", "torch", "-n", "0", "--reports", str(tmp_path),
           "--run-id", "same"]
    procs = [subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in outs)
    assert codes == [0, 2, 2, 2], outs
    assert all("already holds a run" in err for code, err in outs if code == 2)
    assert (tmp_path / "same" / "results.json").exists()


def test_reserving_one_id_from_many_threads_gives_it_to_one(tmp_path):
    import threading

    from verify.report import results
    won, lost = [], []

    def claim():
        try:
            won.append(results.reserve_run_dir(tmp_path, "race"))
        except ConfigError:
            lost.append(1)

    threads = [threading.Thread(target=claim) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 15
    empty = tmp_path / "made-by-ci"
    empty.mkdir()
    assert results.reserve_run_dir(tmp_path, "made-by-ci") == empty  # an empty folder: free


@pytest.mark.parametrize("entry, words", [
    ({"params": {"lr": "x"}}, "param 'lr' of op 'lion' must be a number"),
    ({"inputs": {"labels": {"dist": "randint", "low": 5, "high": 5}}},
     "randint needs low < high"),
    ({"inputs": {"labels": {"dist": "randint", "low": 0, "high": "nope.1"}}},
     "'nope.1' names no input"),
])
def test_values_the_schema_cannot_check_are_usage_errors(tmp_path, entry, words):
    """Before: run-time ERROR rows; now exit 2 naming the file, the case and the field."""
    from verify.cases.case import load_file
    from helpers import write_cases
    op = "fused_cross_entropy" if "labels" in str(entry) else "lion"
    path = write_cases(tmp_path / "cases", {"op": op, "levels": {"L0": [
        {"id": "bad", "shape": [4, 16], "dtype": "fp32", **entry}]}})
    with pytest.raises(ConfigError) as err:
        load_file(path)
    text = str(err.value)
    assert words in text and str(path) in text and "bad" in text, text
