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
from typing import Sequence

from verify.specs import registry
# the data the queries below read (verify/specs/calls.py); Call, NotCovered and bind are
# verify.Call / verify.NotCovered / verify.bind
from verify.specs.calls import (_BY_NAME, _BY_TARGET, KERNEL_PREFIX, Binding,  # noqa: F401
                                Call, NotCovered, bind, callable_name, kernel_api)


def _convention(op: str):
    """The adapter of a kernel's own calls: the op's convention fn(*inputs, **params)."""
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
    registry.load_builtin()
    if api.startswith(KERNEL_PREFIX) and api not in _BY_NAME:
        op = api[len(KERNEL_PREFIX):].split(".")[0]
        if op not in registry.ops():
            return None
        return Binding(op, api, Call(_convention(op), backward=False), None,
                       "the op's kernel convention")
    return _BY_NAME.get(api)


def all_bindings() -> list[Binding]:
    registry.load_builtin()
    return list(_BY_NAME.values())


def for_callable(fn) -> Binding | None:
    registry.load_builtin()
    return _BY_TARGET.get(id(fn))


def of_op(op: str) -> list[Binding]:
    registry.load_builtin()
    return [b for b in _BY_NAME.values() if b.op == op]


def targets() -> list[Binding]:
    """Every binding with a Python callable (what a capture patches)."""
    registry.load_builtin()
    return [b for b in _BY_NAME.values() if b.target is not None]


def adapt(binding: Binding, args: Sequence, kwargs: dict) -> tuple[dict, dict]:
    """(op inputs, op params) of one call; NotCovered passes through, other exceptions
    become a ValueError naming the binding."""
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
