"""``verify shrink RUN_DIR``: each failing input of a hunt (or each case that FAILed in a
run) made as small and as simple as it can be while it still fails, written as a case
file and a standalone reproducer.

Still failing means a finding by the hunt's own rule (hunt._score), or for a run's case a
FAIL under its standard. In turn: the forward alone and one step where they fail (the
reproducer checks forward outputs); each param back to its default; each input's sparse
values made dense (a fraction of 1, then 0.5, so that a few elements still hold them),
its value family back to its base, then one constant value where that suffices; the
leading dimensions dropped while the op's rank range allows; each extent cut to the
shortest that fails (lengths past a block size are found this way). The reproducer
``repro_<op>_<case>.py`` needs torch and the kernel's module only: the inputs, params and
float64 golden are saved beside it (``.pt``); it calls the kernel (every step of a
multi-step case), prints the worst elements and exits 1 while the kernel is still wrong
(0 once fixed); a kernel that raises on the inputs is wrong.
"""
from __future__ import annotations

import inspect
import json
import math
import tempfile
from pathlib import Path

import torch

from verify.cases.case import load_file
from verify.errors import ConfigError
from verify.golden import source as golden_source
from verify.running import context, hunt as hunting
from verify.specs import inputs as inp
from verify.specs import registry

MAX_TRIES = 120  # cases run per shrunk input
SHORT = (1, 2, 3, 4, 8, 16, 32, 64, 128)  # extents tried first, shortest first


def hunt_finding(rows: list[dict]) -> bool:
    """Still failing, for a hunt's input: a finding by the hunt's own rule."""
    return hunting._score(rows)[1]


def run_failure(rows: list[dict]) -> bool:
    """Still failing, for a case of a run (verify run --shrink): a FAIL under the case's
    standard, or a kernel that raised."""
    return any(r.get("verdict") == "FAIL" or (r.get("verdict") == "ERROR" and "kernel raised"
                                              in str(r.get("reason", ""))) for r in rows)


class _Shrinker:
    def __init__(self, spec, kern, ctx, folder: Path, still_fails=hunt_finding):
        self.spec, self.kern, self.ctx, self.folder = spec, kern, ctx, folder
        self.still_fails = still_fails
        self.tries = 0

    def fails(self, entry: dict) -> bool:
        if self.tries >= MAX_TRIES:
            return False
        self.tries += 1
        rows = hunting._evaluate(self.spec, entry, self.kern, self.ctx, self.folder)
        return rows is not None and self.still_fails(rows)

    def shrink(self, entry: dict) -> dict:
        best = json.loads(json.dumps(entry))
        forward = dict(best, mode="forward")  # the reproducer checks forward outputs
        if best.get("mode") != "forward" and self.fails(forward):
            best = forward
        if int(best.get("steps", 1)) > 1 and self.fails(dict(best, steps=1)):
            best = dict(best, steps=1)  # one step where one suffices
        for name in sorted(best.get("params") or {}):  # each param back to its default
            trial = json.loads(json.dumps(best))
            del trial["params"][name]
            if self.fails(trial):
                best = trial
        for name, dist in sorted((best.get("inputs") or {}).items()):
            if 0 < float(dist.get("fraction", 1.0)) < 1:  # sparse values made dense, so
                for dense in (1.0, 0.5):  # that a few elements still hold them
                    trial = json.loads(json.dumps(best))
                    trial["inputs"][name]["fraction"] = dense
                    if self.fails(trial):
                        best, dist = trial, trial["inputs"][name]
                        break
            base = dist.get("base")  # a value family: its base distribution alone
            if isinstance(base, dict):
                trial = json.loads(json.dumps(best))
                trial["inputs"][name] = dict(base, **({"abs": True} if dist.get("abs")
                                                      else {}))
                if self.fails(trial):
                    best, dist = trial, trial["inputs"][name]
            value = dist.get("mean") or dist.get("std") or dist.get("low") or 1.0  # one value
            trial = json.loads(json.dumps(best))
            trial["inputs"][name] = {"dist": "constant", "value": abs(float(value))
                                     if dist.get("abs") else float(value)}
            if self.fails(trial):
                best = trial
        lo_rank = max(1, self.spec.ranks[0])
        while len(best["shape"]) > lo_rank:  # fewer dimensions
            trial = dict(best, shape=best["shape"][1:])
            if not self.fails(trial):
                break
            best = trial
        for _ in range(2):  # each extent: the shortest of a few that fails, else bisected
            for d in range(len(best["shape"])):
                best = self._shorter(best, d)
        return best


    def _shorter(self, best: dict, d: int) -> dict:
        def at(n):
            shape = list(best["shape"])
            shape[d] = n
            return dict(best, shape=shape)
        n = best["shape"][d]
        for small in SHORT:
            if small >= n:
                break
            if self.fails(at(small)):
                return at(small)
        lo, hi = 0, n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fails(at(mid)):
                hi = mid
            else:
                lo = mid
        return at(hi)


def _kernel_source(kern) -> tuple[str, str]:
    """(module file or dotted name, function name) the reproducer imports."""
    fn = getattr(kern.fn, "__verify_kernel__", kern.fn)
    module = getattr(fn, "__module__", "") or ""
    path = inspect.getsourcefile(fn) or ""
    if module.startswith("verify_user_") or not module or module == "__main__":
        return path, fn.__name__
    return module, fn.__name__


def _limits(rows: list[dict], by_standard: bool = False) -> dict[str, float]:
    """Per output, the max abs error above which the reproducer says 'still wrong'.
    A hunt's finding: FINDING_RATIO times the larger of the compute-precision floor's and
    the correctly rounded golden's max abs error on these inputs. A run's FAIL
    (``by_standard``): the kernel's max abs error over its margin under the standard (the
    deciding metric over its threshold), the error at which the same error profile meets
    the standard."""
    out = {}
    for r in rows:
        if r.get("verdict") not in ("PASS", "FAIL") or " vs " in str(r.get("output")):
            continue
        margin, max_abs = r.get("margin"), r.get("max_abs")
        if by_standard and isinstance(margin, (int, float)) and margin > 0 \
                and isinstance(max_abs, (int, float)) and math.isfinite(max_abs) \
                and math.isfinite(margin):
            out[r["output"]] = max_abs / max(margin, 1.0)
            continue
        floors = [v for v in (r.get("cfloor_max_abs"), r.get("floor_max_abs"))
                  if isinstance(v, (int, float)) and math.isfinite(v)]
        out[r["output"]] = hunting.FINDING_RATIO * max(floors + [1e-30])
    return out


REPRO = '''"""Reproducer of a precision failure {found}, shrunk by verify shrink.

op {op}, case {case}, kernel {kernel}; shape {shape}, dtype {dtype}
It needs torch and the kernel's module. Exit 1 while the kernel is still wrong, 0 once
it is fixed: wrong means {wrong} (the limits, inputs and float64 golden are
saved beside this file).
"""
import importlib
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE, FUNCTION = {module!r}, {function!r}


def load_kernel():
    if MODULE.endswith(".py"):
        sys.path.insert(0, os.path.dirname(MODULE))
        spec = importlib.util.spec_from_file_location("repro_kernels", MODULE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(MODULE)
    return getattr(module, FUNCTION)


def main():
    data = torch.load(os.path.join(HERE, {data!r}), weights_only=True)
    kernel = load_kernel()
    inputs, params = dict(data["inputs"]), dict(data["params"])
    for step in range(data["steps"]):  # a multi-step case feeds outputs back as inputs
        try:
            out = kernel(**inputs, **params)
        except Exception as exc:  # a kernel that raises on these inputs is wrong too
            print(f"the kernel raised {{type(exc).__name__}}: {{exc}}")
            print("still wrong")
            return 1
        out = out if isinstance(out, (tuple, list)) else (out,)
        named = dict(zip(data["outputs"], out))
        for into, source in data["feedback"].items():
            inputs[into] = named[source].detach()
        if data["step_param"]:
            params[data["step_param"]] += 1
    wrong = False
    for name, actual in named.items():
        if name not in data["golden"]:
            continue
        golden = data["golden"][name]
        a = actual.detach().to("cpu", torch.float64).reshape(-1)
        g = golden.reshape(-1)
        diff = (a - g).abs()
        bad = torch.isnan(a) != torch.isnan(g)
        diff = torch.where(bad | (torch.isinf(a) != torch.isinf(g)),
                           torch.full_like(diff, float("inf")), torch.nan_to_num(diff))
        limit = data["limits"].get(name, 0.0)
        worst = torch.argsort(diff, descending=True)[:5]
        print(f"{{name}}: max abs error {{diff.max().item():.4g}} (limit {{limit:.4g}})")
        for i in worst.tolist():
            print(f"  [{{i}}] golden {{g[i].item():.9g}} actual {{a[i].item():.9g}} "
                  f"diff {{diff[i].item():.4g}}")
        wrong = wrong or bool(diff.max().item() > limit)
    print("still wrong" if wrong else "fixed")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def _standard_name(spec, case) -> str:
    return str((case.standard or spec.standard or {}).get("name", "the op's"))


def _write_repro(out: Path, spec, kern, entry: dict, rows: list[dict], folder: Path,
                 by_standard: bool = False) -> Path:
    path = folder / f"{spec.name}.json"
    path.write_text(json.dumps({"op": spec.name, "levels": {"L0": [entry]}}))
    case = next(c for c in load_file(path))
    first = inp.make_inputs(case)
    golden = dict(zip(golden_source.golden_names(spec, case),
                      golden_source.golden_trajectory(spec, case, first)[-1]))
    stem = f"repro_{spec.name}_{entry['id']}"
    wrong = ("a max abs error above the error at which the same error profile meets the "
             f"case's standard ({_standard_name(spec, case)})" if by_standard else
             f"a max abs error above {hunting.FINDING_RATIO:g}x what a correct kernel "
             f"computing in {spec.compute_dtype} has on these inputs")
    module, function = _kernel_source(kern)
    outputs = spec.active_outputs(case.params)
    params = {k: v for k, v in case.params.items() if k in spec.params}
    torch.save({"inputs": {k: v for k, v in first.items() if v is not None},
                "params": params, "outputs": outputs,
                "golden": {n: golden[n].to(torch.float64) for n in outputs if n in golden},
                "limits": _limits(rows, by_standard), "steps": case.steps,
                "feedback": dict(spec.feedback) if case.steps > 1 else {},
                "step_param": spec.step_param if case.steps > 1 else None},
               out / f"{stem}.pt")
    script = out / f"{stem}.py"
    script.write_text(REPRO.format(op=spec.name, case=entry["id"],
                                   kernel=f"{kern.backend}:{kern.name}", shape=entry["shape"],
                                   dtype=entry["dtype"], wrong=wrong, module=module,
                                   found="a verify run FAILed" if by_standard
                                   else "verify hunt found",
                                   function=function, data=f"{stem}.pt"))
    return script


def shrink(run_dir, case: str | None = None, out=None, store: str | None = None,
           kernels=()) -> list[dict]:
    """Shrink the failing inputs of a run folder; returns one dict per input: its id, the
    shrunk entry, elements before and after, and the files written. A hunt's folder:
    its found cases (found_cases.json). Any other run (verify run --shrink): each case
    that FAILed where it was expected to PASS, as its case file made it. ``kernels``:
    the run's kernel modules where its results.json does not name them."""
    run_dir = Path(run_dir)
    meta_path = run_dir / "results.json"
    if not meta_path.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no results.json)")
    doc = json.loads(meta_path.read_text())
    meta = doc.get("meta") or {}
    registry.load_builtin()
    for module in list(kernels) + [m for m in (meta.get("hunt") or meta).get("modules") or []
                                   if m not in kernels]:
        registry.load_user_module(module)
    if (run_dir / hunting.FOUND).is_file():
        items, still_fails = _found_items(run_dir, meta.get("hunt") or {}, case), hunt_finding
    else:
        items, still_fails = _failed_items(doc.get("rows") or [], case, run_dir), run_failure
    out = Path(out) if out else run_dir / "shrunk"
    out.mkdir(parents=True, exist_ok=True)
    ctx = context.RunContext(resolver=golden_source.configure(store))
    done = []
    with tempfile.TemporaryDirectory(prefix="verify-shrink-") as tmp:
        for spec, kern, entry in items:
            shrinker = _Shrinker(spec, kern, ctx, Path(tmp), still_fails)
            small = shrinker.shrink(entry)
            rows = hunting._evaluate(spec, small, kern, ctx, Path(tmp)) or []
            case_file = out / f"shrunk_{spec.name}_{entry['id']}.json"
            hunting.write_found(case_file, spec.name, [small], meta.get("hunt", {}).get(
                "seed", 0) if still_fails is hunt_finding else small.get("seed", 0))
            script = _write_repro(out, spec, kern, small, rows, Path(tmp),
                                  by_standard=still_fails is run_failure)
            done.append({"id": entry["id"], "entry": small, "tries": shrinker.tries,
                         "elements": (_elements(spec, entry, Path(tmp)),
                                      _elements(spec, small, Path(tmp))),
                         "case_file": str(case_file), "repro": str(script)})
    return done


def _elements(spec, entry: dict, folder: Path) -> int:
    """The elements of an entry's main shape (its first case's)."""
    path = folder / f"{spec.name}.json"
    path.write_text(json.dumps({"op": spec.name, "levels": {"L0": [entry]}}))
    return math.prod(next(iter(load_file(path))).main_shape)


def _found_items(run_dir: Path, meta: dict, case: str | None):
    found_path = run_dir / hunting.FOUND
    doc = json.loads(found_path.read_text())
    spec = registry.op(doc["op"])
    entries = [e for e in doc["levels"]["L0"] if case is None or e["id"] == case]
    if case is not None and not entries:
        raise ConfigError(f"{found_path}: no found case {case!r} (its ids: "
                          f"{', '.join(e['id'] for e in doc['levels']['L0'])})")
    items = []
    for entry in entries:
        kerns = [k for k in registry.kernels(spec.name, [meta.get("backend")])
                 if entry["id"].startswith(f"hunt-{k.name}-")]
        if not kerns:
            raise ConfigError(f"{entry['id']}: its kernel is not registered (pass the "
                              f"hunt's --kernels modules)")
        items.append((spec, kerns[0], entry))
    return items


def _failed_items(rows: list[dict], case: str | None, run_dir: Path):
    """(spec, kernel, entry) of each case of a run that FAILed where it should PASS: the
    case loaded again from its file, written back as one entry that loads to it."""
    from verify.cases import case as case_files
    wanted = {}
    for r in rows:
        if r.get("verdict") != "FAIL" or r.get("expected", "PASS") != "PASS" or r.get("record"):
            continue
        if case is not None and r.get("case_id") != case:
            continue
        wanted.setdefault((r.get("file"), r.get("level"), r.get("case_id")), set()).add(
            (r.get("backend"), r.get("kernel")))
    if case is not None and not wanted:
        raise ConfigError(f"{run_dir}: no failing case {case!r}")
    items = []
    by_file: dict[str, list] = {}
    for (file, level, case_id), kernels in sorted(wanted.items()):
        if not file or not Path(file).is_file():
            raise ConfigError(f"{run_dir}: case {case_id}: its case file {file!r} is gone")
        cases = by_file.setdefault(file, case_files.load_file(file))
        found = next((c for c in cases if c.id == case_id and c.level == level), None)
        if found is None:
            raise ConfigError(f"{file}: case {case_id} ({level}) is no longer in it")
        spec = registry.op(found.op)
        for backend, name in sorted(kernels):
            kern = next((k for k in registry.kernels(spec.name, [backend]) if k.name == name),
                        None)
            if kern is None:
                raise ConfigError(f"case {case_id}: kernel {backend}:{name} is not "
                                  f"registered (pass the run's --kernels modules)")
            items.append((spec, kern, entry_of(spec, found, f"{_safe(case_id)}-{name}")))
    return items


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)[:120]


def entry_of(spec, case, case_id: str) -> dict:
    """A case-file entry that loads to ``case``: the same shapes, dtypes, values (seed and
    distributions), params, steps, mode and standard."""
    entry = {"id": case_id, "shape": list(case.main_shape), "dtype": case.dtype,
             "seed": case.seed, "inputs": {k: v for k, v in case.dists.items()}}
    shapes = {n: list(sh) for n, sh in case.input_shapes.items()
              if n in spec.input_names and tuple(sh) != tuple(spec.input(n).shape_for(
                  case.main_shape)) and case.dists.get(n, {}).get("dist") not in ("given",
                                                                                   "none")}
    if shapes:
        entry["shapes"] = shapes
    from verify.comparator import dtypes as dt
    dtypes = {n: dt.name_of(d) for n, d in case.input_dtypes.items()
              if n in spec.input_names and d != spec.input_dtype(n, case.dtype)}
    if dtypes:
        entry["dtypes"] = dtypes
    if case.case_params:
        entry["params"] = dict(case.case_params)
    if case.steps > 1:
        entry["steps"] = case.steps
    if case.mode != "forward":
        entry["mode"] = case.mode
    if case.standard:
        entry["standard"] = case.standard
    return entry
