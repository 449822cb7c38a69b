"""Case files: schema validation, clear errors, sweep expansion."""
import json

import pytest

from verify.cases import case as cases
from verify.errors import CaseFileError, ConfigError

from helpers import write_cases

GOOD = {"op": "sgd_momentum", "levels": {"L0": [
    {"id": "sweep", "shape": [[4, 8], [3, 5]], "dtype": ["fp32", "bf16"],
     "params": {"lr": [0.1, 0.01], "momentum": 0.5}, "seed": 3}]}}


def test_sweep_expands_to_product_with_readable_ids(tmp_path):
    got = cases.load_file(write_cases(tmp_path, GOOD))
    assert len(got) == 2 * 2 * 2
    ids = [c.id for c in got]
    assert "sweep-fp32-4x8-lr=0.1" in ids and "sweep-bf16-3x5-lr=0.01" in ids
    assert len(set(ids)) == len(ids)
    c = got[0]
    assert c.params["momentum"] == 0.5 and c.params["dampening"] == 0.0  # op default
    assert c.seed == 3 and c.level == "L0"


def test_named_dims_resolve_and_sweep(tmp_path):
    doc = {"op": "apply_adam_w_v2", "levels": {"L1": [
        {"id": "tail", "shape": ["M", "K"], "dims": {"M": [31, 33], "K": [1023, 1025]}}]}}
    got = cases.load_file(write_cases(tmp_path, doc))
    assert sorted(c.main_shape for c in got) == [(31, 1023), (31, 1025), (33, 1023), (33, 1025)]
    assert all(c.input_shapes["m"] == c.main_shape for c in got)


def test_op_input_shape_rules(tmp_path):
    doc = {"op": "adafactor", "levels": {"L0": [{"id": "a", "shape": [6, 10]}]}}
    (c,) = cases.load_file(write_cases(tmp_path, doc))
    assert c.input_shapes["row_var"] == (6,) and c.input_shapes["col_var"] == (10,)


def _error(tmp_path, doc) -> CaseFileError:
    path = write_cases(tmp_path, doc, name="broken")
    with pytest.raises(CaseFileError) as info:
        cases.load_file(path)
    assert "broken.json" in str(info.value)
    return info.value


def test_schema_error_names_file_case_and_json_path(tmp_path):
    doc = {"op": "lion", "levels": {"L0": [{"id": "ok", "shape": [2, 2]},
                                           {"id": "bad_seed", "shape": [2, 2], "seed": -4}]}}
    err = _error(tmp_path, doc)
    assert err.case_id == "bad_seed"
    assert err.json_path == "$.levels.L0[1].seed"
    assert "bad_seed" in str(err) and "$.levels.L0[1].seed" in str(err)


def test_invalid_json_is_reported_with_line(tmp_path):
    err = _error(tmp_path, '{"op": "lion", "levels": {"L0": [ }')
    assert "invalid JSON" in str(err) and "line 1" in str(err)


def test_unknown_op(tmp_path):
    err = _error(tmp_path, {"op": "no_such_op", "levels": {"L0": [{"id": "a", "shape": [1]}]}})
    assert err.json_path == "$.op" and "unknown op 'no_such_op'" in str(err)


def test_unsupported_dtype_names_the_case(tmp_path):
    doc = {"op": "apply_adam_w_v2", "levels": {"L0": [
        {"id": "half", "shape": [4, 4], "dtype": ["fp32", "fp16"]}]}}
    err = _error(tmp_path, doc)
    assert err.case_id == "half" and err.json_path == "$.levels.L0[0].dtype[1]"
    assert "fp16" in str(err) and "supported: fp32, bf16" in str(err)


def test_unknown_param_and_input(tmp_path):
    err = _error(tmp_path, {"op": "lion", "levels": {"L0": [
        {"id": "p", "shape": [2, 2], "params": {"betaa": 0.1}}]}})
    assert err.json_path == "$.levels.L0[0].params.betaa"
    err = _error(tmp_path, {"op": "lion", "levels": {"L0": [
        {"id": "i", "shape": [2, 2], "inputs": {"gradd": {"dist": "zeros"}}}]}})
    assert err.json_path == "$.levels.L0[0].inputs.gradd"


def test_unknown_standard_and_missing_dim(tmp_path):
    err = _error(tmp_path, {"op": "lion", "levels": {"L0": [
        {"id": "s", "shape": [2, 2], "standard": "nearly"}]}})
    assert "unknown standard 'nearly'" in str(err)
    err = _error(tmp_path, {"op": "lion", "levels": {"L0": [{"id": "d", "shape": ["M", 4]}]}})
    assert err.json_path == "$.levels.L0[0].shape[0]" and "'M'" in str(err)


def test_duplicate_ids_and_wrong_rank(tmp_path):
    err = _error(tmp_path, {"op": "lion", "levels": {"L0": [
        {"id": "a", "shape": [2, 2]}, {"id": "a", "shape": [2, 2]}]}})
    assert "duplicate case id" in str(err)
    err = _error(tmp_path, {"op": "lion", "levels": {"L0": [{"id": "r", "shape": [2, 2, 2]}]}})
    assert "2..2-D" in str(err)


def test_distribution_needs_its_fields(tmp_path):
    err = _error(tmp_path, {"op": "lion", "levels": {"L0": [
        {"id": "u", "shape": [2, 2], "inputs": {"grad": {"dist": "uniform", "low": 0}}}]}})
    assert err.json_path.startswith("$.levels.L0[0].inputs.grad")


def test_defaults_merge_into_cases(tmp_path):
    doc = {"op": "lion", "defaults": {"seed": 9, "params": {"lr": 0.5}, "dtype": "bf16"},
           "levels": {"L0": [{"id": "a", "shape": [2, 2], "params": {"beta1": 0.7}}]}}
    (c,) = cases.load_file(write_cases(tmp_path, doc))
    assert (c.seed, c.dtype, c.params["lr"], c.params["beta1"]) == (9, "bf16", 0.5, 0.7)


def test_shipped_case_files_are_valid_and_cover_every_op():
    from verify.specs import registry
    all_cases = cases.load_dir(cases.Path(__file__).resolve().parent.parent / "test_cases")
    assert {c.op for c in all_cases} == set(registry.ops())
    for op in registry.ops():
        levels = {c.level for c in all_cases if c.op == op}
        assert {"L0", "L1", "L2"} <= levels, op
        l0_dtypes = {c.dtype for c in all_cases if c.op == op and c.level == "L0"
                     and not c.expect_error}
        assert l0_dtypes == set(registry.op(op).dtypes), op  # every dtype the op supports


def test_empty_folder_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError):
        cases.load_dir(tmp_path)


def test_schema_is_draft_2020_12_and_shipped_in_the_package():
    import jsonschema
    s = cases.schema()
    assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(s)
    assert json.loads(json.dumps(s)) == s
