"""Case files: JSON Schema validation, op-aware checks, and sweep expansion into Cases.

A file holds the levels of one op. Every error names the file, the case id and the JSON
path of the bad value; a bad file is a configuration error (exit 2).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from verify.comparator import dtypes as dt
from verify.specs import registry
from verify.comparator import standards
from verify.errors import CaseFileError, ConfigError


@dataclass(frozen=True)
class Case:
    op: str
    id: str
    level: str
    dtype: str
    main_shape: tuple[int, ...]
    input_shapes: dict[str, tuple[int, ...]]
    input_dtypes: dict[str, Any]  # torch dtypes
    params: dict[str, Any]  # the case's params merged over the op's defaults
    seed: int
    dists: dict[str, dict]
    steps: int = 1
    standard: dict | None = None
    tags: tuple[str, ...] = ()
    expect_error: str | None = None
    file: str = ""
    json_path: str = ""
    description: str = ""
    case_params: dict = field(default_factory=dict)  # only those the file set
    mode: str = "forward"  # forward | backward | both
    views: tuple = ()  # slices of an output judged by a standard of their own
    source: Any = None  # a recorded call (verify/recorded.py): inputs come from its tensors

    @property
    def forward(self) -> bool:
        return self.mode in ("forward", "both")

    @property
    def backward(self) -> bool:
        return self.mode in ("backward", "both")

    @property
    def shape_str(self) -> str:
        return shape_str(self.main_shape)

    def canonical(self, contents: bool = True) -> dict:
        """What the golden depends on (no kernel-only fields, no ids or tags); a backward
        case's golden holds the gradients too. ``contents=False``: a recorded input's
        content hash is left out (not computed)."""
        out = {
            "op": self.op,
            "shapes": {k: list(v) for k, v in sorted(self.input_shapes.items())},
            "dtypes": {k: dt.name_of(v) for k, v in sorted(self.input_dtypes.items())},
            "params": {k: self.params[k] for k in sorted(self.params)},
            "seed": self.seed,
            "dists": {k: self._dist(k) if contents else self.dists[k]
                      for k in sorted(self.dists)},
            "steps": self.steps,
        }
        if self.backward:
            out["backward"] = True
        return out

    def _dist(self, name: str) -> dict:
        """A recorded input's content hash is taken when the key is first asked for
        (verify/recorded.py: indexing reads no tensor data)."""
        d = self.dists[name]
        if d.get("dist") == "recorded" and not d.get("sha") and self.source is not None:
            return {**d, "sha": self.source.digest(tuple(self.input_shapes))}
        return d

    def golden_key(self, golden_version: str) -> str:
        blob = json.dumps({"case": self.canonical(), "golden": golden_version},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def shape_str(shape) -> str:
    return "x".join(str(s) for s in shape) if len(shape) else "scalar"


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    text = resources.files("verify.cases").joinpath("schema/cases.schema.json").read_text()
    return json.loads(text)


def _json_path(parts) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _case_id_at(doc: dict, parts) -> str | None:
    parts = list(parts)
    if len(parts) >= 3 and parts[0] == "levels" and isinstance(parts[2], int):
        try:
            case = doc["levels"][parts[1]][parts[2]]
            return case.get("id") if isinstance(case, dict) else None
        except (KeyError, IndexError, TypeError):
            return None
    return None


MAX_FILE_BYTES = 16 << 20      # a case file is hand-written JSON, not data
MAX_CASES_PER_ENTRY = 10_000   # what one entry's lists may expand to
MAX_CASES_PER_FILE = 50_000
MAX_ELEMENTS = 1 << 40         # per input: beyond any device's memory


def read_json(path: str | Path):
    """The JSON document of a case file. Only a regular file of at most MAX_FILE_BYTES is
    read (a FIFO would block, /dev/zero never ends); bad UTF-8, bad JSON, nesting too
    deep and integers too long are CaseFileErrors naming the file."""
    path = Path(path)
    fname = str(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise CaseFileError(fname, "not a regular file (a folder, FIFO, device or socket); "
                                       "case files are plain JSON files")
        if info.st_size > MAX_FILE_BYTES:
            raise CaseFileError(fname, f"{info.st_size} bytes: larger than a case file may be "
                                       f"({MAX_FILE_BYTES >> 20} MiB)")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise CaseFileError(fname, f"cannot read: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise CaseFileError(fname, f"not UTF-8: byte 0x{data[exc.start]:02x} at offset "
                                   f"{exc.start} (line {line})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaseFileError(fname, f"invalid JSON: {exc.msg} (line {exc.lineno}, "
                                   f"column {exc.colno})") from None
    except RecursionError:
        raise CaseFileError(fname, "invalid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of thousands of digits, say
        raise CaseFileError(fname, f"invalid JSON: {exc}") from None


def load_file(path: str | Path) -> list[Case]:
    path = Path(path)
    fname = str(path)
    doc = read_json(path)
    validator = jsonschema.Draft202012Validator(schema())
    try:
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    except RecursionError:
        raise CaseFileError(fname, "nested too deeply to validate") from None
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        parts = list(err.absolute_path)
        raise CaseFileError(fname, err.message, _case_id_at(doc, parts), _json_path(parts))
    try:
        spec = registry.op(doc["op"])
    except ConfigError as exc:
        raise CaseFileError(fname, str(exc), None, "$.op") from None
    defaults = doc.get("defaults", {})
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for level, entries in doc["levels"].items():
        for i, raw in enumerate(entries):
            where = f"$.levels.{level}[{i}]"
            merged = _merge(defaults, raw)
            try:
                for case in _expand(spec, merged, level, fname, where):
                    key = f"{level}-{case.id}"
                    if key in seen:
                        raise CaseFileError(fname, f"duplicate case id '{case.id}' in {level} "
                                                   f"(also at {seen[key]})", raw.get("id"), where)
                    seen[key] = where
                    cases.append(case)
                    if len(cases) > MAX_CASES_PER_FILE:
                        raise CaseFileError(fname, f"expands to more than {MAX_CASES_PER_FILE} "
                                                   f"cases; split the sweeps over files",
                                            raw.get("id"), where)
            except ConfigError:
                raise
            except Exception as exc:  # a combination no check above foresaw: still exit 2
                raise CaseFileError(fname, f"cannot expand this case: {type(exc).__name__}: "
                                           f"{exc}", merged.get("id"), where) from None
    return cases


def _merge(defaults: dict, case: dict) -> dict:
    out = dict(defaults)
    for k, v in case.items():
        if k in ("params", "inputs", "dims", "dtypes", "shapes") and k in out:
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def _as_list(value, is_single) -> list:
    return [value] if is_single(value) else list(value)


def _expand(spec: registry.OpSpec, raw: dict, level: str, fname: str, where: str):
    cid = raw["id"]

    def fail(msg, sub=""):
        raise CaseFileError(fname, msg, cid, where + sub)

    for name in raw.get("params", {}):
        if name not in spec.params:
            fail(f"op '{spec.name}' has no param '{name}' (params: "
                 f"{', '.join(spec.params) or 'none'})", f".params.{name}")
    upstream_names = {f"grad_{o.name}" for o in spec.outputs} if spec.grads else set()
    for key in ("inputs", "shapes", "dtypes"):
        for name in raw.get(key, {}):
            if name not in spec.input_names and not (key == "inputs" and name in upstream_names):
                extra = (f"; upstream gradients: {', '.join(sorted(upstream_names))}"
                         if key == "inputs" and upstream_names else "")
                fail(f"op '{spec.name}' has no input '{name}' (inputs: "
                     f"{', '.join(spec.input_names)}{extra})", f".{key}.{name}")
    for name, dist in raw.get("inputs", {}).items():
        if dist.get("dist") == "none" and name in spec.input_names \
                and not spec.input(name).optional:
            fail(f"input '{name}' of op '{spec.name}' is required; only optional inputs "
                 f"may be left out with dist 'none'", f".inputs.{name}.dist")
    mode = raw.get("mode", "both" if spec.grads else "forward")
    if mode != "forward" and spec.grads is None:
        fail(f"op '{spec.name}' declares no gradients, so it has no backward to verify",
             ".mode")
    expect_error = raw.get("expect_error")
    dtypes = _as_list(raw.get("dtype", spec.dtypes[0]), lambda v: isinstance(v, str))
    for j, name in enumerate(dtypes):
        canon = dt.canonical_name(name)
        if canon not in spec.dtypes and not expect_error:
            fail(f"dtype '{name}' is not supported by op '{spec.name}' (supported: "
                 f"{', '.join(spec.dtypes)})", ".dtype" if len(dtypes) == 1 else f".dtype[{j}]")
    std = raw.get("standard")
    if std is not None:
        _check_standard(std, spec, fail)
    for name, dist in raw.get("inputs", {}).items():
        if dist.get("dist") == "argmax" and dist["of"] not in spec.input_names:
            fail(f"'of' names no input of op '{spec.name}' (inputs: "
                 f"{', '.join(spec.input_names)})", f".inputs.{name}.of")
    known_outputs = spec.output_names + spec.grad_outputs()
    for j, view in enumerate(raw.get("views", [])):
        if view["output"] not in known_outputs:
            fail(f"op '{spec.name}' has no output '{view['output']}' (outputs: "
                 f"{', '.join(known_outputs)})", f".views[{j}].output")
        if view["at"] not in spec.input_names:
            fail(f"'at' must name an integer input of op '{spec.name}' holding indices into "
                 f"the output's last dim (inputs: {', '.join(spec.input_names)})",
                 f".views[{j}].at")
        if "standard" in view:
            _check_standard(view["standard"], spec, lambda m, sub="": fail(
                m, f".views[{j}]" + sub.replace(".standard", ".standard", 1)))
    steps = int(raw.get("steps", 1))
    if steps > 1 and not spec.feedback:
        fail(f"op '{spec.name}' declares no feedback of outputs into inputs, so it cannot "
             f"run several steps", ".steps")
    if steps > 1 and mode != "forward":
        fail("a backward case runs one step; set mode 'forward' or steps 1", ".mode")
    if expect_error:
        mode = "forward"

    if "shape" in raw:
        shape_v = raw["shape"]
        shapes = [shape_v] if not shape_v or not isinstance(shape_v[0], list) else shape_v
    elif "shapes" in raw:
        first = next((n for n in spec.input_names if n in raw["shapes"]), None)
        if first is None:
            fail(f"'shapes' gives no input's shape (inputs: {', '.join(spec.input_names)}); "
                 f"give 'shape' or the shape of an input", ".shapes")
        shapes = [raw["shapes"][first]]
    else:
        fail("a case needs 'shape' (or 'shapes' per input)", "")
    dims = raw.get("dims", {})
    dim_names = sorted(dims)
    dim_values = [_as_list(dims[n], lambda v: isinstance(v, int)) for n in dim_names]
    param_sweeps = {k: v for k, v in raw.get("params", {}).items() if isinstance(v, list)}
    fixed_params = {k: v for k, v in raw.get("params", {}).items() if not isinstance(v, list)}
    sweep_names = list(param_sweeps)
    if not raw.get("nonfinite_params"):
        for k, v in raw.get("params", {}).items():
            if any(isinstance(x, float) and not math.isfinite(x)
                   for x in (v if isinstance(v, list) else [v])):
                fail(f"param '{k}' is NaN or infinite; a kernel returning NaN everywhere "
                     f"could pass such a case. Set \"nonfinite_params\": true on a case "
                     f"that means it", f".params.{k}")
    total = len(dtypes) * len(shapes) * math.prod(len(v) for v in dim_values) * math.prod(
        len(v) for v in param_sweeps.values())
    if total > MAX_CASES_PER_ENTRY:
        fail(f"expands to {total} cases (dtypes x shapes x dims x param lists); at most "
             f"{MAX_CASES_PER_ENTRY} per entry: split it, or sweep fewer values")

    for dtype_name, shape_t, dim_combo, pvals in itertools.product(
            dtypes, shapes, itertools.product(*dim_values),
            itertools.product(*(param_sweeps[k] for k in sweep_names))):
        dim_map = dict(zip(dim_names, dim_combo))
        main = _resolve(shape_t, dim_map, fail, ".shape")
        lo, hi = spec.ranks
        if not lo <= len(main) <= hi and not expect_error:
            fail(f"op '{spec.name}' takes {lo}..{hi}-D shapes, got {list(main)}", ".shape")
        in_shapes = {n: spec.input(n).shape_for(main) for n in spec.input_names}
        for n, templ in raw.get("shapes", {}).items():
            in_shapes[n] = _resolve(templ, dim_map, fail, f".shapes.{n}")
        for n, sh in in_shapes.items():
            if math.prod(sh) > MAX_ELEMENTS:
                fail(f"input '{n}' would hold {math.prod(sh)} elements (shape {list(sh)}): "
                     f"more than {MAX_ELEMENTS}", ".shape")
        canon = dt.canonical_name(dtype_name)
        in_dtypes = {n: spec.input_dtype(n, canon) for n in spec.input_names}
        for n, dname in raw.get("dtypes", {}).items():
            in_dtypes[n] = dt.to_torch(dname)
        case_params = {**fixed_params, **dict(zip(sweep_names, pvals))}
        params = {**spec.params, **case_params}
        if not expect_error:  # what the schema cannot know: the op's own param types
            for k, v in case_params.items():
                problem = _param_type_problem(spec.params.get(k), v)
                if problem:
                    fail(f"param '{k}' of op '{spec.name}' {problem}", f".params.{k}")
        dists = {n: raw.get("inputs", {}).get(n, spec.input(n).dist) for n in spec.input_names}
        dists.update({n: d for n, d in raw.get("inputs", {}).items() if n in upstream_names})
        for n in spec.input_names:  # explicit values and left-out inputs fix the shape
            if dists[n]["dist"] == "given":
                declared = in_shapes[n]
                in_shapes[n] = _given_shape(dists[n], fail, f".inputs.{n}")
                # a required input's values must fill the shape the op gives it (optional
                # ones such as cu_seqlens are as long as their values)
                if not expect_error and not spec.input(n).optional \
                        and n not in raw.get("shapes", {}) \
                        and math.prod(in_shapes[n]) != math.prod(declared):
                    fail(f"input '{n}' of op '{spec.name}' takes {math.prod(declared)} "
                         f"values (shape {list(declared)} for this case), the case gives "
                         f"{math.prod(in_shapes[n])}", f".inputs.{n}.values")
            elif dists[n]["dist"] == "none":
                in_shapes[n] = ()
        if not expect_error:
            for n in spec.input_names:
                _check_bounds(dists[n], in_shapes, fail, f".inputs.{n}")
        suffix = [canon, shape_str(main)]
        in_main = {d for d in shape_t if isinstance(d, str)}
        suffix += [f"{k}={v}" for k, v in dim_map.items()  # dims of other inputs' shapes
                   if k not in in_main and isinstance(dims[k], list) and len(dims[k]) > 1]
        suffix += [f"{k}={_fmt(v)}" for k, v in zip(sweep_names, pvals)]
        yield Case(
            op=spec.name, id="-".join([cid] + suffix), level=level, dtype=canon,
            main_shape=main, input_shapes=in_shapes, input_dtypes=in_dtypes, params=params,
            seed=int(raw.get("seed", 0)), dists=dists, steps=steps,
            standard=std, tags=tuple(raw.get("tags", ())), expect_error=expect_error,
            file=fname, json_path=where, description=raw.get("description", ""),
            case_params=case_params, mode=mode, views=tuple(raw.get("views", ())),
        )


def _param_type_problem(default, value) -> str:
    """'' when ``value`` is of the kind the op's default is (a number for a number, a
    bool for a bool, a string for a string); else what is wrong. A default of None takes
    anything."""
    if default is None or value is None:
        return ""
    number = (int, float)
    if isinstance(default, bool):
        return "" if isinstance(value, bool) else f"must be true or false, not {value!r}"
    if isinstance(default, number):
        if isinstance(value, bool) or not isinstance(value, number):
            return f"must be a number (default {default!r}), not {value!r}"
        return ""
    if isinstance(default, str) and not isinstance(value, str):
        return f"must be a string (default {default!r}), not {value!r}"
    return ""


def _check_bounds(dist, shapes, fail, where) -> None:
    """A bound naming another input's axis ('logits.1') must name one, and a randint's
    low must stay below its high (checked here, not as an ERROR row at run time)."""
    if not isinstance(dist, dict):
        return
    resolved = {}
    for key in ("low", "high", "total", "chunk"):
        v = dist.get(key)
        if isinstance(v, str) and "." in v:
            other, axis = v.rsplit(".", 1)
            if other not in shapes:
                fail(f"'{v}' names no input ('{other}' is not one of "
                     f"{', '.join(sorted(shapes))})", f"{where}.{key}")
            if not axis.lstrip("-").isdigit() or not -len(shapes[other]) <= int(axis) \
                    < len(shapes[other]):
                fail(f"'{v}': input '{other}' has {len(shapes[other])} axes", f"{where}.{key}")
            resolved[key] = shapes[other][int(axis)]
        elif isinstance(v, str):
            fail(f"'{v}' is neither a number nor '<input>.<axis>'", f"{where}.{key}")
        else:
            resolved[key] = v
    if dist.get("dist") == "randint":
        low, high = resolved.get("low", 0), resolved.get("high")
        if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low >= high:
            fail(f"randint needs low < high, got low {low} and high {high}", f"{where}.high")
    if isinstance(dist.get("base"), dict):
        _check_bounds(dist["base"], shapes, fail, f"{where}.base")


def _given_shape(dist, fail, where) -> tuple[int, ...]:
    """Explicit values fix their input's shape: nested lists, or flat values with a
    ``shape`` (their count must match)."""
    from verify.specs.inputs import given_shape
    try:
        shape = given_shape(dist)
    except ValueError:
        fail("explicit values must nest evenly (every row of one length)", f"{where}.values")
    flat = _count(dist["values"])
    if flat != math.prod(shape):
        fail(f"{flat} explicit values do not fill shape {list(shape)}", f"{where}.shape")
    return shape


def _count(values) -> int:
    return sum(_count(v) for v in values) if isinstance(values, list) else 1


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _resolve(template, dim_map, fail, sub) -> tuple[int, ...]:
    out = []
    for j, d in enumerate(template):
        if isinstance(d, str):
            if d not in dim_map:
                fail(f"named dim '{d}' has no value in 'dims'", f"{sub}[{j}]")
            out.append(int(dim_map[d]))
        else:
            out.append(int(d))
    return tuple(out)


def _check_standard(std, spec, fail):
    entries = [("", std)]
    if isinstance(std, dict):
        known = spec.output_names + spec.grad_outputs()
        for out_name, sub in std.get("outputs", {}).items():
            if out_name not in known:
                fail(f"op '{spec.name}' has no output '{out_name}' (outputs: "
                     f"{', '.join(known)})", f".standard.outputs.{out_name}")
            entries.append((f".outputs.{out_name}", sub))
    for sub_path, entry in entries:
        name = entry if isinstance(entry, str) else entry.get("name")
        if name is None:
            continue
        if name not in standards.STANDARDS:
            fail(f"unknown standard '{name}' (known: {', '.join(sorted(standards.STANDARDS))})",
                 f".standard{sub_path}" + ("" if isinstance(entry, str) else ".name"))


def load_dir(directory: str | Path, ops=None) -> list[Case]:
    """Every case file of a folder (``<op>.json``), or only those of ``ops``."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"cases folder '{directory}' does not exist")
    files = sorted(directory.glob("*.json"))
    if not files:
        raise ConfigError(f"cases folder '{directory}' holds no *.json case files")
    out: list[Case] = []
    for f in files:
        if ops is not None and f.stem not in ops:
            # peek at the op name: the file name is a convention, not a contract
            try:
                op_name = read_json(f).get("op")
            except (ConfigError, AttributeError):
                op_name = None
            if op_name not in ops:
                continue
        out.extend(load_file(f))
    return out
