"""Recorded calls as cases: msprobe dumps and verify.capture folders, judged or replayed.

A dump or capture folder is a case source like a case file (``--cases DIR``). Each
recorded call of a bound API (verify/bindings.py) becomes a Case of level "recorded",
id = the record's name, whose inputs are the recorded tensors and whose golden key is
their content: the same call twice (same inputs by content) is one case with a count.
Under the "recorded" backend the kernel outputs are the recorded outputs (``verify
judge``); under any other backend the user's kernel runs on the recorded inputs (a
replay). Calls no op binds, calls a binding does not cover and backward records that are
not what they claim are collected in a NotJudged list, never dropped silently.

Indexing reads dump.json record by record and no tensor data: calls are told apart by
dump.json's summaries of their tensors, and only calls alike in all of them are hashed.
A case's golden key holds its inputs' content hash, taken when it loads them to run.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from blake3 import blake3

from verify.specs import bindings
from verify.specs import registry
from verify.comparator import dtypes as dt
from verify.cases import msprobe_dump as md
from verify.specs.bindings import NotCovered, NotJudged
from verify.cases.case import Case
from verify.errors import ConfigError

LEVEL = "recorded"
BACKEND = "recorded"
CAPTURE_INDEX = "calls.jsonl"  # a capture folder's records, one JSON object per line


@dataclass(frozen=True)
class RecordSource:
    """Where a recorded case comes from, and what its call was (tensors as TensorRefs)."""

    kind: str  # "msprobe" | "capture"
    record: str  # "Functional.rms_norm.0.forward"
    api: str  # "Functional.rms_norm"
    binding: str
    step: int | None
    rank: int | None
    module: str
    device: str  # where it ran: npu, cuda, cpu, ...
    args: tuple
    kwargs: tuple  # (name, value) pairs
    outputs: tuple  # recorded outputs; of a backward record: the inputs' gradients
    upstream: tuple | None = None  # a backward record's incoming gradients
    error: str = ""  # the record cannot be judged as it is: an ERROR row says why
    calls: int = 1  # identical calls (same inputs by content) judged by this one
    same: tuple = ()  # their record names
    dump: str = ""  # the dump.json / calls.jsonl it was read from
    outputs_sha: str = ""  # what the call returned: calls alike in inputs AND outputs are one

    def digest(self, names) -> str:
        """The golden key's content hash: the op inputs' fingerprint (``names``: the
        case's inputs), and a backward record's upstream. Taken when the case loads its
        tensors to run (``inputs``), or from the files when a key is asked for first
        (a Ray driver grouping goldens)."""
        if self.error:
            return ""
        key = _memo_key(self)
        if key not in _DIGESTS:
            args, kwargs = _load(list(self.args)), _load(dict(self.kwargs))
            ins, _ = bindings.adapt(_binding_of(self), args, kwargs)
            _remember_digest(self, {n: ins.get(n) for n in names})
        return _DIGESTS[key]

    def inputs(self, case: Case) -> dict:
        """The case's inputs: its recorded tensors (specs.inputs.make_inputs asks)."""
        return inputs(case)

    def upstream_of(self, case: Case) -> dict:
        return upstream(case)

    def input_refs(self) -> list[md.TensorRef]:
        return _refs(list(self.args)) + _refs(dict(self.kwargs)) + (
            _refs(list(self.upstream)) if self.upstream is not None else [])


# a record (and its files as they are now) -> the golden key's content hash / the op
# inputs' fingerprint, once per process (the inputs are hashed once: the fingerprint is
# the inputs_sha column too)
_DIGESTS: dict[tuple, str] = {}
_FINGERPRINTS: dict[tuple, str] = {}


def _memo_key(src: RecordSource) -> tuple:
    """A record, and its tensor files' sizes and times: a file rewritten in place is
    hashed again."""
    stats = []
    for r in src.input_refs():
        try:
            st = os.stat(r.path)
            stats.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append(None)
    return (src.dump, src.record, tuple(stats))


def _remember_digest(src: RecordSource, op_inputs: dict) -> None:
    from verify.specs.inputs import fingerprint
    fp = fingerprint(op_inputs)
    ups = _refs(list(src.upstream)) if src.upstream is not None else []
    key = _memo_key(src)
    _FINGERPRINTS[key] = fp
    _DIGESTS[key] = fp + ("|" + _content_hash(ups) if ups else "")


def fingerprint(case: Case) -> str:
    """The inputs_sha of a recorded case whose inputs were loaded (``inputs``)."""
    src = case.source
    key = _memo_key(src)
    if key not in _FINGERPRINTS:
        src.digest(tuple(case.input_shapes))
    return _FINGERPRINTS[key]


def is_recorded_source(path: str | os.PathLike) -> bool:
    p = Path(path)
    if p.is_dir() and (p / CAPTURE_INDEX).is_file():
        return True
    if p.is_file() and p.name == CAPTURE_INDEX:
        return True
    return md.is_dump(p)


# -- reading the records -------------------------------------------------------------
@dataclass
class CallRecord:
    name: str
    api: str
    direction: str
    args: list
    kwargs: dict
    outputs: list
    step: int | None = None
    rank: int | None = None
    module: str = ""
    device: str = ""
    dump: str = ""


def _msprobe_calls(path, not_judged: NotJudged):
    """CallRecords of an msprobe dump, forward and backward, in file order."""
    for dump in md.dump_files(path):
        data_dir = md.data_dir(dump)
        parents = md.construct(dump)
        device = "npu" if md.ran_on_npu(dump) else None
        for rec in md.records(dump):
            if rec.direction == "module":
                not_judged.add(rec.api + ".*", "module-level record: the calls inside the "
                                               "module are judged")
                continue
            if device is None:
                device = "npu" if rec.api.startswith("NPU.") else None
            body = rec.body
            try:
                if rec.direction == "forward":
                    args = md.decode(body.get("input_args") or [], data_dir)
                    kwargs = md.decode(body.get("input_kwargs") or {}, data_dir)
                    outputs = md.decode(body.get("output"), data_dir)
                else:
                    args = md.decode(body.get("input") or [], data_dir)  # upstream grads
                    kwargs = {}
                    outputs = md.decode(body.get("output"), data_dir)  # the inputs' grads
            except (ValueError, KeyError, TypeError) as exc:
                yield CallRecord(rec.name, rec.api, rec.direction, [], {}, [],
                                 dump.step, dump.rank, dump=dump.path,
                                 device=f"error: {dump.path}: record {rec.name}: {exc}")
                continue
            outputs = outputs if isinstance(outputs, list) else [outputs]
            yield CallRecord(rec.name, rec.api, rec.direction, list(args), dict(kwargs),
                             outputs, dump.step, dump.rank, parents.get(rec.name, ""),
                             device or dump.framework, dump.path)


def _capture_calls(path, not_judged: NotJudged):
    p = Path(path)
    index = p if p.is_file() else p / CAPTURE_INDEX
    root = index.parent
    with open(index, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{index}:{lineno}: not JSON ({exc}): the capture was cut "
                                  f"short; the records before this line are whole") from None
            if entry.get("note") == "limit":
                not_judged.add(entry.get("api", "(capture)"), entry.get("reason", "limit"),
                               int(entry.get("count", 1)))
                continue
            try:
                yield CallRecord(
                    entry["record"], entry["api"], entry.get("direction", "forward"),
                    _capture_decode(entry.get("args", []), root),
                    _capture_decode(entry.get("kwargs", {}), root),
                    _capture_decode(entry.get("outputs", []), root),
                    entry.get("step"), entry.get("rank"), entry.get("module", ""),
                    entry.get("device", "cpu"), str(index))
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{index}:{lineno}: a capture record without {exc}") \
                    from None


def _capture_decode(value, root: Path):
    if isinstance(value, list):
        return [_capture_decode(v, root) for v in value]
    if isinstance(value, dict):
        if value.get("type") == "tensor":
            blob = value["blob"]
            return md.TensorRef(str(root / "blobs" / blob[:2] / f"{blob}.safetensors"),
                                value["dtype"], tuple(value["shape"]))
        if value.get("type") == "tuple":
            return tuple(_capture_decode(v, root) for v in value["items"])
        if value.get("type") == "dtype":
            return getattr(torch, value["name"])
        return {k: _capture_decode(v, root) for k, v in value.items()}
    return value


# -- tensors of a record -------------------------------------------------------------
def _walk(value, fn):
    if isinstance(value, md.TensorRef):
        return fn(value)
    if isinstance(value, list):
        return [_walk(v, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(_walk(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _walk(v, fn) for k, v in value.items()}
    return value


def _refs(value) -> list[md.TensorRef]:
    out: list[md.TensorRef] = []
    _walk(value, lambda r: out.append(r))
    return out


def _content_hash(refs: list[md.TensorRef]) -> str:
    """BLAKE3 of the tensors' dtypes, shapes and bytes; a capture blob's name already is."""
    h = blake3(max_threads=blake3.AUTO)
    for ref in refs:
        h.update(f"{ref.dtype}|{ref.shape}|".encode())
        if ref.exact:
            h.update(Path(ref.path).stem.encode())
            continue
        t = ref.load(mmap=True).contiguous()
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()[:32]


def _judged(value) -> tuple[torch.Tensor, torch.dtype]:
    """An outputs adapter's value: a tensor, or (values, the dtype they are judged in)."""
    if isinstance(value, tuple):
        return value[0], value[1]
    return value, value.dtype


def _tensor_args(args: list, kwargs: dict) -> list[tuple[str, Any]]:
    """(where, value) of every top-level tensor argument, positional first."""
    out = [(f"arg{i}", a) for i, a in enumerate(args) if isinstance(a, (md.TensorRef,
                                                                        torch.Tensor))]
    out += [(k, v) for k, v in kwargs.items() if isinstance(v, (md.TensorRef, torch.Tensor))]
    return out


def _with_grads(args: list, kwargs: dict, grads: list) -> tuple[list, dict]:
    """The call's arguments with each tensor argument replaced by its gradient."""
    places = _tensor_args(args, kwargs)
    args, kwargs = list(args), dict(kwargs)
    for (where, _), g in zip(places, grads):
        if where.startswith("arg"):
            args[int(where[3:])] = g
        else:
            kwargs[where] = g
    return args, kwargs


# -- records -> cases ----------------------------------------------------------------
@dataclass
class Index:
    cases: list[Case]
    not_judged: NotJudged
    records: int = 0
    sources: list[str] = dataclasses.field(default_factory=list)


def _dtype_of(spec, inputs: dict) -> str | None:
    for i in spec.inputs:
        t = inputs.get(i.name)
        if i.dtype == registry.WORKING and isinstance(t, torch.Tensor) \
                and t.dtype.is_floating_point:
            return dt.name_of(t.dtype)
    for t in inputs.values():
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            return dt.name_of(t.dtype)
    return None


def _case(spec, rec: CallRecord, binding, inputs: dict, params: dict, mode: str,
          digest: str, source: RecordSource) -> Case:
    dtype = _dtype_of(spec, inputs)
    shapes = {n: tuple(v.shape) if isinstance(v, torch.Tensor) else () for n, v in
              inputs.items()}
    dtypes = {n: v.dtype if isinstance(v, torch.Tensor) else spec.input_dtype(n, dtype)
              for n, v in inputs.items()}
    dists = {n: ({"dist": "recorded", "sha": digest, "input": n} if v is not None
                 else {"dist": "none"}) for n, v in inputs.items()}
    merged = {**spec.params, **params}
    main = next((shapes[i.name] for i in spec.inputs if inputs.get(i.name) is not None), ())
    return Case(op=spec.name, id=rec.name, level=LEVEL, dtype=dtype, main_shape=main,
                input_shapes=shapes, input_dtypes=dtypes, params=merged, seed=0,
                dists=dists, file=source.dump, case_params=dict(params), mode=mode,
                description=f"{rec.api} as recorded ({source.kind})", source=source)


def _error_case(spec_name: str, rec: CallRecord, binding_name: str, why: str) -> Case:
    source = RecordSource("msprobe" if rec.dump.endswith(".json") else "capture", rec.name,
                          rec.api, binding_name, rec.step, rec.rank, rec.module,
                          rec.device if not rec.device.startswith("error") else "",
                          (), (), (), error=why, dump=rec.dump)
    return Case(op=spec_name, id=rec.name, level=LEVEL, dtype="", main_shape=(),
                input_shapes={}, input_dtypes={}, params={}, seed=0, dists={},
                file=rec.dump, source=source)


def index(path: str | os.PathLike, ops=None) -> Index:
    """The cases of a dump or capture folder, deduplicated, and what was not judged."""
    registry.load_builtin()
    not_judged = NotJudged()
    p = Path(path)
    capture = (p.is_dir() and (p / CAPTURE_INDEX).is_file()) or p.name == CAPTURE_INDEX
    calls = _capture_calls(p, not_judged) if capture else _msprobe_calls(p, not_judged)
    kind = "capture" if capture else "msprobe"
    out: list[Case] = []
    dedupe = _Dedupe()
    forwards: dict[str, CallRecord] = {}
    n = 0
    for rec in calls:
        n += 1
        binding = bindings.for_record(rec.api)
        label = rec.api if rec.direction == "forward" else f"{rec.api} (backward)"
        if binding is None:
            not_judged.add(label, "no op binds it")
            continue
        if ops is not None and binding.op not in ops:
            not_judged.add(label, f"op {binding.op} not selected")
            continue
        if rec.device.startswith("error"):
            out.append(_error_case(binding.op, rec, binding.name, rec.device[7:]))
            continue
        spec = registry.op(binding.op)
        if rec.direction == "forward":
            if binding.call.backward:
                forwards[rec.name.rsplit(".", 1)[0]] = rec
            case = _forward_case(spec, rec, binding, kind, not_judged, label)
        else:
            fwd = forwards.pop(rec.name.rsplit(".", 1)[0], None)
            case = _backward_case(spec, rec, fwd, binding, kind, not_judged, label)
        if case is None:
            continue
        # the same inputs and the same outputs: one call judged, counted; the same inputs
        # with other outputs (a nondeterministic kernel) are judged apart
        j = dedupe.repeats(case, len(out))
        if j is not None:
            first = out[j]
            out[j] = dataclasses.replace(first, source=dataclasses.replace(
                first.source, calls=first.source.calls + 1,
                same=first.source.same + (rec.name,)))
            continue
        out.append(case)
    return Index(_unique_ids(out), not_judged, n, [str(p)])


class _Dedupe:
    """Which earlier case a call repeats: the same case fields and the same tensors by
    content. dump.json's summaries (Max, Min, Mean, Norm) tell most calls apart without
    reading a file; only calls alike in all of them are hashed, so an index reads
    almost no tensor data (a capture's blobs are named by content: never read)."""

    def __init__(self):
        self._by_key: dict[str, list[int]] = {}
        self._content: dict[int, str] = {}  # position -> its tensors hashed, once
        self._cases: dict[int, Case] = {}

    @staticmethod
    def _refs_of(case: Case) -> list[md.TensorRef]:
        return case.source.input_refs() + _refs(list(case.source.outputs))

    def _hash(self, position: int) -> str:
        if position not in self._content:
            self._content[position] = _content_hash(self._refs_of(self._cases[position]))
        return self._content[position]

    def _key(self, case: Case, position: int) -> str:
        refs = self._refs_of(case)
        if any(not r.identity for r in refs):  # no summaries to go by: the content decides
            return "content:" + self._hash(position)
        return json.dumps([case.canonical(contents=False), [(r.dtype, r.shape, r.identity) for r in refs]],
                          sort_keys=True, default=str)

    def repeats(self, case: Case, position: int) -> int | None:
        """The position of the case this one repeats, else None (and it is remembered
        at ``position``)."""
        if case.source.error:
            return None
        self._cases[position] = case
        key = self._key(case, position)
        earlier = self._by_key.setdefault(key, [])
        exact = key.startswith("content:") or all(r.exact for r in self._refs_of(case))
        for j in earlier:
            if exact or self._hash(j) == self._hash(position):
                del self._cases[position]
                self._content.pop(position, None)
                return j
        earlier.append(position)
        return None


def _unique_ids(cases: list[Case]) -> list[Case]:
    """Case ids are record names; a dump of several steps or ranks repeats them, so
    there each id is prefixed with where it ran: ``step3/rank1/Functional.linear.0.forward``."""
    places = {(c.source.step, c.source.rank) for c in cases}
    if len(places) <= 1:
        return cases
    out = []
    for c in cases:
        where = "".join(f"{k}{v}/" for k, v in (("step", c.source.step),
                                                 ("rank", c.source.rank)) if v is not None)
        out.append(dataclasses.replace(c, id=where + c.id))
    return out


def _meta(value):
    return _walk(value, lambda r: r.meta())


def _missing(refs: list[md.TensorRef]) -> str:
    gone = [r.path for r in refs if not os.path.isfile(r.path)]
    return f"tensor file {gone[0]} is missing" + (f" (and {len(gone) - 1} more)"
                                                  if len(gone) > 1 else "") if gone else ""


def _source(kind, rec, binding, args, kwargs, outputs, upstream=None, error="",
            outputs_sha="") -> RecordSource:
    return RecordSource(kind, rec.name, rec.api, binding.name, rec.step, rec.rank, rec.module,
                        rec.device, tuple(args), tuple(sorted(kwargs.items())), tuple(outputs),
                        None if upstream is None else tuple(upstream), error, dump=rec.dump,
                        outputs_sha=outputs_sha)


def _forward_case(spec, rec, binding, kind, not_judged, label):
    try:
        inputs, params = bindings.adapt(binding, _meta(rec.args), _meta(rec.kwargs))
        outs = binding.call.op_outputs(spec, _meta(rec.outputs), _meta(rec.args),
                                       _meta(rec.kwargs))
    except NotCovered as exc:
        not_judged.add(label, f"{binding.op} does not cover it: {exc}")
        return None
    except (ValueError, TypeError, IndexError, RuntimeError) as exc:
        return _error_case(binding.op, rec, binding.name, str(exc))
    if not outs:
        not_judged.add(label, f"no output of {binding.op} in the record")
        return None
    return _hashed_case(spec, rec, binding, kind, not_judged, label, inputs, params,
                        "forward", rec.args, rec.kwargs, rec.outputs, None)


def _backward_case(spec, rec, fwd, binding, kind, not_judged, label):
    if not binding.call.backward:
        not_judged.add(label, "its backward record is not the gradient of the call's "
                              "inputs (msprobe hooks a composite call inside; the binding "
                              "declares no backward)")
        return None
    if spec.grads is None:
        not_judged.add(label, f"op {spec.name} declares no gradients")
        return None
    if fwd is None:
        not_judged.add(label, "its forward record is not in the dump")
        return None
    places = _tensor_args(fwd.args, fwd.kwargs)
    grads = rec.outputs
    if len(grads) != len(places) or any(
            not isinstance(g, md.TensorRef) or g.shape != (p.shape if isinstance(
                p, md.TensorRef) else ()) for g, (_, p) in zip(grads, places)):
        not_judged.add(label, "its gradients do not match the forward inputs' shapes")
        return None
    try:
        inputs, params = bindings.adapt(binding, _meta(fwd.args), _meta(fwd.kwargs))
        g_args, g_kwargs = _with_grads(_meta(fwd.args), _meta(fwd.kwargs), _meta(grads))
        bindings.adapt(binding, g_args, g_kwargs)
        binding.call.op_outputs(spec, _meta(rec.args), _meta(fwd.args), _meta(fwd.kwargs))
    except NotCovered as exc:
        not_judged.add(label, f"{binding.op} does not cover it: {exc}")
        return None
    except (ValueError, TypeError, IndexError, RuntimeError) as exc:
        return _error_case(binding.op, rec, binding.name, str(exc))
    return _hashed_case(spec, rec, binding, kind, not_judged, label, inputs, params,
                        "backward", fwd.args, fwd.kwargs, grads, rec.args)


def _hashed_case(spec, rec, binding, kind, not_judged, label, inputs, params, mode, args,
                 kwargs, outputs, upstream):
    """The case of a record whose binding fits: a dtype the op covers, its inputs (and a
    backward record's upstream) hashed for the golden key, its outputs for dedupe."""
    dtype = _dtype_of(spec, inputs)
    if dtype is None or dtype not in spec.dtypes:
        not_judged.add(label, f"{binding.op} covers {', '.join(spec.dtypes)}, not {dtype}")
        return None
    refs = _refs(args) + _refs(kwargs) + (_refs(upstream) if upstream is not None else [])
    missing = _missing(refs + _refs(outputs))
    source = _source(kind, rec, binding, args, kwargs, outputs, upstream=upstream,
                     error=missing)
    # the golden key's content hash is taken when the case loads its tensors
    # (RecordSource.digest), so indexing reads no tensor data
    return _case(spec, rec, binding, inputs, params, mode, "", source)


# -- what a run's selection indexed, for its report ----------------------------------
@dataclass
class Summary:
    """Records read, cases, calls, and those not judged, of one run's recorded sources
    (the selection's plan holds it: two runs in one process keep their own)."""

    records: int = 0
    cases: int = 0
    calls: int = 0
    not_judged: NotJudged = dataclasses.field(default_factory=NotJudged)

    def add(self, idx: "Index") -> None:
        self.not_judged.merge(idx.not_judged)
        self.records += idx.records
        self.cases += len(idx.cases)
        self.calls += sum(c.source.calls for c in idx.cases)

    def meta(self) -> dict:
        """results.json's "recorded" entry (empty when the run read no recorded source)."""
        if not self.records and not self.not_judged.counts:
            return {}
        return {"recorded": {"records": self.records, "cases": self.cases,
                             "calls": self.calls, "not_judged": self.not_judged.as_list()}}


INDEX_VERSION = "2"  # bump when what an index holds changes


def _index_key(path, ops) -> str | None:
    """What an index depends on: the source's files (names, sizes, mtimes: dump.json,
    construct.json, stack.json, every tensor file), the ops asked for, the bindings and
    the harness's index version. None where the source cannot be listed."""
    from verify.cases.shards import harness_id  # another harness's index is not this one's
    h = blake3()
    h.update(f"{INDEX_VERSION}|{harness_id()}|{os.path.abspath(path)}|"
             f"{sorted(ops or [])}|".encode())
    h.update("|".join(sorted(f"{b.name}>{b.op}" for b in bindings.all_bindings())).encode())
    try:
        root = Path(path)
        for folder, dirs, files in os.walk(root if root.is_dir() else root.parent,
                                           followlinks=True):
            dirs.sort()
            for name in sorted(files):
                st = os.stat(os.path.join(folder, name))
                h.update(f"{folder}/{name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    except OSError:
        return None
    return h.hexdigest()[:32]


def _index_cache(key: str) -> Path:
    from platformdirs import user_cache_dir
    base = os.environ.get("VERIFY_INDEX_CACHE") or os.path.join(
        user_cache_dir("kernel-verify", appauthor=False), "recorded-index")
    return Path(base) / f"{key}.pickle"


def cached_index(path, ops=None) -> Index:
    """``index``, kept in the user's cache folder: the run's controller indexes a dump
    once and every worker (and a later replay of the same dump) reads that. Any change to
    the source's files is a new key."""
    import pickle
    key = _index_key(path, ops)
    cache = _index_cache(key) if key else None
    if cache is not None and cache.is_file():
        try:
            with open(cache, "rb") as f:
                return pickle.load(f)
        except Exception:  # unreadable or from another harness version: index again
            cache.unlink(missing_ok=True)
    idx = index(path, ops)
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".part{os.getpid()}")
            with open(tmp, "wb") as f:
                pickle.dump(idx, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, cache)
        except OSError:
            pass  # no cache folder: index again next time
    return idx


def load(path: str, ops=None, summary: Summary | None = None) -> list[Case]:
    """The cases of a recorded source; what was not judged goes into ``summary``."""
    idx = cached_index(path, ops)
    if summary is not None:
        summary.add(idx)
    return idx.cases


# -- what a running case loads -------------------------------------------------------
_LOADED: dict[str, tuple[list, dict]] = {}


def _load(value):
    return _walk(value, lambda r: r.load())


def _binding(case: Case):
    return _binding_of(case.source)


def _binding_of(src: RecordSource):
    b = bindings.for_record(src.api)
    if b is None:
        raise ConfigError(f"{src.record}: no op binds {src.api} any more")
    return b


def inputs(case: Case) -> dict:
    """The recorded inputs of a case, in the op's layout (CPU tensors)."""
    src = case.source
    if src.error:
        raise RuntimeError(src.error)
    args, kwargs = _load(list(src.args)), _load(dict(src.kwargs))
    _LOADED.clear()
    _LOADED[case.id] = (args, kwargs)
    ins, _ = bindings.adapt(_binding(case), args, kwargs)
    out = {}
    for name in case.input_shapes:
        v = ins.get(name)
        out[name] = None if v is None else v.detach().to("cpu").contiguous().clone()
    if _memo_key(src) not in _DIGESTS:  # the golden key's content, hashed once
        _remember_digest(src, out)
    return out


def upstream(case: Case) -> dict:
    """A backward record's incoming gradients as the op's ``grad_<output>``."""
    src = case.source
    args, kwargs = _LOADED.get(case.id) or (_load(list(src.args)), _load(dict(src.kwargs)))
    spec = registry.op(case.op)
    ups = _binding(case).call.op_outputs(spec, _load(list(src.upstream)), args, kwargs)
    return {f"grad_{n}": _judged(v)[0].detach().contiguous() for n, v in ups.items()}


def kernel_outputs(case: Case) -> tuple[dict, dict]:
    """What the recorded call returned, in the op's layout: (name -> tensor, name -> the
    dtype it is judged in). Of a backward record: the gradients it holds."""
    src = case.source
    spec = registry.op(case.op)
    binding = _binding(case)
    args, kwargs = _LOADED.pop(case.id, None) or (_load(list(src.args)),
                                                  _load(dict(src.kwargs)))
    if case.mode == "backward":
        g_args, g_kwargs = _with_grads(args, kwargs, _load(list(src.outputs)))
        grads, _ = bindings.adapt(binding, g_args, g_kwargs)
        fwd_ins, _ = bindings.adapt(binding, args, kwargs)
        wanted = [w for w in spec.grads.wrt if grads.get(w) is not None
                  and grads[w] is not fwd_ins.get(w)]
        values = {f"grad_{w}": grads[w] for w in wanted}
    else:
        values = binding.call.op_outputs(spec, _load(list(src.outputs)), args, kwargs)
    out, dtypes = {}, {}
    for name, value in values.items():
        t, d = _judged(value)
        out[name], dtypes[name] = t.detach().contiguous(), d
    _DTYPES.clear()
    _DTYPES[case.id] = dtypes
    return out, dtypes


_DTYPES: dict[str, dict] = {}


def judged_dtypes(case: Case) -> dict:
    """The dtypes the last recorded outputs of ``case`` are judged in."""
    return dict(_DTYPES.get(case.id, {}))


def row_columns(case: Case) -> dict:
    src = case.source
    return {"record": src.record, "step": src.step, "rank": src.rank, "module": src.module,
            "calls": src.calls, "recorded_device": src.device}


def kernel_label(case: Case) -> str:
    return f"recorded:{case.source.device or 'unknown'}"


# -- the recorded backend ------------------------------------------------------------
def _recorded_kernel(**_):
    raise RuntimeError("the recorded backend's outputs come from the record, not a call")


def register_backend(cases=()) -> None:
    """The "recorded" backend (not run by default) and its kernels: one per op and the
    device its calls ran on, named as rows show it (``recorded:npu``)."""
    if BACKEND not in registry._BACKENDS:
        registry.register_backend(registry.Backend(
            BACKEND, device="cpu", default=False,
            note="the outputs a recorded call returned (an msprobe dump or a capture)"))
    have = {(k.op, k.name) for k in registry.kernels() if k.backend == BACKEND}
    for case in cases:
        if case.source is None or (case.op, kernel_label(case)) in have:
            continue
        have.add((case.op, kernel_label(case)))
        registry.kernel(case.op, backend=BACKEND, name=kernel_label(case),
                        description="the outputs the recorded call returned")(
            _recorded_kernel)


def runs(case: Case, kern) -> bool:
    """Whether ``kern`` takes part in ``case``: the recorded backend's kernel of the
    device the call ran on judges it; it has no outputs for any other case."""
    if kern.backend != BACKEND:
        return True
    return case.source is not None and kern.name == kernel_label(case)
