"""The framework calls an op binds, as data: ``Call`` (how one call maps to an op),
``NotCovered``, the table of bindings ``declare_op(calls=...)`` and ``verify.bind`` fill,
and the capture that is recording now (``verify.capture``; the ``@verify.kernel``
wrapper asks here). Imports nothing of the harness but its errors: the registry declares
into it, and verify/specs/bindings.py answers questions about it (docs there)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from verify.errors import ConfigError

# the verify.capture running now, innermost last (verify/cases/capture.py)
ACTIVE: list = []


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
