"""CI sharding: --shard I/N deals every item of a selection to exactly one shard, balanced
by expected cost and the same on every machine; verify merge of the shards gives the
unsharded run's rows, and refuses shards that do not belong together."""
import json
from types import SimpleNamespace

import pytest

from verify.cases import shards
from verify.errors import ConfigError

from helpers import run_cli


def _items(n):
    case = lambda i: SimpleNamespace(input_shapes={"x": (i % 7 + 1, 64 * (i % 5 + 1))},
                                     steps=1 + i % 3, mode="forward")
    return [(case(i), SimpleNamespace(id=f"k{i}")) for i in range(n)]


def _name(case, kern):
    return kern.id


def test_every_item_lands_in_exactly_one_balanced_shard():
    items = _items(101)
    parts = [shards.pick(items, i, 4, _name) for i in range(1, 5)]
    names = [_name(*it) for part in parts for it in part]
    assert sorted(names) == sorted(_name(*it) for it in items) and len(set(names)) == 101
    loads = [sum(shards.expected_cost(*it) for it in part) for part in parts]
    biggest = max(shards.expected_cost(*it) for it in items)
    assert max(loads) - min(loads) <= biggest  # greedy largest-first: within one item
    assert parts == [shards.pick(list(items), i, 4, _name) for i in range(1, 5)]  # same deal


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "x", "1/2/3", ""])
def test_bad_shards_are_refused(text):
    with pytest.raises(ConfigError, match="I/N"):
        shards.parse(text)


SELECTION = ("--level", "L0", "--op", "lion", "--op", "sgd_momentum", "--backend", "torch",
             "--dtype", "fp32", "-n", "0")


def _rows(run_dir):
    rows = json.loads((run_dir / "results.json").read_text())["rows"]
    keep = ("verdict", "mere", "mare", "max_abs", "rmse", "eb", "inputs_sha", "reason")
    return {(r["op"], r["case_id"], r["kernel"], r["output"]): tuple(r[k] for k in keep)
            for r in rows}


def test_shards_cover_the_selection_and_merge_into_the_unsharded_run(tmp_path):
    store = tmp_path / "store"
    for run_id, extra in (("all", ()), ("s1", ("--shard", "1/3")), ("s2", ("--shard", "2/3")),
                          ("s3", ("--shard", "3/3"))):
        out = run_cli("run", *SELECTION, *extra, "--reports", tmp_path, "--run-id", run_id,
                      "--store", store)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    whole = _rows(tmp_path / "all")
    parts = [_rows(tmp_path / f"s{k}") for k in (1, 2, 3)]
    assert all(parts) and sum(len(p) for p in parts) == len(whole)
    assert {k: v for p in parts for k, v in p.items()} == whole
    out = run_cli("merge", *(tmp_path / f"s{k}" for k in (1, 2, 3)), "--out", tmp_path / "m")
    assert out.returncode == 0, out.stderr
    assert _rows(tmp_path / "m") == whole
    for name in ("results.csv", "report.html", "junit.xml"):
        assert (tmp_path / "m" / name).stat().st_size > 0

    # refusals: a shard missing, a shard twice, a run of another selection
    out = run_cli("merge", tmp_path / "s1", tmp_path / "s2", "--out", tmp_path / "x1")
    assert out.returncode == 2 and "3/3 missing" in out.stderr
    out = run_cli("merge", tmp_path / "s1", tmp_path / "s1", tmp_path / "s2", tmp_path / "s3",
                  "--out", tmp_path / "x2")
    assert out.returncode == 2 and "given twice" in out.stderr
    other = run_cli("run", "--level", "L0", "--op", "lion", "--backend", "torch", "--dtype",
                    "fp32", "-n", "0", "--shard", "3/3", "--reports", tmp_path, "--run-id",
                    "o3", "--store", store)
    assert other.returncode == 0, other.stderr[-2000:]
    out = run_cli("merge", tmp_path / "s1", tmp_path / "s2", tmp_path / "o3",
                  "--out", tmp_path / "x3")
    assert out.returncode == 2 and "different selections" in out.stderr, out.stderr
    import shutil
    shutil.copytree(tmp_path / "s3", tmp_path / "s3b")
    doc = json.loads((tmp_path / "s3b" / "results.json").read_text())
    doc["meta"]["harness"] = "0.0.1+000000000000"
    (tmp_path / "s3b" / "results.json").write_text(json.dumps(doc))
    out = run_cli("merge", tmp_path / "s1", tmp_path / "s2", tmp_path / "s3b",
                  "--out", tmp_path / "x4")
    assert out.returncode == 2 and "different harness versions" in out.stderr, out.stderr


def test_a_shard_with_nothing_to_run_writes_an_empty_report_that_merges(tmp_path):
    """A CI matrix keeps its N when the selection shrinks: a shard left with no case (more
    shards than cases, or -k deselecting its share) passes with an empty report, and the
    merge of all shards holds exactly the selection's rows."""
    one_case = ("--level", "L0", "--op", "lion", "--backend", "torch", "--dtype", "fp32",
                "-k", "small and 8x8", "-n", "0", "--store", tmp_path / "store")
    outs = [run_cli("run", *one_case, "--shard", f"{k}/4", "--reports", tmp_path,
                    "--run-id", f"s{k}") for k in (1, 2, 3, 4)]
    assert [o.returncode for o in outs] == [0, 0, 0, 0], [o.stderr[-500:] for o in outs]
    assert sum("has no case to run" in o.stderr for o in outs) == 3
    out = run_cli("merge", *(tmp_path / f"s{k}" for k in (1, 2, 3, 4)), "--out", tmp_path / "m")
    assert out.returncode == 0, out.stderr
    assert len(_rows(tmp_path / "m")) == 2  # lion small-fp32-8x8: w_new and exp_avg_new
