"""``verify run --ray``: the same plan as an xdist run, executed as Ray tasks over a
cluster of NPU / GPU / CPU nodes; the driver (this process) writes the usual reports.

- Goldens: one CPU task per golden key (on nodes declaring a ``golden`` resource where
  there are any, with a memory request sized from the shapes); a kernel task is submitted
  only once its case's golden exists, so each golden is computed once per run.
- Kernel cases: one task per case x kernel, requesting its backend's device (``NPU``,
  ``num_gpus``, or CPU), ``max_calls=1`` (Ray reuses NPU workers otherwise, and a device
  runtime keeps the first device it saw), ``max_retries=0``: the driver owns retries.
- Faults are rows: a dead kernel process, a case past ``--case-timeout`` (counted from
  the task's start), a lost node after ``--retries`` resubmissions.

Ray is an optional extra (``kernel-verify[ray]``), imported only here.
"""
from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field

from verify.running import deadline
from verify.running import runner
from verify import notices
from verify.specs import registry
from verify.cases import shards
from verify.errors import ConfigError
from verify.running.ray_tasks import NodeContext

RAY_EXTRA = "pip install 'kernel-verify[ray]'"
POLL_S = 0.25          # how often the driver looks at finished tasks and the clock
GOLDEN_CPUS = 1        # CPUs of a golden task
GOLDEN_FACTOR = 4      # memory of a golden task: float64 inputs x this (outputs, temporaries)
OBJECT_STORE_BYTES = 256 << 20  # a local cluster's object store: rows only travel through it
_LOST = ("NodeDiedError", "ObjectLostError", "OwnerDiedError", "LocalRayletDiedError",
         "ObjectFetchTimedOutError", "RaySystemError")


class RegistryAway(Exception):
    """The registry is required (--registry-required) and went away mid-run: exit 2."""


def prepare(spec: str) -> dict:
    """The parsed ``--ray`` spec, with Ray importable (else a usage error naming the
    extra): checked before a run plans anything. For an explicit HOST:PORT the token
    settings go first, as Ray reads RAY_AUTH_MODE when it is imported."""
    how = parse_spec(spec)
    if how.get("address", "auto") != "auto" and "ray" not in sys.modules:
        _token_auth_when_a_token_is_here()
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed here: {RAY_EXTRA}") from None
    return how


_LOCAL = re.compile(r"local(?::(.*))?")
_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9.\-\[\]:]+:\d{1,5}")


def parse_spec(spec: str) -> dict:
    """``auto`` (RAY_ADDRESS or the running head), ``HOST:PORT``, ``local`` (a cluster in
    this process with this machine's resources) or ``local:NPU=4,golden=1,CPU=2,GPU=1``
    (declared, possibly fake, resources). Anything else is a usage error."""
    text = (spec or "").strip()
    if text == "auto":
        return {"address": "auto"}
    m = _LOCAL.fullmatch(text)
    if m:
        resources, num_cpus, num_gpus = {}, None, None
        for part in filter(None, (p.strip() for p in (m.group(1) or "").split(","))):
            name, _, value = part.partition("=")
            try:
                amount = float(value)
            except ValueError:
                amount = -1.0
            if not name or not math.isfinite(amount) or amount < 0:
                raise ConfigError(f"--ray {spec}: '{part}' is not RESOURCE=AMOUNT (e.g. "
                                  f"local:NPU=4,golden=1)")
            if name == "CPU":
                num_cpus = int(amount)
            elif name == "GPU":
                num_gpus = int(amount)
            else:
                resources[name] = amount
        return {"local": True, "num_cpus": num_cpus, "num_gpus": num_gpus,
                "resources": resources}
    if _ADDRESS.fullmatch(text):
        return {"address": text}
    raise ConfigError(f"--ray {spec!r}: expected auto, HOST:PORT, local or "
                      f"'local:NPU=4,golden=1'")


def connect(spec: str):
    """ray.init for the spec; returns (ray, started_here)."""
    how = prepare(spec)
    import ray
    common = {"log_to_driver": False, "logging_level": "WARNING", "include_dashboard": False}
    if ray.is_initialized():  # a caller (a test, a notebook) connected already
        return ray, False
    # Ray logs a traceback when it cannot name the NPU type (no CANN's acl: fake NPUs, a
    # CPU driver node); the resource works without it
    logging.getLogger("ray._private.accelerators.npu").setLevel(logging.CRITICAL)
    if how.get("local"):
        os.environ.setdefault("RAY_task_oom_retries", "0")  # inherited by the raylet
        ray.init(num_cpus=how["num_cpus"], num_gpus=how["num_gpus"],
                 resources=how["resources"] or None, object_store_memory=OBJECT_STORE_BYTES,
                 **common)
    else:
        common.pop("include_dashboard")
        try:
            ray.init(address=how["address"], **common)
        except ConnectionError as exc:
            raise ConfigError(f"--ray {spec}: no Ray cluster there ({exc})") from None
    return ray, True


def _token_auth_when_a_token_is_here() -> None:
    """Ray turns token auth on by itself only for clusters it finds (``auto``), not for an
    explicit HOST:PORT: with a token at hand (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
    ~/.ray/auth_token) and RAY_AUTH_MODE unset, use it."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(path):
        os.environ["RAY_AUTH_MODE"] = "token"


# -- what a case needs -----------------------------------------------------------------

def device_request(backend: registry.Backend) -> dict:
    """The Ray resources a kernel task of this backend asks for: its accelerator (the
    backend's ``resources``, else from its device) and one CPU (task options; max_calls=1
    and max_retries=0 are set on the remote function itself)."""
    if backend.resources is not None:
        wanted = dict(backend.resources)
    elif backend.device.startswith("npu"):
        wanted = {"NPU": 1}
    elif backend.device.startswith("cuda"):
        wanted = {"GPU": 1}
    else:
        wanted = {}
    options = {"num_cpus": wanted.pop("CPU", 1)}
    if "GPU" in wanted:
        options["num_gpus"] = wanted.pop("GPU")
    if wanted:
        options["resources"] = wanted
    return options


def skipped_anywhere(case, kern) -> bool:
    """The item is a SKIP row whatever node runs it (runner.skip_reason): the driver writes
    that row itself instead of starting a process for it."""
    return bool(runner.skip_reason(case, kern, registry.backend(kern.backend)))


def golden_key_of(case, kern) -> str | None:
    """The golden this item reads, or None when it reads none (an expected-error case, a
    case its kernel or backend does not take): the same decisions as runner._run_case."""
    if case.expect_error or skipped_anywhere(case, kern):
        return None
    case = runner.judged_case(case, kern)
    return case.golden_key(registry.op(case.op).golden_version)


def golden_memory(case) -> int:
    """Bytes a golden task asks Ray for: its float64 inputs times GOLDEN_FACTOR (inputs,
    outputs, temporaries), times the steps it keeps (at most 4: multi-step cases are
    small)."""
    elements = sum(math.prod(s) for s in case.input_shapes.values())
    return int(8 * elements * GOLDEN_FACTOR * min(max(1, case.steps), 4))


# -- the run -------------------------------------------------------------------------

@dataclass
class Options:
    spec: str
    context: NodeContext
    retries: int = 1
    progress_every: float = 10.0


@dataclass
class Outcome:
    rows: list[dict]
    warnings: list[str]
    nodes: dict[str, dict]           # worker label's node -> its environment
    info: dict = field(default_factory=dict)  # cluster, timings, counts for results.json


@dataclass
class _Attempt:
    kind: str                        # golden | kernel
    index: int                       # item index (kernel) or golden key's index
    number: int                      # 1, 2, ...
    submitted: float
    token: str
    cancelled: str = ""              # why the driver cancelled it


def execute(items: list, opts: Options) -> Outcome:
    """Run ``items`` (case, kernel) on the cluster; every item ends as rows."""
    ray, started_here = connect(opts.spec)
    try:
        return _Run(ray, items, opts).go()
    finally:
        if started_here:
            ray.shutdown()


class _Run:
    def __init__(self, ray, items, opts: Options):
        self.ray, self.items, self.opts = ray, items, opts
        self.ctx = opts.context
        self._read_cluster()
        self.rows: dict[int, list[dict]] = {}
        self.warnings: dict[str, None] = {}
        self.nodes: dict[str, dict] = {}
        self.pending: dict = {}      # ObjectRef -> _Attempt
        self.by_key: dict[str, list[int]] = {}
        self.keys: list[str] = []
        self.golden_results: dict[str, dict] = {}
        self.task_times: list[dict] = []
        self.retried = 0
        self.lost_seen: list[float] = []  # when the driver learnt of each lost task
        self.last_progress = self.progress_start = time.monotonic()
        from verify.running import ray_tasks
        # Retries are the driver's, not Ray's (max_retries=0). Golden tasks reuse their
        # processes (imports paid once) in a pool of their own: a runtime env of their own
        # keeps Ray from handing a golden process, which imported the user's modules
        # without a device, to a kernel task.
        self.golden_fn = ray.remote(max_retries=0, runtime_env={
            "env_vars": {"VERIFY_RAY_POOL": "goldens"}})(ray_tasks.golden_task)
        # max_calls=1: a fresh process per case (Ray would reuse a worker, whose device
        # runtime keeps the first device it saw)
        self.kernel_fn = ray.remote(max_calls=1, max_retries=0)(ray_tasks.kernel_task)
        # the clock lives on the driver's node, so a lost worker node cannot take it along
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.clock = ray.remote(num_cpus=0)(ray_tasks.RunClock).options(
            scheduling_strategy=here).remote()
        self.starts: dict[str, tuple[float, dict]] = {}

    def _read_cluster(self) -> None:
        """What the live nodes offer: resources in all, and the largest node's memory (a
        golden task asks for no more than that, or it would wait forever)."""
        self.cluster = self.ray.cluster_resources()
        self.largest_memory = max((n.get("Resources", {}).get("memory", 0)
                                   for n in self.ray.nodes() if n.get("Alive")), default=0)

    # submission
    def _golden_options(self, case) -> dict:
        options = {"num_cpus": GOLDEN_CPUS}
        if self.cluster.get("golden", 0) >= 1:
            options["resources"] = {"golden": 1}
        if self.largest_memory:  # never more than a node has: the task would wait forever
            options["memory"] = min(golden_memory(case), int(self.largest_memory * 0.9))
        return options

    def _submit_golden(self, i: int, number: int = 1) -> None:
        key = self.keys[i]
        case = self.items[self.by_key[key][0]][0]
        token = f"golden-{i}-{number}"
        ref = self.golden_fn.options(**self._golden_options(case)).remote(
            self.ctx, case, key, self.clock, token)
        self.pending[ref] = _Attempt("golden", i, number, time.time(), token)

    def _submit_kernel(self, i: int, number: int = 1) -> None:
        case, kern = self.items[i]
        options = device_request(registry.backend(kern.backend))
        missing = [r for r, amount in {**options.get("resources", {}),
                                       "GPU": options.get("num_gpus", 0)}.items()
                   if amount and self.cluster.get(r, 0) < amount]
        if missing:
            self.rows[i] = [runner.vanished_row(
                case, kern, f"no node of the Ray cluster has {' and '.join(missing)} "
                            f"(backend {kern.backend} needs it; cluster: "
                            f"{_resources_text(self.cluster)})")]
            return
        token = f"kernel-{i}-{number}"
        ref = self.kernel_fn.options(**options).remote(self.ctx, case, kern.backend,
                                                       kern.name, self.clock, token)
        self.pending[ref] = _Attempt("kernel", i, number, time.time(), token)

    def go(self) -> Outcome:
        started = time.time()
        order = sorted(range(len(self.items)),
                       key=lambda i: -shards.expected_cost(*self.items[i]))
        no_golden: list[int] = []  # expected-error cases: their kernels run at once
        for i in order:
            if skipped_anywhere(*self.items[i]):
                self.rows[i] = [dict(r, worker="driver", attempts=0)
                                for r in runner.run_case(*self.items[i])]
                continue
            key = golden_key_of(*self.items[i])
            if key is None:
                no_golden.append(i)
                continue
            if key not in self.by_key:
                self.by_key[key] = []
                self.keys.append(key)
            self.by_key[key].append(i)
        for g in range(len(self.keys)):
            self._submit_golden(g)
        for i in no_golden:
            self._submit_kernel(i)
        while self.pending:  # whatever finished within POLL_S, then the time limits
            ready, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending),
                                     timeout=POLL_S)
            for ref in ready:
                self._finished(ref, self.pending.pop(ref))
            self._enforce_limits()
            self._progress()
        rows = [r for i in range(len(self.items)) for r in self.rows.get(i, [])]
        info = self._info(started)
        return Outcome(rows, list(self.warnings), self.nodes, info)

    # results
    def _finished(self, ref, att: _Attempt) -> None:
        try:
            result = self.ray.get(ref)
        except Exception as exc:  # Ray's errors: the task, its process or its node failed
            self._failed(att, exc)
            return
        self.warnings.update(dict.fromkeys(result.get("warnings", [])))
        if att.kind == "golden":
            self._golden_done(att, result)
            return
        rows = result["rows"]
        for r in rows:
            r["attempts"] = att.number
        self.rows[att.index] = rows
        node = result["place"]["worker"].rsplit(":", 1)[0]
        self.nodes.setdefault(node, result["environment"])
        self.task_times.append({"submit_to_start": result["started"] - att.submitted,
                                "process": result.get("process_s") or 0.0,
                                "setup": result["setup_s"], "case": result["case_s"]})

    def _golden_done(self, att: _Attempt, result: dict) -> None:
        key = self.keys[att.index]
        if result.get("kind") == "registry" and self.ctx.registry_required:
            self._cancel_all()
            raise RegistryAway(f"golden registry required but unavailable: {result['error']}")
        self._golden_settled(key, result)

    def _golden_settled(self, key: str, result: dict) -> None:
        """The golden task of ``key`` ended: its kernel tasks go. When it failed, they
        meet the same error (or compute the golden themselves) and make it their rows."""
        if "error" in result:
            self.warnings.setdefault(f"golden task for {key[:12]} failed: {result['error']}")
        elif "floors_error" in result:  # its kernel tasks compute the floors themselves
            self.warnings.setdefault(f"golden task for {key[:12]} kept no floors: "
                                     f"{result['floors_error']}")
        self.golden_results[key] = result
        for i in self.by_key[key]:
            self._submit_kernel(i)

    def _failed(self, att: _Attempt, exc: BaseException) -> None:
        name = type(exc).__name__
        start = self.starts.get(att.token) or self._start_of(att.token)
        place = start[1] if start else None
        where = place["worker"] if place else "a node (the task had not started)"
        if att.cancelled:
            reason = att.cancelled
        elif self._node_lost(exc, place):
            self.lost_seen.append(time.time())
            if att.number <= self.opts.retries:
                self.retried += 1
                # what the surviving nodes offer: a case whose resource went with the lost
                # node(s) becomes an ERROR row instead of waiting for it forever
                self._read_cluster()
                (self._submit_golden if att.kind == "golden" else self._submit_kernel)(
                    att.index, att.number + 1)
                return
            reason = (f"node lost: {where} went away ({name}); tried {att.number} time(s), "
                      f"--retries {self.opts.retries}")
        elif name == "WorkerCrashedError":
            reason = (f"kernel process died (a signal, a segfault or an OOM kill) on {where}: "
                      f"{_first_line(exc)}")
        elif name == "OutOfMemoryError":
            reason = f"out of memory on {where} (Ray's memory monitor): {_first_line(exc)}"
        elif name == "TaskCancelledError":
            reason = f"cancelled on {where}"
        else:
            cause = getattr(exc, "cause", None) or exc
            reason = f"harness error on {where}: {type(cause).__name__}: {_first_line(cause)}"
        if att.kind == "golden":
            key = self.keys[att.index]
            self._golden_settled(key, {"key": key, "error": reason})
            return
        case, kern = self.items[att.index]
        row = runner.vanished_row(case, kern, reason)
        row["attempts"] = att.number
        if place:
            row["worker"] = place["worker"]
        self.rows[att.index] = [row]

    def _node_lost(self, exc, place) -> bool:
        if type(exc).__name__ in _LOST:
            return True
        if type(exc).__name__ != "WorkerCrashedError" or not place:
            return False
        alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
        return place["node_id"] not in alive

    def _start_of(self, token: str):
        self._refresh_starts()
        return self.starts.get(token)

    def _refresh_starts(self) -> None:
        try:
            self.starts = self.ray.get(self.clock.starts.remote(), timeout=30)
        except Exception:  # the clock's node went away: keep what we knew
            pass

    # limits
    def _enforce_limits(self) -> None:
        kernels = [(ref, att) for ref, att in self.pending.items()
                   if att.kind == "kernel" and not att.cancelled]
        if not kernels:
            return
        self._refresh_starts()
        now = time.time()
        for ref, att in kernels:
            start = self.starts.get(att.token)
            if start is None:
                continue
            case, _ = self.items[att.index]
            limit = deadline.seconds_for(case.level, self.ctx.case_timeout)
            if limit and now - start[0] > limit + deadline.STUCK_GRACE:
                att.cancelled = (f"timed out after {limit:g} s on {start[1]['worker']}, and "
                                 f"never returned to Python (its process was ended; "
                                 f"--case-timeout {limit:g}, 0: no limit)")
                self.ray.cancel(ref, force=True)

    def _cancel_all(self) -> None:
        for ref in list(self.pending):
            try:
                self.ray.cancel(ref, force=True)
            except Exception:
                pass
        self.pending.clear()

    def _progress(self) -> None:
        every = self.opts.progress_every
        now = time.monotonic()
        if every <= 0 or now - self.last_progress < every:
            return
        self.last_progress = now
        running = sum(1 for a in self.pending.values() if a.kind == "kernel")
        goldens = sum(1 for a in self.pending.values() if a.kind == "golden")
        line = notices.progress_text(len(self.rows), len(self.items),
                                     now - self.progress_start)
        print(f"{line}; {running} kernel and {goldens} golden task(s) queued or running on "
              f"Ray", file=sys.stderr, flush=True)

    def _info(self, started: float) -> dict:
        nodes = self.ray.nodes()
        computed = sum(1 for g in self.golden_results.values()
                       if g.get("source") == "computed")
        times = self.task_times

        def median(name):
            values = sorted(t[name] for t in times)
            return round(values[len(values) // 2], 3) if values else None
        return {"executor": "ray", "ray": self.ray.__version__,
                "cluster": _resources_text(self.cluster),
                "nodes_alive_at_end": sum(1 for n in nodes if n.get("Alive")),
                "golden_keys": len(self.keys), "goldens_computed": computed,
                "golden_tasks": {k: {**{f: v for f, v in g.items() if f in
                                        ("source", "seconds", "error", "pushed", "floors",
                                         "floors_source", "floors_s", "floors_error")},
                                     "worker": g.get("place", {}).get("worker")}
                                 for k, g in self.golden_results.items()},
                "kernel_tasks": len(times), "resubmitted": self.retried,
                "node_loss_seen": self.lost_seen,
                "median_submit_to_start_s": median("submit_to_start"),
                # of which the task's own process starting (Python, Ray, torch imports)
                "median_process_start_s": median("process"),
                "median_setup_s": median("setup"), "median_case_s": median("case"),
                "wall_s": round(time.time() - started, 3)}


def node_lines(nodes: dict[str, dict]) -> dict[str, str]:
    """The report's environment lines of the nodes that ran cases."""
    return {f"node {name}": ", ".join(f"{k} {v}" for k, v in env.items())
            for name, env in sorted(nodes.items())}


def _resources_text(resources: dict) -> str:
    shown = {k: v for k, v in resources.items()
             if not k.startswith(("node:", "accelerator_type:")) and k not in
             ("memory", "object_store_memory")}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(shown.items())) or "none"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
