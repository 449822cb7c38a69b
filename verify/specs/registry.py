"""The op registry and the kernel registry.

An op is declared once (``declare_op``): its inputs with dtype rules and default value
distributions, its params with defaults, its outputs with dtype rules, its float64 golden,
its default standard and the input validation of the real kernel wrapper. Kernels of any
backend register against an op name with ``@kernel(op, backend=...)`` and share the
golden's calling convention ``fn(**inputs, **params) -> outputs in declared order``.

Where ops and kernels come from: the built-in op pack (``verify.goldens``,
``verify.kernels``; optional backends such as Triton and PyPTO are imported only when a
run uses them), installed op packs (entry-point group ``kernel_verify.packs``) and the
user's modules (``--kernels``).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import json
import logging
import math
import os
import pkgutil
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from verify.comparator import dtypes as dt
from verify.errors import ConfigError, unknown_name
from verify.specs import calls as calls_table

WORKING = "working"  # dtype rule: the case's working dtype


@dataclass(frozen=True)
class InputSpec:
    """One input of an op.

    dtype: WORKING, or a fixed dtype name ('fp32' for optimizer states).
    shape: maps the case's main shape to this input's shape (None: the main shape).
    dist: the default value distribution (see verify.inputs).
    """

    name: str
    dtype: str = WORKING
    shape: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None
    dist: dict = field(default_factory=lambda: {"dist": "normal", "mean": 0.0, "std": 1.0})
    per_step: bool = False  # drawn afresh at every step of a multi-step case (a gradient)
    optional: bool = False  # a case may leave it out ({"dist": "none"}): passed as None

    def shape_for(self, main: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.shape(tuple(main))) if self.shape else tuple(main)

    def describe(self, working: str = "the case's dtype") -> str:
        """One line for ``verify ops OP``: dtype rule, shape rule, default distribution."""
        dtype = working if self.dtype == WORKING else self.dtype
        shape = "the case's shape" if self.shape is None else _rule_text(self.shape)
        flags = (", per step" if self.per_step else "") + (", optional" if self.optional else "")
        dist = ", ".join(f"{k}={v}" for k, v in self.dist.items())
        return f"{self.name}: dtype {dtype}; shape {shape}; default {dist}{flags}"


def _rule_text(fn) -> str:
    """A shape or dtype rule in words: its docstring, else its source line."""
    doc = inspect.getdoc(fn)
    if doc:
        return doc.split("\n")[0]
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return getattr(fn, "__name__", "a rule")
    if getattr(fn, "__name__", "") == "<lambda>":  # just the lambda, not its whole line
        import ast
        import textwrap
        text = textwrap.dedent(source).strip()
        for candidate in (text, text.rstrip(",)]}"), "(" + text.rstrip(",") + ")"):
            try:
                tree = ast.parse(candidate)
            except SyntaxError:
                continue
            found = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
            if len(found) == 1:
                return ast.get_source_segment(candidate, found[0])
    return " ".join(source.split())


@dataclass(frozen=True)
class OutputSpec:
    """One output; dtype is WORKING or a fixed dtype name.

    golden_only: returned by the golden but not by kernels (data a comparison needs, such
    as the scores behind top-k indices).
    compare: how to compare it: "values" (the standards), or "topk_set" (index rows
    compared as sets, tolerant of ties in the golden output named by ``scores``).
    """

    name: str
    dtype: str | Callable[[str, dict], str] = WORKING
    golden_only: bool = False
    compare: str = "values"
    scores: str | None = None
    when: Callable[[dict], bool] | None = None  # produced only for these params

    def dtype_name(self, working: str, params: dict) -> str:
        """The output's dtype: fixed, the working one, or chosen by params
        (chunk_local_cumsum's output_dtype)."""
        if callable(self.dtype):
            return self.dtype(working, params)
        return working if self.dtype == WORKING else self.dtype

    def active(self, params: dict) -> bool:
        return self.when is None or bool(self.when(params))


@dataclass(frozen=True)
class Gradients:
    """The backward an op declares: the inputs that get gradients (``wrt``), the outputs
    that receive an upstream gradient (``of``; default every floating output), and the
    gradients that sum over many terms (``reduced``: input -> the number of terms in each
    element, from the case's input shapes), whose standard is scaled for that length."""

    wrt: tuple[str, ...]
    of: tuple[str, ...] | None = None
    reduced: dict[str, Callable[[dict], int]] = field(default_factory=dict)

    def grad_name(self, input_name: str) -> str:
        return f"grad_{input_name}"


def broadcast_length(input_name: str, full: str):
    """Terms summed into each element of the gradient of ``input_name`` when it is
    broadcast against ``full`` (gamma over the rows of x, say)."""
    def length(shapes: dict) -> int:
        n_in = max(1, math.prod(shapes[input_name]))
        return max(1, math.prod(shapes[full]) // n_in)
    return length


@dataclass
class OpSpec:
    name: str
    inputs: tuple[InputSpec, ...]
    params: dict[str, Any]
    outputs: tuple[OutputSpec, ...]
    golden_fn: Callable[..., Any]
    dtypes: tuple[str, ...]
    standard: dict
    validate_fn: Callable[..., None] | None = None
    ranks: tuple[int, int] = (0, 8)
    feedback: dict[str, str] = field(default_factory=dict)  # input <- output, multi-step
    step_param: str | None = None  # incremented at every step of a multi-step case
    aliases: tuple[str, ...] = ()
    description: str = ""
    version: str | None = None  # explicit golden version bump
    grads: Gradients | None = None
    cases: str | None = None  # the op's own case file or folder (user op packs)
    where: str = ""  # file:line of the golden, for messages
    # output -> fn(float64 inputs, that output rounded to its dtype) -> inputs: a kernel may
    # legitimately round this output and compute the others from it (README "reuse")
    reuse: dict[str, Callable[[dict, torch.Tensor], dict]] = field(default_factory=dict)
    # the compute-precision floor (verify/compute_floor.py): the precision a real kernel
    # computes in, and the function evaluated there (None: the golden; False: no floor)
    compute_dtype: str = "fp32"
    compute_floor: Callable[..., Any] | bool | None = None
    # how verify hunt narrows or extends its search of this op (HUNT_KEYS)
    hunt: dict = field(default_factory=dict)
    # -- the public surface -------------------------------------------------------
    def golden(self, **kwargs):
        """Run the float64 golden: inputs are upcast to float64 on the CPU first."""
        inputs, params = self.split_args(kwargs)
        inputs = {k: _as_float64(v) for k, v in inputs.items()}
        return self.golden_fn(**inputs, **params)

    def validate(self, **kwargs) -> None:
        """The real wrapper's input checks (TypeError / ValueError)."""
        if self.validate_fn is not None:
            inputs, params = self.split_args(kwargs)
            self.validate_fn(**inputs, **params)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        """Outputs kernels return, in order."""
        return [o.name for o in self.outputs if not o.golden_only]

    @property
    def golden_output_names(self) -> list[str]:
        """Outputs the golden returns, in order (kernel outputs, then golden-only ones)."""
        return [o.name for o in self.outputs]

    def output(self, name: str) -> OutputSpec:
        return next(o for o in self.outputs if o.name == name)

    def input(self, name: str) -> InputSpec:
        return next(i for i in self.inputs if i.name == name)

    def split_args(self, kwargs: dict) -> tuple[dict, dict]:
        names = set(self.input_names)
        unknown = set(kwargs) - names - set(self.params)
        if unknown:
            raise TypeError(f"{self.name}: unknown arguments {sorted(unknown)}")
        missing = names - set(kwargs)
        if missing:
            raise TypeError(f"{self.name}: missing inputs {sorted(missing)}")
        params = {**self.params, **{k: v for k, v in kwargs.items() if k in self.params}}
        return {k: kwargs[k] for k in self.input_names}, params

    def input_dtype(self, name: str, working: str) -> torch.dtype:
        rule = self.input(name).dtype
        return dt.to_torch(working if rule == WORKING else rule)

    def output_dtype(self, name: str, working: str, params: dict | None = None) -> torch.dtype:
        if name.startswith("grad_") and self.grads and name[5:] in self.grads.wrt \
                and name not in self.golden_output_names:
            return self.input_dtype(name[5:], working)
        out = self.output(name)
        return dt.to_torch(out.dtype_name(working, {**self.params, **(params or {})}))

    # -- outputs present for a case's params, and gradients --------------------------
    def active_outputs(self, params: dict) -> list[str]:
        """Kernel outputs produced with these params, in order."""
        return [o.name for o in self.outputs if not o.golden_only and o.active(params)]

    def active_golden_outputs(self, params: dict) -> list[str]:
        return [o.name for o in self.outputs if o.active(params)]

    def upstream_outputs(self, params: dict, working: str) -> list[str]:
        """Outputs that receive an upstream gradient in a backward case."""
        active = self.active_outputs(params)
        if self.grads is None:
            return []
        wanted = self.grads.of if self.grads.of is not None else active
        return [o for o in active if o in wanted
                and self.output_dtype(o, working, params).is_floating_point]

    def grad_outputs(self) -> list[str]:
        return [self.grads.grad_name(w) for w in self.grads.wrt] if self.grads else []

    @property
    def golden_version(self) -> str:
        """A hash of the golden's code and every project function it reaches, of the input
        generator's code and of the declaration (verify/golden_version.py): a changed
        golden, or a changed helper it calls, is a new key; a comment is not. An explicit
        ``version`` replaces the code hash."""
        cached = self.__dict__.get("_golden_version")
        if cached:
            return cached
        if self.version:
            return self.version
        from verify.specs import golden_version as gv
        from verify.specs import inputs as input_module
        decl = {
            "inputs": [(i.name, i.dtype) for i in self.inputs],
            "params": {k: repr(v) for k, v in self.params.items()},
            "outputs": [(o.name, o.dtype if isinstance(o.dtype, str) else
                         gv.normalized_source(inspect.getsource(o.dtype))[0])
                        for o in self.outputs],
            "grads": None if self.grads is None else [list(self.grads.wrt),
                                                      list(self.grads.of or [])],
        }
        blob = gv.fingerprint(self.golden_fn, [input_module]) + json.dumps(decl, sort_keys=True)
        self.__dict__["_golden_version"] = hashlib.sha256(blob.encode()).hexdigest()[:16]
        return self.__dict__["_golden_version"]

    def signature(self) -> str:
        """The call convention every kernel of this op follows, as Python would show it:
        ``op(input, ..., *, param=default, ...) -> (output, ...)``."""
        ins = [i.name + ("=None" if i.optional else "") for i in self.inputs]
        params = [f"{k}={v!r}" for k, v in self.params.items()]
        outs = self.output_names
        ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
        return f"{self.name}({', '.join(ins + (['*'] + params if params else []))}) -> {ret}"


def _as_float64(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=torch.float64)
    return value


_OPS: dict[str, OpSpec] = {}


def declare_op(name: str, *, inputs: Sequence[InputSpec], outputs: Sequence[OutputSpec],
               params: dict | None = None, dtypes: Sequence[str] = ("fp32", "fp16", "bf16"),
               standard: str | dict = "cann_v2", validate: Callable[..., None] | None = None,
               ranks: tuple[int, int] | None = None, feedback: dict | None = None,
               step_param: str | None = None, aliases: Sequence[str] = (),
               description: str = "", version: str | None = None,
               grads: Gradients | None = None, cases: str | os.PathLike | None = None,
               reuse: dict[str, Callable[[dict, torch.Tensor], dict]] | None = None,
               compute_dtype: str = "fp32",
               compute_floor: Callable[..., Any] | bool | None = None,
               calls: dict | None = None, hunt: dict | None = None):
    """Decorator for a float64 golden function: declares the op it is the golden of.

    inputs / outputs: ``InputSpec`` / ``OutputSpec`` in call order; params: name ->
    default; dtypes: the working dtypes cases may use; standard: the default precision
    standard (a name or a dict); validate: the real wrapper's input checks (raise
    TypeError / ValueError: ``expect_error`` cases test them); ranks: (min, max) rank of a
    case's main shape (default any); grads: the backward it declares; cases: the op's case
    file or folder (relative to the declaring file), used when ``--cases`` is not given;
    reuse: output -> fn(inputs, rounded) giving the inputs on which the golden computes
    the other outputs from that output rounded to its dtype (x = x1 + x2 rounded, then
    normalised): an implementation doing so is judged against that golden too.
    compute_dtype: the precision a real kernel computes in (default fp32): the
    compute-precision floor evaluates the golden there on the case's inputs (README
    "Two floors"); compute_floor: False for none, or a function with the golden's
    signature evaluated instead (a real kernel's algorithm); inside either,
    ``verify.working(t)`` rounds an intermediate a real kernel stores in the working dtype.
    calls: the framework calls this op is the math of (verify/bindings.py): record name
    (``"Functional.softmax"``, ``"NPU.npu_rms_norm"``) or callable -> ``verify.Call`` (or
    its inputs adapter alone); ``verify judge`` judges their recorded calls.
    hunt: how ``verify hunt`` narrows or extends its search of this op (README
    "Hunting"): ``params`` (name -> the values to try; [] keeps the default), ``inputs``
    (the inputs whose values it moves), ``families`` (the value families it draws),
    ``lengths`` (extents to try besides its own), ``max_elements``.
    """

    def wrap(golden_fn):
        where = _where(golden_fn)
        if name in _OPS:
            raise ConfigError(f"op '{name}' is declared twice: at {_OPS[name].where} and at "
                              f"{where}")
        flags = [o.golden_only for o in outputs]
        if flags != sorted(flags):
            raise ConfigError(f"op '{name}': golden-only outputs must come last")
        bad = [x for x in list(inputs) + list(outputs)
               if not isinstance(x, (InputSpec, OutputSpec))]
        if bad:
            raise ConfigError(f"op '{name}' ({where}): inputs and outputs must be "
                              f"verify.InputSpec / verify.OutputSpec, got {bad[0]!r}")
        case_path = None
        if cases is not None:
            base = os.path.dirname(os.path.abspath(inspect.getsourcefile(golden_fn) or "."))
            case_path = os.path.normpath(os.path.join(base, os.fspath(cases)))
        try:
            dtype_names = tuple(dt.canonical_name(d) for d in dtypes)
        except KeyError as exc:
            raise ConfigError(f"op '{name}' ({where}): unknown dtype {exc}; known: "
                              f"{', '.join(dt.DTYPE_NAMES)}") from None
        hunt_space = _check_hunt(name, where, hunt, inputs, params)
        _OPS[name] = OpSpec(
            name=name, inputs=tuple(inputs), params=dict(params or {}), outputs=tuple(outputs),
            golden_fn=golden_fn, dtypes=dtype_names,
            standard=standard if isinstance(standard, dict) else {"name": standard},
            validate_fn=validate, ranks=tuple(ranks) if ranks else (0, 8),
            feedback=dict(feedback or {}), step_param=step_param, aliases=tuple(aliases),
            description=description or (inspect.getdoc(golden_fn) or "").split("\n")[0],
            version=version, grads=grads, cases=case_path, where=where,
            reuse=dict(reuse or {}), compute_dtype=dt.canonical_name(compute_dtype),
            compute_floor=compute_floor, hunt=hunt_space,
        )
        if calls:
            try:
                calls_table.bind(name, calls, where)
            except ConfigError:
                del _OPS[name]
                raise
        return golden_fn

    return wrap


HUNT_KEYS = ("params", "inputs", "families", "lengths", "last_dim", "max_elements")
HUNT_FAMILIES = ("plain", "heavy", "outliers", "peaked", "zeros", "subnormal", "extreme")


def _check_hunt(name, where, hunt, inputs, params) -> dict:
    """An op's ``hunt=`` declaration, checked where it is made: a typo in it would
    otherwise narrow a search silently."""
    hunt = dict(hunt or {})
    what = f"op '{name}' ({where}): hunt"
    unknown = sorted(set(hunt) - set(HUNT_KEYS))
    if unknown:
        raise ConfigError(f"{what} has no key {unknown[0]!r}; known: {', '.join(HUNT_KEYS)}")
    names = {i.name for i in inputs}
    bad = [p for p in hunt.get("params", {}) if p not in (params or {})]
    if bad:
        raise ConfigError(f"{what}['params'] names {bad[0]!r}, not a param of the op")
    bad = [i for i in hunt.get("inputs", ()) if i not in names]
    if bad:
        raise ConfigError(f"{what}['inputs'] names {bad[0]!r}, not an input of the op")
    bad = [f for f in hunt.get("families", ()) if f not in HUNT_FAMILIES]
    if bad:
        raise ConfigError(f"{what}['families'] names {bad[0]!r}; known: "
                          f"{', '.join(HUNT_FAMILIES)}")
    for key in ("lengths", "last_dim"):
        bad = [n for n in hunt.get(key, ()) if not (isinstance(n, int) and n >= 1)]
        if bad:
            raise ConfigError(f"{what}[{key!r}] holds {bad[0]!r}, not a length >= 1")
    if "last_dim" in hunt and not hunt["last_dim"]:
        raise ConfigError(f"{what}['last_dim'] is empty: name the extents the last dim "
                          f"may take")
    return hunt


def _where(fn) -> str:
    """file:line of a function's definition (for messages that point at user code)."""
    fn = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return repr(fn)


# -- backends and kernels -------------------------------------------------------------
@dataclass
class Backend:
    """Where kernels run: a device, an availability check with the reason shown on SKIP
    rows, the versions a report records, and the largest case it takes (the Triton
    interpreter runs ~1M elements in seconds; larger shapes only on a real device)."""

    name: str
    device: str = "cpu"
    check: Callable[[], tuple[bool, str]] = lambda: (True, "")
    expect_fail: bool = False  # kernels here are known-bad: a FAIL is the expected outcome
    default: bool = True  # run when no --backend is given
    versions: Callable[[], dict] = lambda: {}
    max_elements: int | None = None
    note: str = ""  # how it runs here (e.g. "Triton interpreter on the CPU")
    isolation: str = "in-process"  # or "subprocess": each case in a process of its own
    module: str | None = None  # an optional built-in backend: imported when a run uses it
    triton: bool = False  # its kernels are Triton kernels (the interpreter probe applies)
    # what one case occupies on a Ray cluster (verify run --ray), e.g. {"NPU": 1};
    # None: from the device (npu: one NPU, cuda: one GPU, cpu: one CPU)
    resources: dict | None = None

    def available(self) -> tuple[bool, str]:
        return self.check()


@dataclass
class Kernel:
    op: str
    backend: str
    name: str
    fn: Callable[..., Any]
    description: str = ""
    where: str = ""  # file:line of the function
    dtypes: tuple[str, ...] | None = None  # working dtypes it covers (None: all)
    params: dict[str, tuple] | None = None  # param -> the values it covers
    forward_only: bool = False  # no backward: gradient rows SKIP

    def unsupported(self, dtype: str, params: dict) -> str:
        """Why this kernel does not cover a case ('' when it does), from what it declared."""
        if self.dtypes is not None and dtype not in self.dtypes:
            return f"kernel {self.backend}:{self.name} covers dtypes {', '.join(self.dtypes)}"
        for name, allowed in (self.params or {}).items():
            if name in params and params[name] not in allowed:
                return (f"kernel {self.backend}:{self.name} covers {name} in "
                        f"{list(allowed)}, not {params[name]!r}")
        return ""

    @property
    def id(self) -> str:
        return self.backend if self.name == self.op else f"{self.backend}.{self.name}"

    @property
    def backward(self) -> Callable[..., Any] | None:
        """A separate backward kernel registered for this kernel (None: the harness
        differentiates the forward with torch.autograd)."""
        own = _BACKWARDS.get((self.op, self.backend, self.name))
        return own if own is not None else _BACKWARDS.get((self.op, self.backend, None))


def _torch_device() -> str:
    wanted = os.environ.get("VERIFY_TORCH_DEVICE")
    if wanted:
        return wanted
    return "cuda" if torch.cuda.is_available() else "cpu"


_BACKENDS: dict[str, Backend] = {
    "torch": Backend("torch", device=_torch_device()),
    "mutants": Backend("mutants", device="cpu", expect_fail=True, default=False),
    # implementation routes of one op, compared by `verify strategies OP`; some are
    # known-bad routes, so plain runs leave them out
    "strategies": Backend("strategies", device=_torch_device(), default=False),
}
_KERNELS: list[Kernel] = []
_BACKWARDS: dict[tuple[str, str, str | None], Callable[..., Any]] = {}


def declare_backend(name: str, *, device: str = "cpu",
                    check: Callable[[], tuple[bool, str]] | None = None,
                    max_elements: int | None = None, versions: Callable[[], dict] | dict |
                    None = None, note: str = "", default: bool = True,
                    triton: bool = False, resources: dict | None = None) -> Backend:
    """``verify.backend(...)``: declare a user backend: the device its kernels get their
    inputs on, an availability check returning (ok, why not), the largest case (elements
    per input) it takes, the versions a report records, a note on how it runs; ``triton``:
    its kernels are Triton kernels (rows then carry the interpreter probe's warnings);
    ``resources``: what one case takes on a Ray cluster (``{"NPU": 1}``; default from the
    device)."""
    vers = versions if callable(versions) else (lambda: dict(versions or {}))
    return register_backend(Backend(name, device=device, check=check or (lambda: (True, "")),
                                    max_elements=max_elements, versions=vers, note=note,
                                    default=default, triton=triton, resources=resources))


def register_backend(backend: Backend) -> Backend:
    """Add or replace a backend (``verify.Backend``: device, availability check, size cap,
    versions, note). Kernels name it with ``@verify.kernel(op, backend=NAME)``."""
    _BACKENDS[backend.name] = backend
    return backend


def kernel(op: str, backend: str = "torch", name: str | None = None, description: str = "",
           *, dtypes: Sequence[str] | None = None, params: dict | None = None,
           forward_only: bool = False):
    """Register ``fn(**inputs, **params)`` as a kernel of ``op`` under ``backend``.

    What it covers: ``dtypes`` (working dtypes), ``params`` (name -> the values it
    implements), ``forward_only`` (no backward). Cases outside that are SKIP rows with the
    reason, as are cases for which the kernel raises ``verify.Unsupported("why")``.

    The kernel is named after the function (or ``name=``), so several kernels of one op
    live side by side under one backend; registering the same (op, backend, name) from
    two places is an error naming both. A backend name seen for the first time becomes a
    CPU backend that is always available (user kernels), so ``--backend mine`` selects
    them.
    """

    def wrap(fn):
        if not callable(fn):
            raise ConfigError(f"@verify.kernel('{op}'): {fn!r} is not callable")
        if backend not in _BACKENDS:
            register_backend(Backend(backend))
        kname = name or getattr(fn, "__name__", None) or op
        where = _where(fn)
        for k in _KERNELS:
            if (k.op, k.backend, k.name) == (op, backend, kname):
                if k.where == where:  # the same code registered again (a reload): replace
                    _KERNELS.remove(k)
                    break
                raise ConfigError(
                    f"kernel '{kname}' of op '{op}' under backend '{backend}' is registered "
                    f"twice: at {k.where} and at {where}; give one of them another name "
                    f"(@verify.kernel('{op}', backend='{backend}', name=...))")
        try:
            covered = None if dtypes is None else tuple(dt.canonical_name(d) for d in dtypes)
        except KeyError as exc:
            raise ConfigError(f"kernel '{kname}' ({where}): unknown dtype {exc}") from None
        _KERNELS.append(Kernel(op, backend, kname, fn,
                               description or (inspect.getdoc(fn) or "").split("\n")[0],
                               where, covered,
                               {k: tuple(v) for k, v in (params or {}).items()} or None,
                               forward_only))
        return _capturable(op, kname, fn)

    return wrap


def _capturable(op: str, kname: str, fn):
    """What ``@verify.kernel`` hands back: the function itself, which records its calls
    while a ``verify.capture`` runs (the harness calls the unwrapped one)."""
    import functools
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not calls_table.ACTIVE:
            return fn(*args, **kwargs)
        return calls_table.ACTIVE[-1].kernel_call(op, kname, fn, args, kwargs)
    call.__verify_kernel__ = fn
    return call


def backward_kernel(op: str, backend: str = "torch", name: str | None = None):
    """Register the separate backward of a kernel: the kernel ``name`` of ``op`` under
    ``backend``, or (no name) every kernel of that op and backend without one of its own.

    Called as ``fn(**inputs, **upstream, **params)``, where ``upstream`` holds
    ``grad_<output>`` for every output the op's gradients declare; returns the gradients
    of the op's ``wrt`` inputs in order (None for one it does not produce)."""

    def wrap(fn):
        _BACKWARDS[(op, backend, name)] = fn
        return fn

    return wrap


# -- discovery -----------------------------------------------------------------------
_LOADED = False
_LOADING = False  # this thread is loading (a nested call returns)
_LOAD_LOCK = threading.RLock()
_BUILTIN_GOLDENS = "verify.goldens"
_BUILTIN_KERNELS = ("verify.kernels.torch", "verify.kernels.mutants",
                    "verify.kernels.strategies")
PACK_GROUP = "kernel_verify.packs"  # entry points: modules that declare ops / kernels


def _import_tree(pkg_name: str) -> None:
    pkg = importlib.import_module(pkg_name)
    for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), prefix=pkg_name + "."):
        importlib.import_module(info.name)


def load_builtin() -> None:
    """Import the built-in goldens and core kernels (once), announce the optional
    backends without importing them, then load installed op packs."""
    global _LOADED, _LOADING
    if _LOADED:
        return
    # one thread loads while the others wait: a second thread once saw the pack half
    # loaded ("unknown op 'lion'"). The loading thread's own nested calls return at once.
    with _LOAD_LOCK:
        if _LOADED or _LOADING:
            return
        _LOADING = True
        try:
            from verify.kernels import OPTIONAL_BACKENDS, prepare_optional_backends
            prepare_optional_backends()
            _import_tree(_BUILTIN_GOLDENS)
            for pkg_name in _BUILTIN_KERNELS:
                _import_tree(pkg_name)
            for backend in OPTIONAL_BACKENDS:
                if backend.name not in _BACKENDS:
                    register_backend(backend)
            _load_packs()
        finally:
            _LOADED, _LOADING = True, False


def _load_packs() -> None:
    from importlib.metadata import entry_points
    for ep in entry_points(group=PACK_GROUP):
        try:
            ep.load()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"op pack '{ep.name}' ({ep.value}, entry point group "
                              f"{PACK_GROUP}) raised while loading: {type(exc).__name__}: "
                              f"{exc}") from exc


def optional_backend(name: str) -> bool:
    """One of the optional built-in backends (triton, pypto, npu), loaded or not: when it
    cannot run here, default runs leave it out and say so once."""
    from verify.kernels import OPTIONAL_BACKENDS
    return any(b.name == name for b in OPTIONAL_BACKENDS)


def load_backends(names: Sequence[str] | None = None) -> None:
    """Import the optional built-in backends among ``names`` (None: every one whose
    dependency is installed) together with their kernels. Nothing is imported for a
    backend that is not available here; what an import does to logging is undone."""
    load_builtin()
    wanted = list(_BACKENDS) if names is None else list(names)
    if any(n in ("mutants", "strategies") for n in wanted):  # packs add known-bad kernels
        wanted += [b.name for b in _BACKENDS.values() if b.module]
    for name in dict.fromkeys(wanted):
        b = _BACKENDS.get(name)
        if b is None or not b.module or not b.available()[0]:
            continue
        module = b.module
        b.module = None  # once
        with _quiet_logging():
            _import_tree(module)


@contextlib.contextmanager
def _quiet_logging():
    """Third-party imports (PyPTO's, say) may configure the root logger: keep ours."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers


def load_user_module(spec: str) -> None:
    """Import a user's module of kernels and/or op declarations: a dotted name on
    sys.path, or a .py file path (its folder goes on sys.path, so it can import its own
    helpers)."""
    load_builtin()
    try:
        if spec.endswith(".py") or os.sep in spec:
            path = os.path.abspath(spec)
            if not os.path.isfile(path):
                raise ConfigError(f"--kernels {spec}: no such file")
            mod_name = "verify_user_" + hashlib.sha1(path.encode()).hexdigest()[:10]
            if mod_name in sys.modules:
                return
            # imported already under its own name (a script did `import my_ops`, then
            # passed kernels=["my_ops.py"]): the same module, not a second declaration
            if any(getattr(m, "__file__", None) and os.path.abspath(m.__file__) == path
                   for m in list(sys.modules.values())):
                return
            folder = os.path.dirname(path)
            if folder not in sys.path:
                sys.path.append(folder)
            module_spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[mod_name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[mod_name]
                raise
        else:
            importlib.import_module(spec)
    except ConfigError:
        raise
    except ModuleNotFoundError as exc:
        raise ConfigError(f"--kernels {spec}: cannot import: {exc}") from exc
    except SystemExit as exc:  # sys.exit() at import: the run must not end "successfully"
        raise ConfigError(f"--kernels {spec}: importing it called sys.exit({exc.code!r})") \
            from None
    except Exception as exc:  # the user's module raised while importing
        raise ConfigError(f"--kernels {spec}: importing it raised "
                          f"{type(exc).__name__}: {exc}") from exc


def ops() -> list[str]:
    load_builtin()
    return sorted(_OPS)


def op(name: str) -> OpSpec:
    load_builtin()
    try:
        return _OPS[name]
    except KeyError:
        raise ConfigError(unknown_name("op", name, _OPS)) from None


def backends() -> dict[str, Backend]:
    load_builtin()
    return dict(_BACKENDS)


def backend(name: str) -> Backend:
    """A backend by name; an optional built-in one is imported here on first use (when
    its package is installed)."""
    load_builtin()
    if name in _BACKENDS and _BACKENDS[name].module:
        load_backends([name])
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ConfigError(unknown_name("backend", name, _BACKENDS)) from None


def kernels(op_name: str | None = None, backend_names: Sequence[str] | None = None) -> list[Kernel]:
    """Registered kernels of an op and/or backends. Naming backends loads them (an
    optional built-in backend is imported on first use); without, the loaded ones."""
    load_builtin()
    if backend_names is not None:
        load_backends(backend_names)
    return [k for k in _KERNELS
            if (op_name is None or k.op == op_name)
            and (backend_names is None or k.backend in backend_names)]
