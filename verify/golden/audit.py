"""``verify golden audit``: recompute a sample (or all) of a store's or a registry's
goldens and report any that differ from what is stored.

A golden carries what it was computed from (the case's canonical form, its working
dtype, the golden version and the inputs' fingerprint), so it can be recomputed here
without the case file. A golden whose key no longer matches today's golden version is
stale: no run uses it, and it is reported as such, not recomputed.
"""
from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass

import torch

from verify.comparator import dtypes as dt
from verify.golden import source as golden_source
from verify.specs import registry
from verify.specs import inputs as inp
from verify.cases.case import Case
from verify.golden.store import GoldenStore, tensors_to_trajectory

OK, DIFFERS, STALE, SKIPPED = "ok", "DIFFERS", "stale", "skipped"


@dataclass
class Finding:
    key: str
    op: str
    case_id: str
    status: str  # ok | DIFFERS | stale | skipped
    detail: str = ""


def case_from_meta(meta: dict) -> Case:
    """The case a golden was computed for, from the record stored with it."""
    doc = meta["case"]
    shapes = {k: tuple(v) for k, v in doc["shapes"].items()}
    in_dtypes = {k: dt.to_torch(v) for k, v in doc["dtypes"].items()}
    working = meta.get("dtype") or _guess_working_dtype(in_dtypes)
    return Case(op=doc["op"], id=meta.get("case_id", "audit"), level="audit", dtype=working,
                main_shape=next(iter(shapes.values()), ()), input_shapes=shapes,
                input_dtypes=in_dtypes, params=dict(doc["params"]), seed=int(doc["seed"]),
                dists=dict(doc["dists"]), steps=int(doc["steps"]),
                mode="both" if doc.get("backward") else "forward")


def _guess_working_dtype(in_dtypes: dict) -> str:
    floats = [d for d in in_dtypes.values() if d.is_floating_point]
    return dt.name_of(floats[0]) if floats else "fp32"


_INT_OF_SIZE = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN payloads and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        as_int = _INT_OF_SIZE[a.element_size()]
        return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))
    return torch.equal(a, b)


def audit_entry(store: GoldenStore, key: str) -> Finding:
    """Recompute one stored golden and compare it with the stored bytes."""
    e = store.entry(key)
    if e is None:
        return Finding(key, "", "", SKIPPED, "not in the store")
    try:
        spec = registry.op(e.op)
    except Exception:
        return Finding(key, e.op, e.case_id, SKIPPED,
                       f"op '{e.op}' is not declared here (--kernels MODULE declares it)")
    try:
        case = case_from_meta(e.meta)
    except (KeyError, TypeError, ValueError) as exc:  # nothing to recompute it from: a
        # golden nobody can check is not a golden to trust (exit 1, not "skipped")
        return Finding(key, e.op, e.case_id, DIFFERS, f"no usable record of its case, so it "
                                                      f"cannot be recomputed: {exc}")
    derived = (e.meta.get("derived") or {}).get("kind")
    base = case.golden_key(spec.golden_version)
    if derived == "compute_floor":  # recomputed the way a run computes it
        from verify.golden import compute_floor as cfl
        want, recompute = cfl.store_key(spec, base), lambda first: [
            tuple(step[n] for n in golden_source.golden_names(spec, case))
            for step in cfl.trajectory(spec, case, first)]
    elif derived == "floors":  # figures of the golden's floors: recomputed from the golden
        return _audit_floors(store, key, e, spec, case, base)
    elif derived:
        return Finding(key, e.op, e.case_id, SKIPPED, f"derived entry of unknown kind "
                                                      f"{derived!r}")
    else:
        want, recompute = base, lambda first: golden_source.golden_trajectory(spec, case,
                                                                             first)
    if want != key:
        return Finding(key, e.op, e.case_id, STALE, "made by another golden version (or "
                                                    "another case record); no run uses it")
    stored = store.get_tensors(key)  # checks the blob's hash and its key
    if stored is None:
        return Finding(key, e.op, e.case_id, DIFFERS, "blob missing, corrupt or not bound "
                                                      "to this key")
    names = golden_source.golden_names(spec, case)
    first = inp.make_inputs(case)
    if e.meta.get("inputs_sha") not in (None, inp.fingerprint(first)):
        return Finding(key, e.op, e.case_id, DIFFERS,
                       "its record names inputs other than the case's")
    fresh = recompute(first)
    try:
        kept = tensors_to_trajectory(stored, names)
    except KeyError as exc:
        return Finding(key, e.op, e.case_id, DIFFERS, f"stored golden lacks {exc}")
    for s, (a_step, b_step) in enumerate(zip(fresh, kept)):
        for name, a, b in zip(names, a_step, b_step):
            if not _same_bits(a.detach().to(b.dtype), b):
                diff = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
                return Finding(key, e.op, e.case_id, DIFFERS,
                               f"step {s + 1} output {name}: max |recomputed - stored| "
                               f"{diff:.3e}")
    if len(fresh) != len(kept):
        return Finding(key, e.op, e.case_id, DIFFERS, f"{len(kept)} stored steps, "
                                                      f"{len(fresh)} recomputed")
    return Finding(key, e.op, e.case_id, OK)


def sample_keys(keys: list[str], fraction: float, seed: int) -> list[str]:
    """A reproducible sample of ``keys`` (at least one when there are any)."""
    if fraction >= 1:
        return list(keys)
    n = max(1, round(len(keys) * fraction)) if keys else 0
    return sorted(random.Random(seed).sample(sorted(keys), n))


def audit_store(store: GoldenStore, fraction: float = 1.0, seed: int = 0):
    """(findings, how many goldens the store holds)."""
    keys = [e.key for e in store.entries()]
    return [audit_entry(store, k) for k in sample_keys(keys, fraction, seed)], len(keys)


def audit_registry(url: str, fraction: float = 1.0, seed: int = 0,
                   writer: str | None = None):
    """Fetch a sample of the registry's goldens (``writer``: all those one writer's token
    wrote) into a scratch store (each checked against its hash and key on the way) and
    audit them there. A disputed golden is fetched all the same: the audit is the check."""
    from verify.golden.registry_client import RegistryClient
    client = RegistryClient(url)
    if writer:
        keys = [i["key"] for i in client.items() if i.get("writer") == writer]
    else:
        keys = client.keys()
    client.audit_mode = True
    findings = []
    with tempfile.TemporaryDirectory(prefix="verify-audit-") as scratch:
        store = GoldenStore(scratch)
        for key in sample_keys(keys, fraction, seed):
            try:
                if not client.fetch(key, store):
                    findings.append(Finding(key, "", "", SKIPPED, "listed but not served"))
                    continue
            except ValueError as exc:  # the bytes, or the blob's key, do not match
                findings.append(Finding(key, "", "", DIFFERS, f"rejected on fetch: {exc}"))
                continue
            findings.append(audit_entry(store, key))
    return findings, len(keys)


def _audit_floors(store: GoldenStore, key: str, e, spec, case: Case, base: str) -> Finding:
    """A floors entry (verify/golden/floors.py): each figure recomputed from the stored
    golden (the output floor) or from the compute-precision evaluation (its verdict)."""
    from verify.golden import floors as fl
    from verify.golden import compute_floor as cfl
    if fl.store_key(base) != key:
        return Finding(key, e.op, e.case_id, STALE, "made by another golden version (or "
                                                    "another case record); no run uses it")
    stored = store.get_tensors(base)
    if stored is None:
        return Finding(key, e.op, e.case_id, STALE, "its golden is no longer stored")
    names = golden_source.golden_names(spec, case)
    golden = tensors_to_trajectory(stored, names)
    first = inp.make_inputs(case)
    cf_steps = None
    book = (e.meta.get("figures") or {})
    for sub, kept in sorted(book.items()):
        kind, out, step, dtype, std_text = sub.split("|", 4)
        step = int(step)
        g = dict(zip(names, golden[step]))[out]
        std = json.loads(std_text)
        if kind == "out":
            known = fl.output_floor(g, dtype, std)
            fresh = fl._jsonable({"metrics": known.metrics.as_dict(),
                                  "histogram": known.histogram})
        else:
            if cf_steps is None:
                cf_steps = cfl.trajectory(spec, case, first) if cfl.applies(spec, case) else []
            f = cf_steps[step].get(out) if step < len(cf_steps) else None
            fresh = {"none": True} if f is None else None
            if f is not None:
                from verify.comparator.comparison import compare
                v = compare(f, g, dtype=dtype, standard=std, floor=False, plots=False)
                fresh = fl._jsonable({"verdict": v.verdict, "standard": v.standard,
                                      "reason": v.reason, "dtype": v.dtype,
                                      "metrics": v.metrics.as_dict(), "margin": v.margin})
        if json.dumps(fresh, sort_keys=True) != json.dumps(kept, sort_keys=True):
            return Finding(key, e.op, e.case_id, DIFFERS, f"floor figures {sub.split('|')[0]} "
                                                          f"of {out} step {step + 1} differ "
                                                          f"when recomputed")
    return Finding(key, e.op, e.case_id, OK)
