"""Where a run's goldens come from: the local store, then the registry service, then
computed (and stored, and pushed when a write token is set).

One computation per golden across processes: the computing process holds the key's file
lock; another process that wants the same key waits, then reads it from the store.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

from . import inputs as inp
from .cases import Case
from .errors import ConfigError
from .registry import OpSpec
from .registry_client import RegistryClient, RegistryUnavailable
from .store import GoldenStore, default_store_dir, tensors_to_trajectory, trajectory_to_tensors

log = logging.getLogger("verify.goldens")

COMPUTED, LOCAL, REGISTRY = "computed", "local", "registry"


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


def _golden_with_grads(spec: OpSpec, case: Case, args: dict, params: dict) -> tuple:
    """Forward outputs and the float64 gradients of the wrt inputs, by autograd through
    the golden with the case's upstream gradients."""
    leaves = {w: args[w].clone().requires_grad_(True) for w in spec.grads.wrt
              if args.get(w) is not None}
    with torch.enable_grad():
        outs = _as_tuple(spec.golden_fn(**{**args, **leaves}, **params))
    names = spec.active_golden_outputs(params)
    by_name = dict(zip(names, outs))
    upstream = upstream_for(spec, case, by_name)
    pairs = [(by_name[k[5:]], v.to(torch.float64)) for k, v in upstream.items()
             if by_name[k[5:]].requires_grad]
    grads = torch.autograd.grad([p[0] for p in pairs], list(leaves.values()),
                                grad_outputs=[p[1] for p in pairs], allow_unused=True)
    grads = [torch.zeros_like(leaf) if g is None else g
             for g, leaf in zip(grads, leaves.values())]
    return tuple(o.detach() for o in outs) + tuple(g.detach() for g in grads)


def _as_tuple(outs) -> tuple:
    return (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)


def golden_trajectory(spec: OpSpec, case: Case,
                      first_inputs: dict | None = None) -> list[tuple[torch.Tensor, ...]]:
    """float64 outputs of every step (with the gradients for a backward case); each
    step's outputs feed the next step's inputs.

    ``first_inputs``: the case's inputs if the caller already made them (saves a copy).
    """
    first = first_inputs if first_inputs is not None else inp.make_inputs(case)
    current = {k: _f64(v) for k, v in first.items()}
    params = dict(case.params)
    names = spec.active_golden_outputs(params)
    out_steps = []
    for step in range(case.steps):
        if step:
            fresh = inp.make_inputs(case, step, [i.name for i in spec.inputs if i.per_step])
            current.update({k: _f64(v) for k, v in fresh.items()})
            if spec.step_param:
                params[spec.step_param] = case.params[spec.step_param] + step
        if case.backward:
            outs = _golden_with_grads(spec, case, current, params)
        else:
            outs = _as_tuple(spec.golden_fn(**current, **params))
        out_steps.append(outs)
        for in_name, out_name in spec.feedback.items():
            current[in_name] = outs[names.index(out_name)]
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


class GoldenResolver:
    def __init__(self, store: GoldenStore, client: RegistryClient | None = None,
                 required: bool = False):
        self.store = store
        self.client = client
        self.required = required
        self._warned = False

    def _registry_down(self, exc: Exception) -> None:
        if self.required:
            raise RegistryUnavailable(f"golden registry required but unavailable: {exc}")
        if not self._warned:
            log.warning("golden registry unavailable (%s); using the local store and "
                        "computing what is missing", exc)
            self._warned = True
        self.client = None

    def _read_local(self, names: list[str], key: str):
        tensors = self.store.get_tensors(key)
        if tensors is None:
            return None
        return tensors_to_trajectory(tensors, names)

    def get(self, spec: OpSpec, case: Case, first_inputs: dict | None = None) -> Golden:
        key = case.golden_key(spec.golden_version)
        names = golden_names(spec, case)
        t0 = time.perf_counter()
        traj = self._read_local(names, key)
        if traj is not None:
            return Golden(traj, LOCAL, time.perf_counter() - t0, key, names)
        if self.client is not None:
            try:
                if self.client.fetch(key, self.store):
                    traj = self._read_local(names, key)
                    if traj is not None:
                        return Golden(traj, REGISTRY, time.perf_counter() - t0, key, names)
            except RegistryUnavailable as exc:
                self._registry_down(exc)
            except ValueError as exc:  # a hash mismatch in transit: compute instead
                log.warning("golden %s from the registry was rejected: %s", key[:12], exc)
        with self.store.lock(key):
            traj = self._read_local(names, key)  # another process may have just made it
            if traj is not None:
                return Golden(traj, LOCAL, time.perf_counter() - t0, key, names)
            t1 = time.perf_counter()
            traj = golden_trajectory(spec, case, first_inputs)
            seconds = time.perf_counter() - t1
            meta = {"op": spec.name, "case_id": case.id, "golden_version": spec.golden_version,
                    "outputs": names, "steps": case.steps,
                    "case": case.canonical()}
            try:
                self.store.put_tensors(
                    key, trajectory_to_tensors(traj, names), meta)
            except OSError as exc:
                log.warning("golden %s could not be stored: %s", key[:12], exc)
                return Golden(traj, COMPUTED, seconds, key, names)
        self._push(key)
        return Golden(traj, COMPUTED, seconds, key, names)

    def _push(self, key: str) -> None:
        if self.client is None or not self.client.token:
            return
        try:
            status = self.client.push(key, self.store)
            if status not in (200, 201):
                log.warning("pushing golden %s to the registry: HTTP %s", key[:12], status)
        except RegistryUnavailable as exc:
            self._registry_down(exc)


_RESOLVER: GoldenResolver | None = None


def configure(store: str | None = None, registry: str | None = None,
              required: bool = False) -> GoldenResolver:
    """Set the run's golden sources (``--store``, ``--registry``, ``--registry-required``;
    defaults from VERIFY_STORE and VERIFY_REGISTRY)."""
    global _RESOLVER
    store_obj = GoldenStore(store or default_store_dir())
    url = registry or os.environ.get("VERIFY_REGISTRY") or None
    client = RegistryClient(url) if url else None
    if required and client is None:
        raise ConfigError("--registry-required needs --registry URL (or VERIFY_REGISTRY)")
    if client is not None and not client.healthy():
        if required:
            raise ConfigError(f"golden registry {url} is not reachable (--registry-required)")
        log.warning("golden registry %s is not reachable; using the local store and computing "
                    "what is missing", url)
        client = None
    _RESOLVER = GoldenResolver(store_obj, client, required)
    return _RESOLVER


def resolver() -> GoldenResolver:
    return _RESOLVER if _RESOLVER is not None else configure()
