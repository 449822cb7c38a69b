"""Where a run's goldens come from: the local store, then the registry service, then
computed (and stored, and pushed when a write token is set).

One computation per golden across processes: the computing process holds the key's file
lock; another process that wants the same key waits, then reads it from the store.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import sqlite3
import time
from dataclasses import dataclass

import torch
from filelock import Timeout
from safetensors import SafetensorError

from verify.specs import inputs as inp
from verify import notices
from verify.cases.case import Case
from verify.errors import ConfigError
from verify.specs.registry import OpSpec
from verify.golden.registry_client import RegistryClient, RegistryUnavailable
from verify.golden.store import GoldenStore, StoreUnavailable, default_store_dir, tensors_to_trajectory, trajectory_to_tensors

log = logging.getLogger("verify.goldens")

COMPUTED, LOCAL, REGISTRY = "computed", "local", "registry"
# a recorded call's golden computed faster than this is not written to the store: storing
# and indexing it (~5 ms) cost more than computing it again
CHEAP_RECORDED_S = 0.02


def golden_names(spec: OpSpec, case: Case) -> list[str]:
    """Names of the tensors a case's golden holds per step: the outputs its params
    produce, then (backward cases) the gradients of the inputs it gives."""
    names = spec.active_golden_outputs(case.params)
    if case.backward:
        names += grad_names(spec, case)
    return names


def grad_names(spec: OpSpec, case: Case) -> list[str]:
    """Gradients a backward case compares: those of the wrt inputs it does not leave out."""
    return [spec.grads.grad_name(w) for w in spec.grads.wrt if case.dists[w]["dist"] != "none"]


def upstream_for(spec: OpSpec, case: Case, outputs: dict[str, torch.Tensor]) -> dict:
    """The case's seeded upstream gradients, shaped like the golden's outputs."""
    names = spec.upstream_outputs(case.params, case.dtype)
    return inp.make_upstream(case, {
        n: (tuple(outputs[n].shape), spec.output_dtype(n, case.dtype, case.params))
        for n in names})


def _golden_with_grads(spec: OpSpec, case: Case, args: dict, params: dict,
                       fn=None) -> tuple:
    """Forward outputs and the gradients of the wrt inputs (float64 for the golden), by
    autograd through the golden (or ``fn``) with the case's upstream gradients."""
    fn = fn or spec.golden_fn
    leaves = {w: args[w].clone().requires_grad_(True) for w in spec.grads.wrt
              if args.get(w) is not None}
    with torch.enable_grad():
        outs = _as_tuple(fn(**{**args, **leaves}, **params))
    names = spec.active_golden_outputs(params)
    by_name = dict(zip(names, outs))
    upstream = upstream_for(spec, case, by_name)
    pairs = [(by_name[k[5:]], v.to(by_name[k[5:]].dtype)) for k, v in upstream.items()
             if by_name[k[5:]].requires_grad]
    grads = torch.autograd.grad([p[0] for p in pairs], list(leaves.values()),
                                grad_outputs=[p[1] for p in pairs], allow_unused=True)
    grads = [torch.zeros_like(leaf) if g is None else g
             for g, leaf in zip(grads, leaves.values())]
    return tuple(o.detach() for o in outs) + tuple(g.detach() for g in grads)


def _as_tuple(outs) -> tuple:
    return (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)


def golden_trajectory(spec: OpSpec, case: Case, first_inputs: dict | None = None,
                      cast=None, fn=None, feed=None) -> list[tuple[torch.Tensor, ...]]:
    """float64 outputs of every step (with the gradients for a backward case); each
    step's outputs feed the next step's inputs.

    ``first_inputs``: the case's inputs if the caller already made them (saves a copy).
    ``cast`` (inputs -> the tensors the golden takes), ``fn`` (the function evaluated)
    and ``feed`` (output name, value -> what the next step gets) serve the
    compute-precision floor; the defaults are the float64 golden's.
    """
    cast = cast or _f64
    first = first_inputs if first_inputs is not None else inp.make_inputs(case)
    current = {k: cast(v) for k, v in first.items()}
    params = dict(case.params)
    names = spec.active_golden_outputs(params)
    out_steps = []
    for step in range(case.steps):
        if step:
            fresh = inp.make_inputs(case, step, [i.name for i in spec.inputs if i.per_step])
            current.update({k: cast(v) for k, v in fresh.items()})
            if spec.step_param:
                params[spec.step_param] = case.params[spec.step_param] + step
        if case.backward:
            outs = _golden_with_grads(spec, case, current, params, fn)
        else:
            outs = _as_tuple((fn or spec.golden_fn)(**current, **params))
        out_steps.append(outs)
        for in_name, out_name in spec.feedback.items():
            value = outs[names.index(out_name)]
            current[in_name] = feed(out_name, value) if feed else value
    return out_steps


def _f64(v):
    return None if v is None else v.to(torch.float64)


@dataclass
class Golden:
    trajectory: list[tuple[torch.Tensor, ...]]
    source: str  # computed | local | registry
    seconds: float
    key: str
    names: list[str]  # of each step's tensors

    def step(self, s: int) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.trajectory[s]))


# what a failing store raises: SQLite (read-only, disk full, locked, I/O), the file
# system, safetensors (a full disk mid-write), file locks that cannot be made
STORE_FAULTS = (sqlite3.Error, OSError, SafetensorError, StoreUnavailable, Timeout)
MEMORY_GOLDENS = 8  # kept in memory by a degraded run (the kernels of one case share one)


VERIFY_FETCHED = 0.1  # default share of fetched goldens recomputed (beyond one per op+dtype)
SAME_RTOL = 1e-12     # a recomputation within this of the fetched golden is the same golden:
                      # torch's float64 reductions may differ in the last bits with threads


class GoldenDisputed(Exception):
    """A golden fetched from the registry differs from this machine's recomputation."""


class GoldenResolver:
    def __init__(self, store: GoldenStore | None, client: RegistryClient | None = None,
                 required: bool = False, store_dir: str = "",
                 verify_fetched: float = VERIFY_FETCHED):
        self.store = store
        self.client = client
        self.required = required
        self.store_dir = store_dir or (str(store.root) if store is not None else "")
        self._memory: dict[str, list] = {}
        self.verify_fetched = verify_fetched
        self._checked_groups: set[tuple[str, str]] = set()
        self._disputed: dict[str, str] = {}
        self.fetched_checks = {"verified": 0, "seconds": 0.0, "disputed": 0}
        self.fetched_figures: set[str] = set()  # floor figures this process fetched
        self.disputed_figures: set[str] = set()

    def designate(self, cases) -> None:
        """From the run's plan: for each op and dtype, the key of its cheapest case
        (fewest input elements, then steps), the golden every process recomputes when it
        fetches it, so that each op and dtype is checked at least once per run."""
        best: dict[tuple[str, str], tuple] = {}
        from verify.specs.registry import op as op_spec
        for case in cases:
            if case.expect_error:
                continue
            cost = (sum(math.prod(s) for s in case.input_shapes.values()), case.steps,
                    case.id)
            group = (case.op, case.dtype)
            if group not in best or cost < best[group][0]:
                best[group] = (cost, case)
        self._cheapest = {g: c.golden_key(op_spec(c.op).golden_version)
                          for g, (_, c) in best.items()}

    def _should_verify(self, spec: OpSpec, case: Case, key: str) -> bool:
        """The cheapest case's golden of each op and dtype in the plan (``designate``; the
        first one fetched in this process when there is no plan), then a share
        ``verify_fetched`` of the rest, chosen by key (the same choice on every machine);
        0 switches it off, 1 recomputes every fetched golden."""
        f = self.verify_fetched
        if f <= 0:
            return False
        group = (spec.name, case.dtype)
        cheapest = getattr(self, "_cheapest", None)
        if f >= 1 or (cheapest.get(group) == key if cheapest is not None and group in cheapest
                      else group not in self._checked_groups):
            self._checked_groups.add(group)
            return True
        return int(key[:8], 16) / 16 ** 8 < f

    def _check_fetched(self, spec, case, key, names, traj, first_inputs, provenance) -> None:
        """Recompute a fetched golden; a mismatch is disputed at the registry, replaced
        in the local store and raised (an ERROR row for every case that uses it)."""
        t0 = time.perf_counter()
        fresh = golden_trajectory(spec, case, first_inputs)
        self.fetched_checks["verified"] += 1
        problem = _difference(names, fresh, traj)
        self.fetched_checks["seconds"] += time.perf_counter() - t0
        if not problem:
            return
        self.fetched_checks["disputed"] += 1
        text = (f"the registry's golden for {key} differs from a recomputation: {problem} "
                f"(disputed at the registry; every client treats it as absent until an "
                f"admin runs verify golden resolve {key[:16]}...)")
        self._disputed[key] = text
        if self.store is not None:
            try:
                self.store.remove(key, drop_blob=True)
                self._store(key, spec, case, names, fresh, provenance)
            except STORE_FAULTS as exc:
                self.degrade(exc)
        try:
            status = self.client.dispute(key, f"{problem} (recomputed by a client)")
            if status not in (200, 201):
                notices.warn(f"reporting the disputed golden {key[:12]}: HTTP {status}")
        except RegistryUnavailable as exc:
            notices.warn(f"reporting the disputed golden {key[:12]}: {exc}")
        raise GoldenDisputed(text)

    def _fetch(self, key: str, expect: dict) -> bool:
        """Stream ``key`` from the registry into the local store: False when there is no
        registry or writable store, the registry lacks it, refuses it or is down, or the
        blob fails its hash or does not carry ``expect`` (then it is computed here)."""
        if self.client is None or self.store is None or self.store.readonly:
            return False
        try:
            return self.client.fetch(key, self.store, expect=expect)
        except RegistryUnavailable as exc:
            self._registry_down(exc)
        except ValueError as exc:  # a hash or provenance mismatch: compute instead
            notices.warn(f"golden {key[:12]} from the registry was rejected: {exc}")
        except STORE_FAULTS as exc:
            self.degrade(exc)
        return False

    def _registry_down(self, exc: Exception) -> None:
        if self.required:
            raise RegistryUnavailable(f"golden registry required but unavailable: {exc}")
        notices.warn(f"golden registry unavailable ({exc}); goldens come from the local "
                     f"store or are computed")
        self.client = None

    def degrade(self, exc: BaseException) -> None:
        """The store failed: the rest of the run computes goldens in memory."""
        self.store = None
        notices.warn(store_problem(self.store_dir, exc))

    def _kept(self, key: str, read):
        """What this process remembers under ``key``, else ``read(store)`` (None on a
        store fault, which degrades the run to memory)."""
        if key in self._memory:
            return self._memory[key]
        if self.store is None:
            return None
        try:
            return read(self.store)
        except STORE_FAULTS as exc:
            self.degrade(exc)
            return None

    def _read_local(self, names: list[str], key: str):
        tensors = self._kept(key, lambda store: store.get_tensors(key))
        if tensors is None or key in self._memory:
            return tensors
        return tensors_to_trajectory(tensors, names)

    def get(self, spec: OpSpec, case: Case, first_inputs: dict | None = None) -> Golden:
        key = case.golden_key(spec.golden_version)
        if key in self._disputed:  # every case that used it is an ERROR row
            raise GoldenDisputed(self._disputed[key])
        names = golden_names(spec, case)
        t0 = time.perf_counter()
        traj = self._read_local(names, key)
        if traj is not None:
            return Golden(traj, LOCAL, time.perf_counter() - t0, key, names)
        if first_inputs is None:
            first_inputs = inp.make_inputs(case)
        provenance = _provenance(spec, first_inputs)
        if case.source is not None and self.client is None:
            # a recorded call: a golden cheaper to compute than to store is not stored
            # (thousands of small calls per step; writing each cost more than its math)
            traj, seconds = self._compute(spec, case, first_inputs)
            if seconds < CHEAP_RECORDED_S or self.store is None or self.store.readonly:
                return Golden(traj, COMPUTED, seconds, key, names)
            self._store(key, spec, case, names, traj, provenance)
            return Golden(traj, COMPUTED, seconds, key, names)
        if self.store is not None and self.store.readonly:  # read, never written
            traj, seconds = self._compute(spec, case, first_inputs)
            self._remember(key, traj)
            return Golden(traj, COMPUTED, seconds, key, names)
        if self._fetch(key, provenance):
            traj = self._read_local(names, key)
            if traj is not None:
                if self._should_verify(spec, case, key):
                    self._check_fetched(spec, case, key, names, traj, first_inputs, provenance)
                return Golden(traj, REGISTRY, time.perf_counter() - t0, key, names)
        if self.store is not None:
            try:
                with self.store.lock(key):
                    traj = self._read_local(names, key)  # another process may have made it
                    if traj is not None:
                        return Golden(traj, LOCAL, time.perf_counter() - t0, key, names)
                    traj, seconds = self._compute(spec, case, first_inputs)
                    self._store(key, spec, case, names, traj, provenance)
            except STORE_FAULTS as exc:  # the lock itself could not be taken
                self.degrade(exc)
        if self.store is None:
            traj, seconds = self._compute(spec, case, first_inputs)
            self._remember(key, traj)
            return Golden(traj, COMPUTED, seconds, key, names)
        self._push(key)
        return Golden(traj, COMPUTED, seconds, key, names)

    def derived(self, key: str, base_key: str, kind: str, spec: OpSpec, case: Case,
                first_inputs: dict, names: list[str], compute) -> list[tuple]:
        """A trajectory derived from a case's golden (its compute-precision floor): read
        from the local store, or computed once by ``compute()`` under the key's lock and
        stored beside the golden (meta ``derived``: its kind and the golden's key). Not
        pushed to the registry: any client derives it from the golden's own inputs."""
        traj = self._read_local(names, key)
        if traj is not None:
            return traj
        if case.source is not None:  # a recorded call: stored only when costly (get())
            t0 = time.perf_counter()
            traj = compute()
            if time.perf_counter() - t0 >= CHEAP_RECORDED_S and self.store is not None \
                    and not self.store.readonly:
                meta = _record(spec, case, names, _provenance(spec, first_inputs),
                               derived={"kind": kind, "of": base_key})
                try:
                    self.store.put_tensors(key, trajectory_to_tensors(traj, names), meta)
                except STORE_FAULTS as exc:
                    self.degrade(exc)
            return traj
        if self.store is not None and not self.store.readonly:
            try:
                with self.store.lock(key):
                    traj = self._read_local(names, key)
                    if traj is not None:
                        return traj
                    traj = compute()
                    meta = _record(spec, case, names, _provenance(spec, first_inputs),
                                   derived={"kind": kind, "of": base_key})
                    self.store.put_tensors(key, trajectory_to_tensors(traj, names), meta)
                    return traj
            except STORE_FAULTS as exc:
                self.degrade(exc)
        traj = compute()
        self._remember(key, traj)
        return traj

    def figures(self, key: str, spec: OpSpec | None = None,
                first_inputs: dict | None = None) -> dict | None:
        """Small figures derived from a golden (its floors: verify/golden/floors.py),
        kept in the store entry's meta, else (given the case's spec and inputs, whose
        provenance they must carry) fetched from the registry, the key then in
        ``fetched_figures``; None when kept nowhere yet."""
        if key in self._memory:
            return self._memory[key]
        read = lambda store: store.entry(key)  # noqa: E731
        entry = self._kept(key, read)
        if entry is None and spec is not None and first_inputs is not None \
                and self.client is not None and key not in self.disputed_figures \
                and self._fetch(key, _provenance(spec, first_inputs)):
            entry = self._kept(key, read)
            if entry is not None:
                self.fetched_figures.add(key)
        return None if entry is None else entry.meta.get("figures")

    def check_figures(self, key: str) -> bool:
        """Whether floor figures fetched under ``key`` are recomputed here: the share
        ``verify_fetched`` of them, chosen by key (the same choice on every machine)."""
        f = self.verify_fetched
        return f >= 1 or (f > 0 and int(key[:8], 16) / 16 ** 8 < f)

    def dispute_figures(self, key: str, problem: str) -> None:
        """Fetched floor figures differ from this machine's: disputed at the registry (so
        every client computes its own until an admin resolves it), dropped here."""
        notices.warn(f"the registry's floor figures {key[:12]} differ from a recomputation: "
                     f"{problem} (disputed at the registry; computed here instead)")
        self.fetched_figures.discard(key)
        self.disputed_figures.add(key)
        if self.store is not None:
            try:
                self.store.remove(key, drop_blob=True)
            except STORE_FAULTS as exc:
                self.degrade(exc)
        try:
            self.client.dispute(key, f"{problem} (recomputed by a client)")
        except RegistryUnavailable as exc:
            notices.warn(f"reporting the disputed floor figures {key[:12]}: {exc}")

    def keep_figures(self, key: str, base_key: str, kind: str, spec: OpSpec, case: Case,
                     first_inputs: dict, figures: dict) -> None:
        """Store ``figures`` beside the golden ``base_key`` (a recorded call's, and those of
        a run without a writable store, stay in this process's memory)."""
        self._remember(key, figures)
        if case.source is not None or self.store is None or self.store.readonly:
            return
        meta = _record(spec, case, [], _provenance(spec, first_inputs),
                       derived={"kind": kind, "of": base_key}, figures=figures)
        try:
            with self.store.lock(key):
                self.store.put_tensors(key, {"figures": torch.zeros(1)}, meta)
        except STORE_FAULTS as exc:
            self.degrade(exc)
            return
        if key not in self.disputed_figures:  # shared, so other machines compute none
            self._push(key, quiet_conflict=True)

    @staticmethod
    def _compute(spec, case, first_inputs):
        t1 = time.perf_counter()
        traj = golden_trajectory(spec, case, first_inputs)
        return traj, time.perf_counter() - t1

    def _store(self, key, spec, case, names, traj, provenance: dict) -> None:
        meta = _record(spec, case, names, provenance)
        try:
            self.store.put_tensors(key, trajectory_to_tensors(traj, names), meta)
        except STORE_FAULTS as exc:
            self.degrade(exc)
            self._remember(key, traj)

    def _remember(self, key: str, traj) -> None:
        self._memory[key] = traj
        while len(self._memory) > MEMORY_GOLDENS:
            self._memory.pop(next(iter(self._memory)))

    def _push(self, key: str, quiet_conflict: bool = False) -> bool:
        """Push a stored golden when a write token is set; True when the registry took it.
        ``quiet_conflict``: the registry holding other content (409) is no warning (floor
        figures completed here after another machine pushed the first of them)."""
        if self.client is None or not self.client.token or self.store is None:
            return False
        if getattr(self, "_push_refused", False):
            return False
        try:
            status = self.client.push(key, self.store)
            if status in (401, 403):  # one line per run, not one per golden
                self._push_refused = True
                notices.warn(f"the golden registry {self.client.url} refused this run's write "
                             f"token (HTTP {status}): check VERIFY_REGISTRY_TOKEN (the "
                             f"service's write token; a read token cannot push); goldens of "
                             f"this run stay in the local store")
            elif status not in (200, 201) and not (quiet_conflict and status == 409):
                notices.warn(f"pushing golden {key[:12]} to the registry: HTTP {status}")
            return status in (200, 201)
        except RegistryUnavailable as exc:
            self._registry_down(exc)
        except STORE_FAULTS as exc:
            self.degrade(exc)
        return False

    def publish(self, key: str) -> bool:
        """Make sure the registry holds a golden of the store (a cluster run's golden task:
        kernel tasks on other nodes fetch it from there); True when it was pushed now."""
        if self.client is None or not self.client.token:
            return False
        try:
            if self.client.exists(key):
                return False
        except RegistryUnavailable as exc:
            self._registry_down(exc)
            return False
        return self._push(key)


def _record(spec: OpSpec, case: Case, names: list[str], provenance: dict, **extra) -> dict:
    """What a stored golden (or an entry derived from it) says it was computed from."""
    return {"op": spec.name, "case_id": case.id, "dtype": case.dtype, "outputs": names,
            "steps": case.steps, "case": case.canonical(), **provenance, **extra}


def _difference(names, fresh, kept) -> str:
    """'' when two trajectories are the same golden (bit for bit, or within SAME_RTOL of
    each element's magnitude, NaN matching NaN); else where they differ first."""
    if len(fresh) != len(kept):
        return f"{len(kept)} steps fetched, {len(fresh)} recomputed"
    for s, (a_step, b_step) in enumerate(zip(fresh, kept)):
        for name, a, b in zip(names, a_step, b_step):
            a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
            if a64.shape != b64.shape:
                return f"step {s + 1} output {name}: shape {list(b64.shape)} fetched, " \
                       f"{list(a64.shape)} recomputed"
            same = (a64 == b64) | (a64.isnan() & b64.isnan()) | \
                ((a64 - b64).abs() <= SAME_RTOL * torch.maximum(a64.abs(), b64.abs()))
            if not bool(same.all()):
                diff = (a64 - b64).abs().nan_to_num(float("inf")).max().item()
                return (f"step {s + 1} output {name}: max |fetched - recomputed| {diff:.3e} "
                        f"at {int((~same).sum())} of {same.numel()} elements")
    return ""


def _provenance(spec: OpSpec, first_inputs: dict) -> dict:
    """What a golden was computed from, stored in its blob and checked on every fetch:
    the golden version (the code of the golden and what it reaches) and the fingerprint
    of the case's inputs as this machine makes them."""
    return {"golden_version": spec.golden_version, "inputs_sha": inp.fingerprint(first_inputs)}


def store_problem(store_dir: str, exc: BaseException) -> str:
    """One warning for a store that failed, with what to do about it."""
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if "locked" in low or isinstance(exc, Timeout):
        hint = "another process holds its index or a lock; wait for it, or stop it"
    elif "readonly" in low or "read-only" in low or "permission" in low:
        hint = "it is read-only here; give a writable --store (or VERIFY_STORE)"
    elif "full" in low or "no space" in low or "i/o" in low:
        hint = "its disk is full or failing; free space, or give another --store"
    elif "not a database" in low or "malformed" in low:
        hint = f"delete {store_dir}/index.sqlite to rebuild it from the blobs"
    else:
        hint = "check the folder, or give another --store"
    return (f"golden store {store_dir} degraded ({text}): this run computes its goldens "
            f"in memory and stores none; {hint}")


def configure(store: str | None = None, registry: str | None = None,
              required: bool = False, verify_fetched: float | None = None) -> GoldenResolver:
    """A run's golden sources (``--store``, ``--registry``, ``--registry-required``,
    ``--verify-fetched``; defaults from VERIFY_STORE and VERIFY_REGISTRY): a new resolver,
    held by the run's context (verify/running/context.py), never a module global."""
    store_dir = str(store or default_store_dir())
    if os.path.exists(store_dir) and not os.path.isdir(store_dir):
        raise ConfigError(f"--store {store_dir}: not a folder")
    try:
        store_obj = GoldenStore(store_dir)
        if store_obj.rebuilt is not None:
            n, kept = store_obj.rebuilt
            notices.warn(f"golden store {store_dir}: its index was corrupt and was rebuilt "
                         f"from {n} blobs (the corrupt one kept as {kept})")
    except STORE_FAULTS as exc:
        store_obj = None
        notices.warn(store_problem(store_dir, exc))
    url = registry or os.environ.get("VERIFY_REGISTRY") or None
    client = RegistryClient(url) if url else None
    if required and client is None:
        raise ConfigError("--registry-required needs --registry URL (or VERIFY_REGISTRY)")
    if client is not None and not client.healthy():
        if required:
            raise ConfigError(f"golden registry {url} is not reachable (--registry-required)")
        notices.warn(f"golden registry {url} is not reachable; goldens come from the local "
                     f"store or are computed")
        client = None
    return GoldenResolver(store_obj, client, required, store_dir,
                          VERIFY_FETCHED if verify_fetched is None else verify_fetched)


_DEFAULT: list[GoldenResolver] = []
_DEFAULT_LOCK = threading.Lock()


def resolver() -> GoldenResolver:
    """The default sources (VERIFY_STORE, VERIFY_REGISTRY), for code outside a run: one
    per process, made on first use. A run uses its own (``configure``)."""
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            _DEFAULT.append(configure())
        return _DEFAULT[0]
