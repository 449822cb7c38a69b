"""Op bindings: which framework calls an op is the math of, and how their arguments map.

A binding maps one framework call, named as msprobe names it (``"Functional.softmax"``,
``"Torch.softmax"``, ``"Tensor.softmax"``, ``"NPU.npu_rms_norm"``) and/or given as the
Python callable (``torch.nn.functional.softmax``, for ``verify.capture``), to an op:

- ``inputs(*args, **kwargs) -> dict``: the op's inputs and params from the call's own
  arguments (tensors as the call got them; on meta tensors while a dump is indexed, so
  shapes and dtypes are known before anything is loaded);
- ``outputs(recorded, *args, **kwargs) -> dict``: the op's outputs from what the call
  returned (a list), in the op's layout; default: the op's outputs in order, ``None``
  entries of ``names`` left out;
- ``backward``: whether a recorded backward of this call holds the true gradients of its
  tensor arguments (msprobe's records of composite calls do not: linear's holds an
  internal addmm operand's gradient).

An adapter raises ``NotCovered("why")`` for a call the op does not cover (a batched
matmul for ``linear``): such calls are listed as not judged, with the reason. Any other
exception means the record does not fit the binding: an ERROR row naming it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .errors import ConfigError


class NotCovered(Exception):
    """A framework call the op does not cover: not judged, listed with this reason."""


@dataclass(frozen=True)
class Call:
    """How one framework call maps to an op (``declare_op(calls={name: Call(...)})``)."""

    inputs: Callable[..., dict]
    outputs: Callable[..., dict] | Sequence[str | None] | None = None
    backward: bool = False
    description: str = ""

    def op_outputs(self, spec, recorded: Sequence, args: Sequence, kwargs: dict) -> dict:
        """The op's outputs (name -> tensor) from the call's recorded outputs."""
        if callable(self.outputs):
            return dict(self.outputs(list(recorded), *args, **kwargs))
        names = list(self.outputs) if self.outputs is not None else spec.output_names
        return {n: t for n, t in zip(names, recorded) if n is not None and t is not None}


@dataclass
class Binding:
    op: str
    name: str  # the record name of the call (prefix.api), or the callable's qualified name
    call: Call
    target: Any = None  # the Python callable, when one is bound (capture)
    where: str = ""

    def describe(self) -> str:
        extra = " (backward records judged)" if self.call.backward else ""
        text = f" {self.call.description}" if self.call.description else ""
        return f"{self.name}{extra}{text}"


_BY_NAME: dict[str, Binding] = {}
_BY_TARGET: dict[int, Binding] = {}


def callable_name(fn) -> str:
    """How a capture names a call: as msprobe does for torch's own functions
    (``Functional.rms_norm``, ``Torch.softmax``, ``Tensor.softmax``), so that one binding
    serves dumps and captures; other callables by module and qualified name."""
    module = getattr(fn, "__module__", None) or ""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    name = getattr(fn, "__name__", qual)
    if module in ("torch.nn.functional", "torch._C._nn"):
        return f"Functional.{name}"
    if qual.startswith("_VariableFunctionsClass.") or (module == "torch" and "." not in qual):
        return f"Torch.{name}"
    if qual.startswith(("TensorBase.", "Tensor.")):
        return f"Tensor.{name}"
    if module.startswith("verify_user_"):  # loaded from a file (--kernels my_ops.py): the
        import os                          # name it has when the model imports it
        module = os.path.splitext(os.path.basename(inspect.getsourcefile(fn) or module))[0]
    return f"{module}.{qual}" if module else qual


def bind(op: str, calls: dict, where: str = "") -> None:
    """Register ``calls`` (record name or callable -> Call or an inputs adapter) for op."""
    for key, value in calls.items():
        call = value if isinstance(value, Call) else Call(inputs=value)
        if not callable(call.inputs):
            raise ConfigError(f"op '{op}' ({where}): the binding of {key!r} needs an inputs "
                              f"adapter fn(*args, **kwargs) -> dict, got {call.inputs!r}")
        if isinstance(key, str):
            name, target = key, None
            if "." not in name:
                raise ConfigError(f"op '{op}' ({where}): binding {name!r} must be a record "
                                  f"name such as 'Functional.softmax' or 'NPU.npu_rms_norm'")
        elif callable(key):
            name, target = callable_name(key), key
        else:
            raise ConfigError(f"op '{op}' ({where}): a binding key is a record name or a "
                              f"callable, not {key!r}")
        held = _BY_NAME.get(name)
        if held is not None and held.op != op:
            raise ConfigError(f"{name} is bound to two ops: '{held.op}' ({held.where}) and "
                              f"'{op}' ({where})")
        binding = Binding(op, name, call, target, where)
        _BY_NAME[name] = binding
        if target is not None:
            _BY_TARGET[id(target)] = binding


KERNEL_PREFIX = "Kernel."  # a user kernel's calls in a capture: Kernel.<op>.<kernel>


def kernel_api(op: str, kernel_name: str) -> str:
    return f"{KERNEL_PREFIX}{op}.{kernel_name}"


def _convention(op: str):
    """The adapter of a kernel's own calls: the op's convention fn(*inputs, **params)."""
    from . import registry
    spec = registry.op(op)

    def inputs(*args, **kwargs):
        if len(args) > len(spec.input_names):
            raise TypeError(f"{len(args)} positional arguments; op '{op}' has "
                            f"{len(spec.input_names)} inputs")
        out = dict(zip(spec.input_names, args))
        out.update(kwargs)
        return out
    return inputs


def for_record(api: str) -> Binding | None:
    """The binding of a record's call name (``Functional.rms_norm``; a capture's
    ``Kernel.<op>.<kernel>`` follows the op's own convention), if any."""
    from . import registry
    registry.load_builtin()
    if api.startswith(KERNEL_PREFIX) and api not in _BY_NAME:
        op = api[len(KERNEL_PREFIX):].split(".")[0]
        if op not in registry.ops():
            return None
        return Binding(op, api, Call(_convention(op), backward=False), None,
                       "the op's kernel convention")
    return _BY_NAME.get(api)


def all_bindings() -> list[Binding]:
    from . import registry
    registry.load_builtin()
    return list(_BY_NAME.values())


def for_callable(fn) -> Binding | None:
    from . import registry
    registry.load_builtin()
    return _BY_TARGET.get(id(fn))


def of_op(op: str) -> list[Binding]:
    from . import registry
    registry.load_builtin()
    return [b for b in _BY_NAME.values() if b.op == op]


def targets() -> list[Binding]:
    """Every binding with a Python callable (what a capture patches)."""
    from . import registry
    registry.load_builtin()
    return [b for b in _BY_NAME.values() if b.target is not None]


def adapt(binding: Binding, args: Sequence, kwargs: dict) -> tuple[dict, dict]:
    """(op inputs, op params) of one call; NotCovered passes through, other exceptions
    become a ValueError naming the binding."""
    from . import registry
    spec = registry.op(binding.op)
    try:
        mapped = dict(binding.call.inputs(*args, **kwargs))
    except NotCovered:
        raise
    except Exception as exc:
        raise ValueError(f"the record does not fit binding {binding.name} -> op "
                         f"'{binding.op}' ({binding.where or 'built in'}): "
                         f"{type(exc).__name__}: {exc}") from exc
    unknown = set(mapped) - set(spec.input_names) - set(spec.params)
    missing = [i.name for i in spec.inputs if i.name not in mapped and not i.optional]
    if unknown or missing:
        raise ValueError(f"binding {binding.name} -> op '{binding.op}' "
                         f"({binding.where or 'built in'}) gave "
                         + (f"unknown names {sorted(unknown)}" if unknown else "")
                         + ("; " if unknown and missing else "")
                         + (f"no value for inputs {missing}" if missing else ""))
    inputs = {n: mapped.get(n) for n in spec.input_names}
    params = {k: v for k, v in mapped.items() if k in spec.params}
    return inputs, params


def where_of(fn) -> str:
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return ""


@dataclass
class NotJudged:
    """Records that were not judged, by call name, with the reason and a count."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, api: str, reason: str, n: int = 1) -> None:
        self.counts[(api, reason)] = self.counts.get((api, reason), 0) + n

    def merge(self, other: "NotJudged") -> None:
        for (api, reason), n in other.counts.items():
            self.add(api, reason, n)

    def as_list(self) -> list[dict]:
        return [{"api": api, "count": n, "reason": reason}
                for (api, reason), n in sorted(self.counts.items(),
                                               key=lambda kv: (-kv[1], kv[0]))]

    def lines(self) -> list[str]:
        return [f"{e['api']} x{e['count']} ({e['reason']})" for e in self.as_list()]
