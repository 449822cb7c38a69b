"""``verify shrink RUN_DIR``: each failing input of a hunt made as small and as simple as
it can be while it still fails, written as a case file and a standalone reproducer.

Still failing means a finding by the hunt's own rule (hunt._score). In turn: the
forward alone where it fails (the reproducer checks forward outputs); each searched
input as one constant value where that suffices; each dimension bisected down
to the shortest extent that fails (lengths past a block size are found this way); the
leading dimensions dropped while the op's rank range allows. The reproducer
``repro_<op>_<case>.py`` needs torch and the kernel's module only: the inputs, params and
float64 golden are saved beside it (``.pt``); it calls the kernel, prints the worst
elements and exits 1 while the kernel's error exceeds FINDING_RATIO times what a correct
kernel computing in the op's compute dtype has on those inputs (0 once fixed).
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


class _Shrinker:
    def __init__(self, spec, kern, ctx, folder: Path):
        self.spec, self.kern, self.ctx, self.folder = spec, kern, ctx, folder
        self.tries = 0

    def fails(self, entry: dict) -> bool:
        if self.tries >= MAX_TRIES:
            return False
        self.tries += 1
        rows = hunting._evaluate(self.spec, entry, self.kern, self.ctx, self.folder)
        return rows is not None and hunting._score(rows)[1]

    def shrink(self, entry: dict) -> dict:
        best = json.loads(json.dumps(entry))
        forward = dict(best, mode="forward")  # the reproducer checks forward outputs
        if best.get("mode") != "forward" and self.fails(forward):
            best = forward
        for name, dist in sorted((best.get("inputs") or {}).items()):  # one value
            value = dist.get("mean") or dist.get("std") or dist.get("low") or 1.0
            trial = json.loads(json.dumps(best))
            trial["inputs"][name] = {"dist": "constant", "value": float(value)}
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


def _limits(rows: list[dict]) -> dict[str, float]:
    """Per output: FINDING_RATIO times the larger of the compute-precision floor's and
    the correctly rounded golden's max abs error on these inputs."""
    out = {}
    for r in rows:
        if r.get("verdict") not in ("PASS", "FAIL") or " vs " in str(r.get("output")):
            continue
        floors = [v for v in (r.get("cfloor_max_abs"), r.get("floor_max_abs"))
                  if isinstance(v, (int, float)) and math.isfinite(v)]
        out[r["output"]] = hunting.FINDING_RATIO * max(floors + [1e-30])
    return out


REPRO = '''"""Reproducer of a precision failure found by verify hunt and shrunk by verify shrink.

op {op}, case {case}, kernel {kernel}; shape {shape}, dtype {dtype}
It needs torch and the kernel's module. Exit 1 while the kernel is still wrong, 0 once
it is fixed: wrong means a max abs error above {ratio:g}x what a correct kernel computing in
{compute} has on these inputs (saved beside this file with the float64 golden).
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
    out = load_kernel()(**data["inputs"], **data["params"])
    out = out if isinstance(out, (tuple, list)) else (out,)
    wrong = False
    for name, actual in zip(data["outputs"], out):
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


def _write_repro(out: Path, spec, kern, entry: dict, rows: list[dict], folder: Path) -> Path:
    path = folder / f"{spec.name}.json"
    path.write_text(json.dumps({"op": spec.name, "levels": {"L0": [entry]}}))
    case = next(c for c in load_file(path))
    first = inp.make_inputs(case)
    golden = dict(zip(golden_source.golden_names(spec, case),
                      golden_source.golden_trajectory(spec, case, first)[-1]))
    stem = f"repro_{spec.name}_{entry['id']}"
    module, function = _kernel_source(kern)
    outputs = spec.active_outputs(case.params)
    params = {k: v for k, v in case.params.items() if k in spec.params}
    torch.save({"inputs": {k: v for k, v in first.items() if v is not None},
                "params": params, "outputs": outputs,
                "golden": {n: golden[n].to(torch.float64) for n in outputs if n in golden},
                "limits": _limits(rows)}, out / f"{stem}.pt")
    script = out / f"{stem}.py"
    script.write_text(REPRO.format(op=spec.name, case=entry["id"],
                                   kernel=f"{kern.backend}:{kern.name}", shape=entry["shape"],
                                   dtype=entry["dtype"], ratio=hunting.FINDING_RATIO,
                                   compute=spec.compute_dtype, module=module,
                                   function=function, data=f"{stem}.pt"))
    return script


def shrink(run_dir, case: str | None = None, out=None, store: str | None = None) -> list[dict]:
    """Shrink the found inputs of a hunt's run folder; returns one dict per input:
    its id, the shrunk entry, elements before and after, and the files written."""
    run_dir = Path(run_dir)
    found_path = run_dir / hunting.FOUND
    meta_path = run_dir / "results.json"
    if not found_path.is_file() or not meta_path.is_file():
        raise ConfigError(f"{run_dir}: not a verify hunt run (no {hunting.FOUND} / "
                          f"results.json)")
    meta = json.loads(meta_path.read_text())["meta"].get("hunt") or {}
    doc = json.loads(found_path.read_text())
    registry.load_builtin()
    for module in meta.get("modules") or []:
        registry.load_user_module(module)
    spec = registry.op(doc["op"])
    entries = [e for e in doc["levels"]["L0"] if case is None or e["id"] == case]
    if case is not None and not entries:
        raise ConfigError(f"{found_path}: no found case {case!r} (its ids: "
                          f"{', '.join(e['id'] for e in doc['levels']['L0'])})")
    out = Path(out) if out else run_dir / "shrunk"
    out.mkdir(parents=True, exist_ok=True)
    ctx = context.RunContext(resolver=golden_source.configure(store))
    done = []
    with tempfile.TemporaryDirectory(prefix="verify-shrink-") as tmp:
        for entry in entries:
            kerns = [k for k in registry.kernels(spec.name, [meta.get("backend")])
                     if entry["id"].startswith(f"hunt-{k.name}-")]
            if not kerns:
                raise ConfigError(f"{entry['id']}: its kernel is not registered (pass the "
                                  f"hunt's --kernels modules)")
            kern = kerns[0]
            shrinker = _Shrinker(spec, kern, ctx, Path(tmp))
            small = shrinker.shrink(entry)
            rows = hunting._evaluate(spec, small, kern, ctx, Path(tmp)) or []
            case_file = out / f"shrunk_{spec.name}_{entry['id']}.json"
            hunting.write_found(case_file, spec.name, [small], meta.get("seed", 0))
            script = _write_repro(out, spec, kern, small, rows, Path(tmp))
            done.append({"id": entry["id"], "entry": small, "tries": shrinker.tries,
                         "elements": (math.prod(entry["shape"]), math.prod(small["shape"])),
                         "case_file": str(case_file), "repro": str(script)})
    return done
