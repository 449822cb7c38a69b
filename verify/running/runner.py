"""Run one case with one kernel and turn the outcome into result rows.

One row per output (case x backend x kernel x output). Anything the kernel raises becomes
one ERROR row with the exception; a backend that is not available here gives a SKIP row
with its reason. Nothing here stops the run: the next case always runs.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import statistics
import time
import traceback
import weakref

import threading

import torch

from verify.comparator import dtypes as dt
from verify.comparator import metrics
from verify.specs import inputs as inp
from verify.specs import registry
from verify.cases.case import Case
from verify.comparator.comparison import compare, compare_topk, resolve_standard
from verify.report.difftable import worst_elements
from verify.errors import Unsupported
from verify.golden import compute_floor as cfl
from verify.golden.floors import FloorBook
from verify.running import context, deadline
from verify.running import triton_probe
from verify.golden import source as golden_source
from verify.comparator import plotdata
from verify.report import rows as result_rows
from verify.cases import recorded

FLOOR_FIELDS = ("mere", "mare", "max_abs", "max_rel", "rmse", "eb", "ulp_max", "ulp_mean")
VARIANT_FIELDS = ("mere", "mare", "max_abs", "max_rel", "rmse", "v2_match_ratio")
DIFF_ROWS = 10
PLOT_MARGIN = 0.1       # outputs this close to failing get a heat map in any case


def _base_row(case: Case, kern: registry.Kernel, backend: registry.Backend) -> dict:
    return {
        "op": case.op, "case_id": case.id, "level": case.level, "backend": kern.backend,
        "kernel": kern.name, "device": backend.device, "dtype": case.dtype,
        "shape": case.shape_str, "steps": case.steps, "seed": case.seed,
        "params": json.dumps(case.case_params, sort_keys=True),
        "tags": ",".join(case.tags), "file": case.file, "mode": case.mode,
        "expected": "FAIL" if backend.expect_fail else "PASS",
        **(recorded.row_columns(case) if case.source is not None else {}),
        **({"device": case.source.device or "unknown"}
           if kern.backend == recorded.BACKEND and case.source is not None else {}),
    }


def _row(base: dict, **kw) -> dict:
    row = {"output": "-", "out_dtype": "", "standard": "", "warning": "", **base}
    return result_rows.make(row, **kw)


def vanished_row(case: Case, kern: registry.Kernel, reason: str) -> dict:
    """The ERROR row of a planned item that produced none (its process died, say)."""
    return _row(_base_row(case, kern, registry.backend(kern.backend)), verdict="ERROR",
                reason=reason)


def skip_row(case: Case, kern: registry.Kernel, backend: registry.Backend, reason: str):
    return _row(_base_row(case, kern, backend), verdict="SKIP", reason=reason)


def _to_device(tensors: dict, device: str) -> dict:
    return {k: None if v is None else v.to(device) for k, v in tensors.items()}


def _as_tuple(outs) -> tuple:
    return (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)


def _sync(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def _fresh_copies(tensors: dict, device: str) -> dict:
    """Inputs on the kernel's device, never sharing storage with ours: kernels that
    update in place (as NPU optimizer kernels do) must not change what the golden and the
    diff table see."""
    out = {}
    for k, v in tensors.items():
        if v is None:
            out[k] = None
            continue
        moved = v.to(device)
        out[k] = moved.clone() if moved.data_ptr() == v.data_ptr() and v.numel() else moved
    return out


def _kernel_trajectory(spec, case, kern, device, first_inputs):
    """Kernel outputs of every step (on the CPU) and the last step's inputs (CPU)."""
    current = _fresh_copies(first_inputs, device)
    params = dict(case.params)
    steps, last_inputs, seconds = [], None, 0.0
    for step in range(case.steps):
        if step:
            fresh = inp.make_inputs(case, step, [i.name for i in spec.inputs if i.per_step])
            current.update(_to_device(fresh, device))
            if spec.step_param:
                params[spec.step_param] = case.params[spec.step_param] + step
        last_inputs = first_inputs if step == 0 else {k: v.detach().cpu().clone()
                                                      for k, v in current.items()}
        if step:
            current = _fresh_copies(current, device)
        t0 = time.perf_counter()
        outs = _checked_outputs(spec, params, call_kernel(kern, spec, current, params), kern)
        _sync(device)
        seconds += time.perf_counter() - t0
        steps.append({n: o.detach().cpu() for n, o in outs.items()})
        for in_name, out_name in spec.feedback.items():
            current[in_name] = outs[out_name]
    return steps, last_inputs, seconds


def _run_forward(spec, case, kern, device, first_inputs):
    """(outputs per step, the last step's inputs, seconds, autograd graph or None): a
    backward case differentiated by autograd runs its one forward with a graph. The
    recorded backend's outputs are what the recorded call returned."""
    if kern.backend == recorded.BACKEND:
        outs, _ = recorded.kernel_outputs(case)
        return [outs], first_inputs, 0.0, None
    if case.backward and kern.backward is None:
        try:
            outs, leaves, seconds = _forward_with_graph(spec, case, kern, device, first_inputs)
        except RuntimeError as exc:
            if not _in_place_on_leaf(exc):
                raise
            # the kernel updates an input in place (vLLM-style fused add + norm): judge its
            # forward without a graph; its gradient rows say what to do
            steps, last_inputs, seconds = _kernel_trajectory(spec, case, kern, device,
                                                             first_inputs)
            return steps, last_inputs, seconds, InPlaceKernel(
                f"kernel {kern.backend}:{kern.name} ({kern.where}) updates an input in place, "
                f"so autograd cannot differentiate it ({_clipped(exc).splitlines()[0]}): "
                f"declare it @verify.kernel(..., forward_only=True), return fresh tensors, or "
                f"register its backward with @verify.backward_kernel")
        steps = [{n: o.detach().cpu() for n, o in outs.items()}]
        return steps, first_inputs, seconds, (outs, leaves)
    steps, last_inputs, seconds = _kernel_trajectory(spec, case, kern, device, first_inputs)
    return steps, last_inputs, seconds, None


class InPlaceKernel(str):
    """The reason a backward case's gradients cannot come from autograd: the kernel
    writes into an input that requires grad."""


_IN_PLACE = ("a leaf Variable that requires grad is being used in an in-place operation",
             "a view of a leaf Variable that requires grad is being used in an in-place",
             "modified by an inplace operation")


def _in_place_on_leaf(exc: BaseException) -> bool:
    return any(text in str(exc) for text in _IN_PLACE)


class KernelSignatureError(TypeError):
    """The kernel cannot be called with the op's inputs and params."""


def _per_function(cache: weakref.WeakKeyDictionary, fn, make):
    """``cache[fn]``, made by ``make()`` the first time: keyed by the function itself,
    weakly (an id() key outlives its function, and a later function given the same
    address inherited its entry); a function that cannot be weakly referred to (a
    builtin) gets a fresh ``make()`` each time."""
    try:
        known = cache.get(fn)
    except TypeError:
        return make()
    if known is None:
        known = cache[fn] = make()
    return known


# the argument names each kernel function was checked to take
_BINDS_OK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def call_kernel(kern: registry.Kernel, spec, args: dict, params: dict):
    """``kern.fn(**args, **params)``, after checking that the kernel's signature takes
    exactly these keywords: a mismatch names the expected signature and the kernel's own
    file and line, instead of a TypeError from somewhere inside."""
    key = (tuple(args), tuple(params))
    checked = _per_function(_BINDS_OK, kern.fn, set)
    if key not in checked:
        try:
            sig = inspect.signature(kern.fn)
        except (TypeError, ValueError):  # a builtin or C function: no signature to read
            sig = None
        if sig is not None:
            try:
                sig.bind(**args, **params)
            except TypeError as exc:
                raise KernelSignatureError(
                    f"kernel {kern.backend}:{kern.name} ({kern.where}) cannot be called with op "
                    f"'{spec.name}''s arguments: {exc}. Kernels are called as "
                    f"fn(**inputs, **params): {spec.signature()} "
                    f"(`verify ops {spec.name}` shows it in full)") from None
        checked.add(key)
    return kern.fn(**args, **params)


class KernelOutputError(RuntimeError):
    """What a kernel returned does not fit the op (count, type, dtype, shape): the message
    names the kernel's own file and line, not the harness's."""


def _checked_outputs(spec, params, outs, kern=None) -> dict:
    """The kernel's outputs by name, after checking their count and that each is a
    tensor."""
    where = f"kernel {kern.backend}:{kern.name} ({kern.where})" if kern else "kernel"
    if not isinstance(outs, (torch.Tensor, tuple, list)):
        raise KernelOutputError(f"{where} returned {type(outs).__name__}, not a tensor or a "
                                f"tuple of tensors: {spec.signature()}")
    outs = _as_tuple(outs)
    names = spec.active_outputs(params)
    if len(outs) != len(names):
        raise KernelOutputError(f"{where} returned {len(outs)} outputs, op '{spec.name}' "
                                f"declares {len(names)} ({', '.join(names)}) for these params")
    bad = [(n, o) for n, o in zip(names, outs) if not isinstance(o, torch.Tensor)]
    if bad:
        raise KernelOutputError(f"{where} returned {type(bad[0][1]).__name__} for output "
                                f"'{bad[0][0]}', not a tensor")
    return dict(zip(names, outs))


def _forward_with_graph(spec, case, kern, device, first_inputs):
    """One forward of a backward case whose gradients come from autograd: the wrt inputs
    are leaves that require grad. Returns (outputs with their graph, leaves, seconds)."""
    args = _fresh_copies(first_inputs, device)
    leaves = {w: args[w].detach().clone().requires_grad_(True) for w in spec.grads.wrt
              if args.get(w) is not None and args[w].dtype.is_floating_point}
    args.update(leaves)
    t0 = time.perf_counter()
    with torch.enable_grad():
        outs = _checked_outputs(spec, case.params,
                                call_kernel(kern, spec, args, case.params), kern)
    _sync(device)
    return outs, leaves, time.perf_counter() - t0


def _kernel_grads(spec, case, kern, device, first_inputs, graph, upstream) -> dict:
    """The kernel's gradients (on the CPU) by output name ``grad_<input>``: from its
    separate backward kernel, or by autograd through the forward's ``graph``. A gradient
    the kernel does not produce is zero, as autograd treats an unused input."""
    ups = {k: v.to(device) for k, v in upstream.items()}
    if kern.backward is not None:
        args = _fresh_copies(first_inputs, device)
        res = _as_tuple(kern.backward(**args, **ups, **case.params))
        if len(res) != len(spec.grads.wrt):
            raise KernelOutputError(
                f"backward kernel of {kern.backend}:{kern.name} "
                f"({registry._where(kern.backward)}) returned {len(res)} gradients; op "
                f"'{spec.name}' declares {len(spec.grads.wrt)} ({', '.join(spec.grads.wrt)})")
        by_input = dict(zip(spec.grads.wrt, res))
    else:
        outs, leaves = graph
        pairs = []
        for key, up in ups.items():
            out = outs[key[5:]]
            if not out.requires_grad:
                raise RuntimeError(
                    f"output '{key[5:]}' carries no autograd graph: make the kernel "
                    f"differentiable (torch ops or a torch.autograd.Function) or register "
                    f"its backward with @verify.backward_kernel")
            pairs.append((out, up.to(out.dtype)))
        grads = torch.autograd.grad([p[0] for p in pairs], list(leaves.values()),
                                    grad_outputs=[p[1] for p in pairs], allow_unused=True)
        by_input = dict(zip(leaves, grads))
    out = {}
    for name in golden_source.grad_names(spec, case):
        w = name[5:]
        g = by_input.get(w)
        ref = first_inputs[w]
        out[name] = (torch.zeros_like(ref) if g is None else g.detach().cpu())
    return out


# What a kernel may raise without ending the run: any exception, and SystemExit (a kernel
# or a library it calls that exits); KeyboardInterrupt still stops the run.
KERNEL_FAULTS = (Exception, SystemExit)

# the benchmark kernel's outputs of the case this thread ran last: kept across the
# kernels of one case, which run one after the other
_BENCH = threading.local()


def _benchmark_outputs(spec, case, first_inputs, bench_backend, golden_step=None):
    """(benchmark kernel, its last-step outputs, gradients included for a backward case)
    for this case, run once per case."""
    key = (case.file, case.level, case.id, case.mode, bench_backend)
    cache = getattr(_BENCH, "cache", None)
    if cache is None:
        cache = _BENCH.cache = {}
    if key not in cache:
        cache.clear()
        kerns = registry.kernels(case.op, [bench_backend])
        if not kerns:
            cache[key] = (None, None)
        else:
            bench = registry.backend(kerns[0].backend)
            steps, _, _, graph = _run_forward(spec, case, kerns[0], bench.device, first_inputs)
            if case.backward and golden_step is not None:
                if isinstance(graph, InPlaceKernel):
                    raise RuntimeError(str(graph))
                upstream = golden_source.upstream_for(spec, case, golden_step)
                steps[0].update(_kernel_grads(spec, case, kerns[0], bench.device,
                                              first_inputs, graph, upstream))
            cache[key] = (kerns[0], steps[-1])
    return cache[key]


def _benchmark_rows(base, spec, case, kern, first_inputs, k_steps, g_steps, golden,
                    k_seconds, label: str) -> list[dict]:
    """One row per floating output: the kernel judged against the benchmark backend's
    kernel on the same inputs (verify/benchmark.py), beside the op's own standard."""
    try:
        bench_kern, bench_out = _benchmark_outputs(spec, case, first_inputs, label, g_steps[0])
    except Exception as exc:
        return [_row(base, output=f"vs {label}", standard="benchmark", verdict="ERROR",
                     reason=f"benchmark kernel raised {_error_text(exc)}")]
    if bench_kern is None:
        return []
    rows = []
    names = spec.active_outputs(case.params) if case.forward else []
    if case.backward:  # gradients are judged against the benchmark's gradients too
        names += golden_source.grad_names(spec, case)
    for out_name in names:
        out_dtype = spec.output_dtype(out_name, case.dtype, case.params)
        is_grad = out_name not in spec.golden_output_names
        if not out_dtype.is_floating_point or (
                not is_grad and spec.output(out_name).compare != "values"):
            continue
        if out_name not in k_steps[-1] or out_name not in bench_out:
            continue
        row = _row(base, output=f"{out_name} vs {label}", out_dtype=dt.name_of(out_dtype),
                   golden_source=golden.source, golden_s=round(golden.seconds, 6),
                   kernel_s=round(k_seconds, 6),
                   benchmark=f"{bench_kern.backend}:{bench_kern.name}")
        try:
            v = compare(k_steps[-1][out_name], g_steps[-1][out_name], dtype=out_dtype,
                        standard="benchmark", benchmark=bench_out[out_name])
        except Exception as exc:
            rows.append(_row(row, verdict="ERROR", reason=f"comparing: {_error_text(exc)}"))
            continue
        row.update(verdict=v.verdict, standard="benchmark", reason=v.reason, margin=v.margin)
        row.update(v.metrics.as_dict())
        row.update(v.extra)
        rows.append(row)
    return rows
def note(key: str, value) -> None:
    """A kernel's own figure for the current case (PyPTO's modelled AICore time, say):
    it becomes a column of the case's rows (the running thread's case)."""
    context.case_state().notes[key] = value


def time_kernel(case: Case, kern: registry.Kernel, repeats: int,
                first_inputs: dict | None = None) -> float:
    """Median wall time of the kernel call alone, device-synchronised; inputs are copied
    before each call, outside the timing."""
    device = registry.backend(kern.backend).device
    first = first_inputs if first_inputs is not None else inp.make_inputs(case)
    on_device = _to_device(first, device)
    times = []
    for _ in range(repeats):
        args = _fresh_copies(on_device, device)
        _sync(device)
        t0 = time.perf_counter()
        call_kernel(kern, registry.op(case.op), args, case.params)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, (KernelSignatureError, KernelOutputError)):
        return str(exc)
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}): the kernel tried to end the process"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {_clipped(exc)}{where}"


MESSAGE_CHARS = 2000  # of an exception's message in a row (a kernel may raise megabytes)


def _clipped(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception as inner:  # a __str__ that raises
        return f"<message unreadable: {type(inner).__name__}>"
    if len(text) <= MESSAGE_CHARS:
        return text
    return f"{text[:MESSAGE_CHARS]}... [{len(text) - MESSAGE_CHARS} more characters]"


def _raised_expected(exc: BaseException, expected: str) -> bool:
    return any(cls.__name__ == expected for cls in type(exc).__mro__)


# --case-timeout: seconds per case (None: the level's default, 0: no limit), and what the
# watchdog does when a timed-out case never returns to Python (see verify/deadline.py)
_WARM: list[bool] = []


def _warm_comparator() -> None:
    """Load the metrics pass's compiled code (numba's cache: ~0.4 s) once per process,
    outside any case's time limit: a 1 s --case-timeout is the kernel's, not numba's."""
    if not _WARM:
        _WARM.append(True)
        x = torch.ones(4)
        compare(x, x.double(), standard="cann_v2")
        compare(x, x.double(), standard="cann_v2", floor=False)


def run_case(case: Case, kern: registry.Kernel,
             ctx: context.RunContext | None = None) -> list[dict]:
    """Every result row of ``case`` run by ``kern`` under the run's settings ``ctx``
    (None: the default store, no timing); past its time limit, one ERROR row."""
    ctx = ctx or context.default()
    _warm_comparator()
    seconds = deadline.seconds_for(case.level, ctx.case_timeout)
    state = context.new_case_state()
    state.phase = "making inputs"
    # the watchdog thread calls it: it reads this case's phase from the state object
    on_stuck = None if ctx.on_stuck is None else (
        lambda s, _stuck=ctx.on_stuck: _stuck(s, state.phase))
    try:
        with deadline.time_limit(seconds, on_stuck):
            rows = _run_case(case, kern, ctx, state)
    except deadline.CaseTimeout as exc:
        rows = [vanished_row(case, kern, f"{exc} while {state.phase} (--case-timeout "
                                         f"{seconds:g}; 0: no limit)")]
    _interpreter_warning(rows, case, kern, registry.backend(kern.backend))
    for r in rows:  # every field a row carries is declared (verify/report/rows.py), or
        # a figure the kernel noted (runner.note: a column of its own)
        unknown = [k for k in result_rows.undeclared(r) if k not in state.notes]
        if unknown:
            raise KeyError(f"{case.op} {case.id}: result row fields {unknown} are not "
                           f"declared in verify/report/rows.py")
    return rows


def _forward_only(kern: registry.Kernel) -> str:
    return f"kernel {kern.backend}:{kern.name} is forward-only (no backward to verify)"


def skip_reason(case: Case, kern: registry.Kernel, backend: registry.Backend) -> str:
    """Why this item is a SKIP row wherever it runs ('' when it runs): a case over the
    backend's size cap, or one its kernel does not cover. Whether the backend is
    available is the running machine's question, not asked here."""
    size = max((math.prod(s) for s in case.input_shapes.values()), default=0)
    if backend.max_elements is not None and size > backend.max_elements:
        return (f"{size} elements per input; {backend.name} ({backend.note or 'here'}) "
                f"takes cases up to {backend.max_elements}: large shapes run on a real device")
    if case.expect_error:  # a kernel's input checks are judged whatever it covers
        return ""
    why = kern.unsupported(case.dtype, case.params)
    if not why and kern.forward_only and case.backward and not case.forward:
        why = _forward_only(kern)
    return why


def judged_case(case: Case, kern: registry.Kernel) -> Case:
    """The case as this kernel is judged: a forward-only kernel of a forward+backward case
    is judged on the forward (the case's golden then has no gradients)."""
    if not case.expect_error and kern.forward_only and case.backward:
        return dataclasses.replace(case, mode="forward")
    return case


def _run_case(case: Case, kern: registry.Kernel, ctx: context.RunContext,
              state: context.CaseState) -> list[dict]:
    spec = registry.op(case.op)
    backend = registry.backend(kern.backend)
    base = _base_row(case, kern, backend)
    ok, why = backend.available()
    if not ok:
        return [skip_row(case, kern, backend, why)]
    why = skip_reason(case, kern, backend)
    if why:
        return [skip_row(case, kern, backend, why)]
    grad_skip = ""
    judged = judged_case(case, kern)
    if judged is not case:  # judge the forward; the gradients are SKIP rows
        grad_skip = _forward_only(kern)
        grad_rows = golden_source.grad_names(spec, case)
        case = judged
    try:
        first_inputs = inp.make_inputs(case)
        base["inputs_sha"] = recorded.fingerprint(case) if case.source is not None \
            else inp.fingerprint(first_inputs)
    except Exception as exc:  # a bad distribution for this dtype, say
        return [_row(base, verdict="ERROR", reason=f"making inputs: {_error_text(exc)}")]

    if case.expect_error:
        state.phase = "running the kernel"
        try:
            _kernel_trajectory(spec, case, kern, backend.device, first_inputs)
        except KernelSignatureError as exc:  # not the wrapper's check: a mis-declared kernel
            return [_row(base, verdict="ERROR", standard="expect_error", reason=str(exc))]
        except KERNEL_FAULTS as exc:
            if _raised_expected(exc, case.expect_error):
                return [_row(base, verdict="PASS", standard="expect_error",
                             reason=f"raised {type(exc).__name__} as expected: "
                                    f"{_clipped(exc)}")]
            return [_row(base, verdict="FAIL", standard="expect_error",
                         reason=f"expected {case.expect_error}, got {_error_text(exc)}")]
        return [_row(base, verdict="FAIL", standard="expect_error",
                     reason=f"expected {case.expect_error}; the kernel accepted the inputs")]

    state.notes.clear()
    state.phase = "running the kernel"
    try:
        k_steps, last_inputs, k_seconds, graph = _run_forward(spec, case, kern, backend.device,
                                                              first_inputs)
    except KernelSignatureError as exc:
        return [_row(base, verdict="ERROR", reason=str(exc))]
    except Unsupported as exc:
        return [_row(base, verdict="SKIP", reason=f"kernel does not support this case: {exc}")]
    except KERNEL_FAULTS as exc:
        return [_row(base, verdict="ERROR", reason=f"kernel raised {_error_text(exc)}")]
    base.update(state.notes)
    state.phase = "getting the golden"
    try:
        golden = ctx.resolver.get(spec, case, first_inputs)
    except golden_source.RegistryUnavailable as exc:  # --registry-required
        return [_row(base, verdict="ERROR", reason=f"registry unavailable: {exc}")]
    except golden_source.GoldenDisputed as exc:  # a poisoned golden: never a green row
        return [_row(base, verdict="ERROR", reason=str(exc))]
    except Exception as exc:
        return [_row(base, verdict="ERROR", reason=f"golden raised {_error_text(exc)}")]
    g_steps = [golden.step(s) for s in range(len(golden.trajectory))]
    state.phase = "running the kernel"
    as_recorded = kern.backend == recorded.BACKEND  # the outputs are the record's
    if ctx.time_repeats and not as_recorded:
        try:
            base["kernel_median_s"] = time_kernel(case, kern, ctx.time_repeats, first_inputs)
        except KERNEL_FAULTS as exc:
            return [_row(base, verdict="ERROR", reason=f"timing: {_error_text(exc)}")]

    names = spec.active_outputs(case.params) if case.forward else []
    grad_error = None
    if case.backward and isinstance(graph, InPlaceKernel):
        names += golden_source.grad_names(spec, case)
        grad_error = str(graph)
    elif case.backward and as_recorded:  # a backward record holds the gradients
        names += golden_source.grad_names(spec, case)
    elif case.backward:
        names += golden_source.grad_names(spec, case)
        try:
            t0 = time.perf_counter()
            upstream = golden_source.upstream_for(spec, case, g_steps[0])
            k_steps[0].update(_kernel_grads(spec, case, kern, backend.device, first_inputs,
                                            graph, upstream))
            _sync(backend.device)
            base["backward_s"] = round(time.perf_counter() - t0, 6)
        except Unsupported as exc:
            grad_skip = f"kernel does not support this backward: {exc}"
        except KERNEL_FAULTS as exc:
            grad_error = f"kernel backward raised {_error_text(exc)}"
    state.phase = "comparing"
    rows = []
    alt = Alternatives(spec, case, first_inputs, g_steps[0]) if spec.reuse else None
    floors = ComputeFloor(spec, case, first_inputs, ctx.resolver)
    book = FloorBook(ctx.resolver, spec, case, first_inputs)
    if grad_skip and not case.backward:  # forward-only kernel of a forward+backward case
        rows += [_row(base, output=g, verdict="SKIP", reason=grad_skip,
                      out_dtype=dt.name_of(spec.output_dtype(g, case.dtype, case.params)))
                 for g in grad_rows]
    judged_as = recorded.judged_dtypes(case) if as_recorded else {}
    if as_recorded:  # what the record holds (a call returns some of the op's outputs)
        names = [n for n in names if n in k_steps[0]]
    for out_name in names:
        out_dtype = judged_as.get(out_name) or spec.output_dtype(out_name, case.dtype,
                                                                  case.params)
        row = _row(base, output=out_name, out_dtype=dt.name_of(out_dtype),
                   golden_source=golden.source, golden_s=round(golden.seconds, 6),
                   kernel_s=round(k_seconds, 6))
        if grad_error and out_name not in k_steps[0]:
            rows.append(_row(row, verdict="ERROR", reason=grad_error))
            continue
        if grad_skip and out_name not in k_steps[0]:
            rows.append(_row(row, verdict="SKIP", reason=grad_skip))
            continue
        try:
            rows.append(_judge_output(row, spec, case, out_name, out_dtype, k_steps,
                                      g_steps, last_inputs, alt, floors, kern, book))
        except Exception as exc:
            rows.append(_row(row, verdict="ERROR", reason=(
                str(exc) if isinstance(exc, KernelOutputError)
                else f"comparing: {_error_text(exc)}")))
    if ctx.benchmark_backend and kern.backend != ctx.benchmark_backend and not as_recorded:
        rows += _benchmark_rows(base, spec, case, kern, first_inputs, k_steps, g_steps,
                                golden, k_seconds, ctx.benchmark_backend)
    for view in case.views:
        out_name = view["output"]
        if out_name not in names or out_name not in k_steps[-1]:
            continue
        row = _row(base, output=f"{out_name}[{view['name']}]", golden_source=golden.source,
                   golden_s=round(golden.seconds, 6), kernel_s=round(k_seconds, 6))
        try:
            rows.append(_judge_view(row, spec, case, view, k_steps[-1][out_name],
                                    g_steps[-1][out_name], last_inputs, floors))
        except Exception as exc:
            rows.append(_row(row, verdict="ERROR", reason=f"comparing: {_error_text(exc)}"))
    book.save()
    return rows


def _metric_columns(v) -> dict:
    """A verdict's metrics and its error floor's, as result columns."""
    cols = v.metrics.as_dict()
    if v.floor is not None:
        cols.update({f"floor_{k}": getattr(v.floor, k) for k in FLOOR_FIELDS})
    return cols


def _judge_view(row, spec, case, view, actual, golden, inputs,
                floors: "ComputeFloor | None" = None) -> dict:
    """An output's elements at the indices an integer input holds along its last dim (the
    true class of a cross entropy, say), judged by the view's own standard: values that
    are tiny next to the rest of the tensor get a criterion that sees them."""
    out_dtype = spec.output_dtype(view["output"], case.dtype, case.params)
    index = inputs[view["at"]].reshape(-1).long()

    def picked(t):
        flat = t.reshape(-1, t.shape[-1]) if t.dim() else t.reshape(1, 1)
        return flat[keep].gather(-1, pick)[:, 0]

    rows_of = actual.reshape(-1, actual.shape[-1]) if actual.dim() else actual.reshape(1, 1)
    if index.numel() != rows_of.shape[0]:
        raise ValueError(f"view '{view['name']}': {index.numel()} indices in "
                         f"'{view['at']}' for {rows_of.shape[0]} rows of '{view['output']}'")
    keep = (index >= 0) & (index < rows_of.shape[-1])  # ignore_index and the like
    pick = index[keep][:, None]
    a, g = picked(actual), picked(golden)
    std = resolve_standard(view.get("standard") or case.standard or spec.standard,
                           view["output"])
    v = compare(a, g, dtype=out_dtype, standard=std)
    where = f"{int(keep.sum())} elements at {view['at']}: "
    row.update(out_dtype=dt.name_of(out_dtype), verdict=v.verdict, standard=v.standard,
               reason=where + v.reason, warning=v.warning, margin=v.margin,
               floor_margin=v.floor_margin)
    row.update(_metric_columns(v))
    cf = floors.step(len(floors.steps_or_empty()) - 1, view["output"]) if floors else None
    if cf is not None:
        _apply_compute_floor(row, [v], _floor_verdicts([picked(cf)], [g], out_dtype, std),
                             out_dtype, std, where)
    if row["verdict"] != "PASS":
        row["diff_table"] = worst_elements(a, g, {}, k=DIFF_ROWS)
    return row


def _interpreter_warning(rows: list[dict], case: Case, kern: registry.Kernel,
                         backend: registry.Backend) -> None:
    """Rows of a Triton kernel carry the interpreter probe's defects for their dtypes."""
    is_triton = backend.triton or _triton_kernel(kern)
    if not is_triton:
        return
    dtypes = {case.dtype} | {dt.name_of(d) for d in case.input_dtypes.values()}
    for r in rows:
        if r["verdict"] == "SKIP":
            continue
        text = triton_probe.warning_for(dtypes | {r.get("out_dtype") or ""}, True)
        if text:
            r["warning"] = " | ".join(filter(None, [r.get("warning"), text]))


_TRITON_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _triton_kernel(kern: registry.Kernel) -> bool:
    return _per_function(_TRITON_KERNELS, kern.fn,
                         lambda: triton_probe.is_triton_kernel(kern.fn))


def reduction_scale(spec, case, out_name: str, out_dtype: torch.dtype) -> tuple[int, float]:
    """(n, k) for a reduction gradient: n terms summed into each element, and the factor
    k = max(1, sqrt(n) * u_fp32 / u_out) its tolerances are widened by (README:
    "Backward verification"). (1, 1.0) for every other output."""
    if not (spec.grads and out_name.startswith("grad_") and out_name[5:] in spec.grads.reduced):
        return 1, 1.0
    n = int(spec.grads.reduced[out_name[5:]](case.input_shapes))
    u_acc = torch.finfo(torch.float32).eps / 2
    u_out = torch.finfo(out_dtype).eps / 2
    return n, max(1.0, math.sqrt(n) * u_acc / u_out)


class Alternatives:
    """The goldens of legitimate variants (``declare_op(reuse=...)``): the op's golden run
    from one of its outputs rounded to that output's dtype. Computed only when an output
    fails against the exact golden, once per case."""

    def __init__(self, spec, case, first_inputs, golden_step):
        self.spec, self.case, self.inputs, self.golden = spec, case, first_inputs, golden_step
        self._cache = None

    def goldens(self, out_name: str) -> list[tuple[str, torch.Tensor]]:
        if self._cache is None:
            self._cache = []
            for name, remap in self.spec.reuse.items():
                if name not in self.golden:
                    continue
                dtype = self.spec.output_dtype(name, self.case.dtype, self.case.params)
                rounded = metrics.round_once(self.golden[name], dtype).to(torch.float64)
                ins = {k: None if v is None else v.to(torch.float64)
                       for k, v in self.inputs.items()}
                traj = golden_source.golden_trajectory(self.spec, self.case, remap(ins, rounded))
                names = golden_source.golden_names(self.spec, self.case)
                self._cache.append((f"{name} rounded to {dt.name_of(dtype)}",
                                    dict(zip(names, traj[0]))))
        return [(label, g[out_name]) for label, g in self._cache if out_name in g]


class ComputeFloor:
    """The case's compute-precision floor (verify/compute_floor.py), evaluated once per
    case when an output first asks for it; an op or case without one gives None."""

    def __init__(self, spec, case, first_inputs, resolver):
        self.spec, self.case, self.inputs = spec, case, first_inputs
        self.resolver = resolver
        self._steps = None
        self.error = ""

    def steps_or_empty(self) -> list[dict]:
        if self._steps is None:
            self._steps = []
            if cfl.applies(self.spec, self.case):
                try:
                    self._steps = self._stored()
                except Exception as exc:  # a golden that only runs in float64, say
                    self.error = f"compute-precision floor unavailable: {_error_text(exc)}"
        return self._steps

    def _stored(self) -> list[dict]:
        """Computed once per golden: kept in the golden store beside it, so the other
        kernels of the case, other workers and later runs read it."""
        spec, case = self.spec, self.case
        base = case.golden_key(spec.golden_version)
        names = golden_source.golden_names(spec, case)

        def compute():
            steps = cfl.trajectory(spec, case, self.inputs)
            return [tuple(step[n] for n in names) for step in steps]

        traj = self.resolver.derived(cfl.store_key(spec, base), base,
                                                "compute_floor", spec, case, self.inputs,
                                                names, compute)
        return [dict(zip(names, step)) for step in traj]

    def step(self, s: int, name: str) -> torch.Tensor | None:
        steps = self.steps_or_empty()
        if not steps or s >= len(steps) or s < 0:
            return None
        return steps[s].get(name)


def _floor_verdicts(floor_outs, goldens, out_dtype, std) -> list:
    """The compute-precision floor's verdicts (None where it has no output); its own
    figures need no output floor of their own (one metrics pass)."""
    return [compare(f, g, dtype=out_dtype, standard=std, floor=False, plots=False)
            if f is not None else None for f, g in zip(floor_outs, goldens)]


def _apply_compute_floor(row, verdicts, floor_vs, out_dtype, std, prefix="",
                         steps_label=None) -> None:
    """Add the cfloor_* columns (of the last verdict's step) and, when the exact golden's
    verdict FAILs only by the error a correct kernel computing in the compute precision
    has too, turn the row into a PASS with a warning that shows both figures.
    ``floor_vs``: the floor's verdicts per step (a FloorBook's, or _floor_verdicts)."""
    last, last_floor = verdicts[-1], floor_vs[-1]
    if last_floor is None:
        return
    r_last = cfl.ratios(last.metrics, last_floor.metrics)
    row.update(cfl.columns(last_floor.metrics, last_floor.margin, cfl.worst_ratio(r_last)))
    failing = [i for i, v in enumerate(verdicts) if not v.passed]
    if row.get("verdict") != "FAIL" or not failing:
        return
    for i in failing:
        v, fv = verdicts[i], floor_vs[i]
        if fv is None or v.metrics.nan_inf_mismatch or v.standard in ("exact", "topk_set"):
            return
        if not fv.margin >= cfl.MIN_FLOOR_MARGIN:  # a correct kernel meets it with room
            return
        if cfl.worst_ratio(cfl.ratios(v.metrics, fv.metrics)) > 1.0:
            return
    i = failing[0]
    v, fv = verdicts[i], floor_vs[i]
    r = cfl.ratios(v.metrics, fv.metrics)
    at = f" at step {i + 1}" if steps_label else ""
    floor_says = ("it fails the standard too" if not fv.passed
                  else "it passes the standard")
    figures = (f"max rel {v.metrics.mare:.3g}" if "max abs" in v.reason
               else f"max abs {v.metrics.max_abs:.3g}, max rel {v.metrics.mare:.3g}")
    text = (f"PASS by the compute-precision floor: against the exact golden{at} {prefix}"
            f"{v.reason} ({figures}); "
            f"the golden evaluated in {row.get('compute_dtype', 'fp32')} on the same inputs "
            f"has max abs {fv.metrics.max_abs:.3g}, max rel {fv.metrics.mare:.3g} "
            f"({floor_says}: {fv.reason}); the kernel's error over it: {cfl.describe(r)}")
    row.update(verdict="PASS", passed_by="cfloor",
               reason=f"within the compute-precision floor ({cfl.describe(r)}); exact "
                      f"golden: {prefix}{v.reason}",
               warning=" | ".join(filter(None, [text, row.get("warning")])))


def _order_hint(spec, case, out_name, actual, g_step) -> str:
    """'y matches the golden of output h: outputs in the wrong order?' when the kernel's
    output passes as another output (same shape and dtype) of the same case."""
    for other, golden in g_step.items():
        if other == out_name or tuple(golden.shape) != tuple(actual.shape):
            continue
        dtype = spec.output_dtype(other, case.dtype, case.params)
        if actual.dtype != dtype or not dtype.is_floating_point:
            continue
        try:
            std = resolve_standard(case.standard or spec.standard, other)
            if compare(actual, golden, dtype=dtype, standard=std).passed:
                return (f"{out_name} matches the golden of output {other}: outputs in the "
                        f"wrong order? (declared order: {', '.join(spec.output_names)})")
        except Exception:
            continue
    return ""


def _judging(spec, case: Case, out_name: str, out_dtype) -> tuple[dict, int, str]:
    """How an output is judged: its standard (tolerances widened for a reduction of
    many terms), the number of terms, and how it compares ('values', 'topk_set', ...)."""
    std = resolve_standard(case.standard or spec.standard, out_name)
    n_terms, k = reduction_scale(spec, case, out_name, out_dtype)
    if k > 1.0 and "scale" not in std:
        std["scale"] = k
    is_grad = out_name not in spec.golden_output_names
    return std, n_terms, "values" if is_grad else spec.output(out_name).compare


def keep_floors(case: Case, resolver, first_inputs: dict, golden) -> FloorBook | None:
    """Both floors of every output and step of a case's golden (resolved from
    ``first_inputs``), computed into the FloorBook beside it (kept in the store, pushed
    to the registry): what a cluster run's golden task does, so that no kernel task
    computes a floor. The book (its size and where its figures came from); None for a
    case without floors."""
    spec = registry.op(case.op)
    if case.expect_error or case.source is not None:
        return None
    g_steps = [golden.step(s) for s in range(len(golden.trajectory))]
    names = (spec.active_outputs(case.params) if case.forward else []) + \
        (golden_source.grad_names(spec, case) if case.backward else [])
    floors = ComputeFloor(spec, case, first_inputs, resolver)
    book = FloorBook(resolver, spec, case, first_inputs)
    for out_name in names:
        out_dtype = spec.output_dtype(out_name, case.dtype, case.params)
        std, _, compare_how = _judging(spec, case, out_name, out_dtype)
        if compare_how == "topk_set":
            continue
        for s, g_out in enumerate(g_steps):
            if out_name not in g_out:
                continue
            book.output_floor(out_name, s, g_out[out_name], out_dtype, std)
            if compare_how == "values" and out_dtype.is_floating_point:
                book.compute_floor(out_name, s, lambda s=s, n=out_name: floors.step(s, n),
                                   g_out[out_name], out_dtype, std)
    book.save()
    return book


def _judge_output(row, spec, case, out_name, out_dtype, k_steps, g_steps, last_inputs,
                  alt: Alternatives | None = None, floors: ComputeFloor | None = None,
                  kern: registry.Kernel | None = None, book: FloorBook | None = None):
    std, n_terms, compare_how = _judging(spec, case, out_name, out_dtype)
    if n_terms > 1:
        row.update(reduction_n=n_terms, tol_scale=float(std.get("scale", 1.0)))
    per_step, verdicts = [], []
    for s, (k_out, g_out) in enumerate(zip(k_steps, g_steps)):
        actual, golden = k_out[out_name], g_out[out_name]
        who = f"kernel {kern.backend}:{kern.name} ({kern.where})" if kern else "the kernel"
        recorded_as = case.source is not None and kern is not None \
            and kern.backend == recorded.BACKEND  # values judged in the call's dtype
        if (actual.dtype != out_dtype and not recorded_as) \
                or tuple(actual.shape) != tuple(golden.shape):
            what = (f"dtype {actual.dtype}, the op declares {out_dtype} for a {case.dtype} "
                    f"case" if actual.dtype != out_dtype else
                    f"shape {list(actual.shape)}, the golden's is {list(golden.shape)}")
            hint = _order_hint(spec, case, out_name, actual, g_out)
            raise KernelOutputError(f"output '{out_name}' of {who} has {what}"
                                    + (f"; {hint}" if hint else ""))
        if compare_how == "topk_set":
            scores = g_out[spec.output(out_name).scores]
            v = compare_topk(actual, golden, scores)
        else:  # the output floor's figures are kept with the golden (golden/floors.py)
            known = book.output_floor(out_name, s, golden, out_dtype, std) \
                if book is not None else True
            v = compare(actual, golden, dtype=out_dtype, standard=std, output=None,
                        floor=known if known is not None else True)
        verdicts.append(v)
        per_step.append({"step": s + 1, "verdict": v.verdict, "mere": v.metrics.mere,
                         "mare": v.metrics.mare, "max_abs": v.metrics.max_abs,
                         "rmse": v.metrics.rmse, "eb": v.metrics.eb})
    failing = [(s, v) for s, v in enumerate(verdicts) if not v.passed]
    variant, v_alt, tried = "", None, []
    if failing and alt is not None and case.steps == 1 and compare_how == "values":
        for label, g_alt in alt.goldens(out_name):
            v2 = compare(k_steps[0][out_name], g_alt, dtype=out_dtype, standard=std)
            if v2.passed:
                variant, v_alt = label, v2
                break
            tried.append(f"against the golden computed from {label}: {v2.reason}")
    s_final, decisive = failing[0] if failing else (len(verdicts) - 1, verdicts[-1])
    final = verdicts[-1]
    reason = decisive.reason
    if case.steps > 1 and failing:
        reason = f"step {s_final + 1}/{case.steps}: {reason}"
    # the metric columns are always the exact golden's: a variant or the compute-
    # precision floor that passes the row adds its own columns and a warning
    row.update(verdict=decisive.verdict, standard=decisive.standard, reason=reason,
               warning=final.warning, margin=decisive.margin, floor_margin=final.floor_margin)
    row.update(_metric_columns(final))
    if tried and not variant:  # the declared variants fail too: say so, with their figures
        row["reason"] = "; ".join([row["reason"], *tried])
    if variant:
        m = v_alt.metrics
        row.update(verdict="PASS", golden_variant=variant, passed_by="variant",
                   variant_margin=v_alt.margin,
                   **{f"variant_{k}": getattr(m, k) for k in VARIANT_FIELDS})
        row["reason"] = (f"{v_alt.reason}, against the golden computed from {variant} (a "
                         f"legitimate rounding of a declared output)")
        row["warning"] = " | ".join(filter(None, [
            f"PASS by a legitimate variant ({variant}): against the exact golden "
            f"{decisive.reason} (max abs {decisive.metrics.max_abs:.3g}, MARE "
            f"{decisive.metrics.mare:.3g})", row["warning"]]))
    elif floors is not None and compare_how == "values" and out_dtype.is_floating_point:
        row["compute_dtype"] = spec.compute_dtype
        floor_vs = [book.compute_floor(out_name, s, lambda s=s: floors.step(s, out_name),
                                       g_steps[s][out_name], out_dtype, std)
                    if book is not None else
                    _floor_verdicts([floors.step(s, out_name)], [g_steps[s][out_name]],
                                    out_dtype, std)[0]
                    for s in range(len(verdicts))]
        _apply_compute_floor(row, verdicts, floor_vs, out_dtype, std,
                             steps_label=case.steps > 1)
        if row["verdict"] == "FAIL" and floors.error:
            row["warning"] = " | ".join(filter(None, [row["warning"], floors.error]))
    if row["verdict"] == "FAIL" and compare_how == "values":
        hint = _order_hint(spec, case, out_name, k_steps[s_final][out_name], g_steps[s_final])
        if hint:
            row["reason"] = f"{row['reason']}; {hint}"
    if case.steps > 1:
        row["step_metrics"] = per_step
    _plot_data(row, k_steps[s_final][out_name], g_steps[s_final][out_name], out_dtype, decisive)
    if failing and compare_how == "values" and row["verdict"] != "PASS":
        s = s_final
        shown = {k: v for k, v in last_inputs.items() if v is not None}
        row["diff_table"] = worst_elements(
            k_steps[s][out_name], g_steps[s][out_name], shown if s == len(k_steps) - 1 else {},
            k=DIFF_ROWS, atol=decisive.metrics.atol if std["name"] == "allclose" else None,
            rtol=decisive.metrics.rtol if std["name"] == "allclose" else None)
    return row


def _plot_data(row, actual, golden, out_dtype, verdict) -> None:
    """Histogram and heat map for the report, for every float output: both come with its
    metrics (the same pass). A verdict without them (msprobe's benchmark standard) gets
    a heat map of its own, a pass in torch, when it fails or nearly does."""
    if not out_dtype.is_floating_point:
        return
    if verdict.histogram is not None:
        row["histogram"] = verdict.histogram
    if verdict.heatmap is not None:
        row["heatmap"] = verdict.heatmap
    elif verdict.histogram is None and (not verdict.passed
                                        or not (verdict.margin < PLOT_MARGIN)):
        allclose = verdict.standard == "allclose"
        row["heatmap"] = plotdata.heatmap(actual, golden,
                                          verdict.metrics.atol if allclose else None,
                                          verdict.metrics.rtol if allclose else None)