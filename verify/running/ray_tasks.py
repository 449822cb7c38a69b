"""What runs on a Ray node under ``verify run --ray``: one golden task per golden key, one
kernel task per case x kernel (see ray_run.py for the driver's side).

Only the case description travels (a small frozen dataclass); inputs are rebuilt from the
case's seed on the node, and goldens go through the node's golden store and the registry,
never through Ray's object store. Each task reports its start to the run's clock, so the
driver times a case from when it began, not from when it was queued.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field


@dataclass
class NodeContext:
    """What every task needs to set up the harness as the driver did."""
    cwd: str  # the driver's working folder (user modules' relative paths start there)
    kernel_modules: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)
    store: str | None = None  # --store; None: the node's own default
    registry: str | None = None
    registry_required: bool = False
    verify_fetched: float | None = None
    case_timeout: float | None = None
    time_repeats: int = 0
    benchmark_backend: str | None = None


_READY: dict[str, str] = {}  # per process: the run (its context) the harness is set up for


def _module_path(spec: str, cwd: str) -> str:
    """A .py module of the driver's as this node can reach it: the same absolute path (a
    shared folder, one machine), else relative to this task's folder (``ray job submit
    --working-dir`` unpacks the driver's folder on every node)."""
    if not (spec.endswith(".py") or os.sep in spec):
        return spec
    absolute = spec if os.path.isabs(spec) else os.path.join(cwd, spec)
    if os.path.isfile(absolute):
        return absolute
    return spec if os.path.isabs(spec) else os.path.abspath(spec)


def setup(ctx: NodeContext):
    """Load the op pack, the user's modules and backends, and build the run context
    (goldens, limits, timing) the driver's selection had; a process reused within one
    run keeps the one it built."""
    if _READY.get("context") == repr(ctx):  # a golden process reused within one run
        return _READY["run"]
    for folder in (ctx.cwd, os.getcwd()):
        if os.path.isdir(folder) and folder not in sys.path:
            sys.path.append(folder)
    from verify.golden import source as golden_source
    from verify.specs import registry
    from verify.running import context
    from verify.cases import selection
    registry.load_builtin()
    for module in ctx.kernel_modules:
        registry.load_user_module(_module_path(module, ctx.cwd))
    registry.load_backends(ctx.backends or None)
    resolver = golden_source.configure(ctx.store, ctx.registry, ctx.registry_required,
                                       ctx.verify_fetched)
    # on_stuck None: the driver ends a task stuck past its limit
    _READY["run"] = context.RunContext(
        resolver=resolver, case_timeout=ctx.case_timeout, time_repeats=ctx.time_repeats,
        benchmark_backend=selection.check_benchmark_backend(ctx.benchmark_backend))
    _READY["context"] = repr(ctx)
    return _READY["run"]


def where() -> dict:
    """This task's node and devices: ids as Ray assigned them."""
    import ray
    rc = ray.get_runtime_context()
    ids = rc.get_accelerator_ids()
    devices = [f"{kind.lower()}{i}" for kind in ("NPU", "GPU") for i in ids.get(kind, [])]
    node = rc.get_node_id()
    ip = ray.util.get_node_ip_address()
    return {"node_id": node, "worker": f"ray:{ip}:{node[:8]}:{','.join(devices) or 'cpu'}"}


def node_environment(device: str) -> dict:
    """The software and device of this node, for the report's environment section: on a
    cluster the driver's environment is not the kernels'."""
    from verify.report import results
    return {**results.versions(("python", "torch", "torch_npu", "triton", "kernel-verify")),
            "cann": _cann_version(), "device": _device_name(device)}


def _cann_version() -> str:
    """CANN's version from the toolkit's version file ('not found' off Ascend nodes)."""
    for home in (os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"),
                 "/usr/local/Ascend/ascend-toolkit/latest"):
        if not home:
            continue
        for name in ("version.cfg", "compiler/version.info", "runtime/version.info"):
            path = os.path.join(home, name)
            try:
                with open(path) as f:
                    for line in f:
                        if "version=" in line.lower():
                            return line.split("=", 1)[1].strip()
            except OSError:
                continue
    return "not found"


def _device_name(device: str) -> str:
    try:
        import torch
        if device.startswith("npu"):
            import torch_npu  # noqa: F401
            return f"npu: {torch.npu.get_device_name(0)}"
        if device.startswith("cuda") and torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)}"
    except Exception as exc:  # a node without the device's runtime
        return f"{device}: unknown ({type(exc).__name__})"
    from verify.report import results
    return results._device()


def _process_age(now: float) -> float | None:
    """Seconds since this process started (Python, Ray's worker, the imports and the
    unpickling of the arguments all come before a task's first line); None off Linux."""
    try:
        return now - os.stat(f"/proc/{os.getpid()}").st_ctime
    except OSError:
        return None


def golden_task(ctx: NodeContext, case, key: str, clock, token: str) -> dict:
    """Resolve or compute one golden into this node's store, and make sure the registry
    has it (so kernel tasks on other nodes fetch it instead of computing it again)."""
    started = time.time()
    place = where()
    clock.started.remote(token, started, place)
    try:
        resolver = setup(ctx).resolver
        from verify.golden import source as golden_source
        from verify.specs import registry
        from verify.specs import inputs as inp
        first_inputs = None if case.expect_error else inp.make_inputs(case)
        golden = resolver.get(registry.op(case.op), case, first_inputs)
        # computed goldens were pushed by get(); one found in this node's store may be
        # missing from the registry, where kernel tasks on other nodes look for it
        pushed = golden.source == golden_source.LOCAL and resolver.publish(key)
        out = {"key": key, "source": golden.source, "seconds": golden.seconds,
               "pushed": pushed}
        # both floors of the golden too, kept and shared beside it: no kernel task
        # computes them (a failure here costs the kernel tasks the work, not the run)
        t0 = time.perf_counter()
        try:
            from verify.running import runner
            book = runner.keep_floors(case, resolver, first_inputs, golden)
            if book is not None:
                out.update(floors=book.size(), floors_source=book.source)
        except Exception as exc:
            out["floors_error"] = f"{type(exc).__name__}: {exc}"
        out["floors_s"] = round(time.perf_counter() - t0, 6)
    except Exception as exc:
        from verify.golden.registry_client import RegistryUnavailable
        kind = "registry" if isinstance(exc, RegistryUnavailable) else "golden"
        out = {"key": key, "error": f"{type(exc).__name__}: {exc}", "kind": kind}
    from verify import notices
    out.update(warnings=notices.drain(), place=place)
    return out


def kernel_task(ctx: NodeContext, case, backend: str, kernel: str, clock, token: str) -> dict:
    """Every row of one case run by one kernel, with where and how long it ran."""
    started = time.time()
    place = where()
    clock.started.remote(token, started, place)
    run_ctx = setup(ctx)
    from verify import notices
    from verify.specs import registry
    from verify.running import runner
    set_up = time.time()
    if getattr(case, "source", None) is not None:  # a recorded call: its backend's kernels
        from verify.cases import recorded
        recorded.register_backend([case])
    kern = next(k for k in registry.kernels(case.op, [backend]) if k.name == kernel)
    rows = runner.run_case(case, kern, run_ctx)
    case_s = time.time() - set_up
    for r in rows:
        r["worker"] = place["worker"]
    return {"rows": rows, "warnings": notices.drain(), "place": place,
            "environment": node_environment(registry.backend(backend).device),
            "started": started, "process_s": _process_age(started),
            "setup_s": set_up - started, "case_s": case_s}


class RunClock:
    """When and where each task started (an actor with no CPU): the driver's time limits
    count from a task's start, not from its submission."""

    def __init__(self):
        self._starts: dict[str, tuple[float, dict]] = {}

    def started(self, token: str, when: float, place: dict) -> None:
        self._starts[token] = (when, place)

    def starts(self) -> dict[str, tuple[float, dict]]:
        return dict(self._starts)
