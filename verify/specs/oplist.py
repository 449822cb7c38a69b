"""What ``verify ops`` prints: a line per op, or one op's whole call convention."""
from __future__ import annotations

import json

from verify.specs import registry
from verify.specs.registry import WORKING, OpSpec, _rule_text


def _kernel_list(spec: OpSpec) -> str:
    return ", ".join(k.id + ("+backward" if k.backward else "")
                     for k in registry.kernels(spec.name))


def one_line(spec: OpSpec) -> str:
    grads = ""
    if spec.grads:
        reduced = set(spec.grads.reduced)
        grads = "  grads=[" + ", ".join(w + ("*" if w in reduced else "")
                                         for w in spec.grads.wrt) + "]"
    return (f"{spec.name}  dtypes={','.join(spec.dtypes)}  standard={spec.standard}{grads}  "
            f"kernels=[{_kernel_list(spec)}]")


def _output_line(out) -> str:
    if callable(out.dtype):
        dtype = _rule_text(out.dtype)
    else:
        dtype = "the case's dtype" if out.dtype == WORKING else out.dtype
    extra = []
    if out.when is not None:
        extra.append(f"only when {_rule_text(out.when)}")
    if out.compare != "values":
        extra.append(f"compared as {out.compare}" + (f" by {out.scores}" if out.scores else ""))
    return f"{out.name}: dtype {dtype}" + (f" ({'; '.join(extra)})" if extra else "")


def describe(spec: OpSpec) -> str:
    """Everything a kernel author needs to write a kernel of ``spec``."""
    lines = [spec.signature()]
    if spec.description:
        lines.append(f"  {spec.description}")
    lines.append(f"  golden: {spec.where}")
    lo, hi = spec.ranks
    lines.append(f"  working dtypes: {', '.join(spec.dtypes)}; main shape rank {lo}..{hi}")
    if spec.aliases:
        lines.append(f"  aliases: {', '.join(spec.aliases)}")
    lines.append("  inputs (in order, passed by keyword):")
    lines += [f"    {i.describe()}" for i in spec.inputs]
    lines.append("  params (keyword, with defaults):")
    lines += [f"    {k} = {v!r}" for k, v in spec.params.items()] or ["    (none)"]
    lines.append("  outputs (returned in this order; one tensor or a tuple):")
    lines += [f"    {_output_line(o)}" for o in spec.outputs if not o.golden_only]
    if spec.grads:
        reduced = set(spec.grads.reduced)
        lines.append("  gradients (autograd through the kernel, or @verify.backward_kernel "
                     "returning them in this order):")
        lines += [f"    grad_{w}: of input {w}" + (" (a reduction: tolerance scaled by sqrt(n))"
                                                   if w in reduced else "")
                  for w in spec.grads.wrt]
        of = spec.grads.of or [o.name for o in spec.outputs if not o.golden_only]
        lines.append(f"    upstream gradients passed to a backward kernel: "
                     f"{', '.join('grad_' + o for o in of)}")
    if spec.feedback:
        lines.append("  multi-step cases feed back: " + ", ".join(
            f"{o} -> {i}" for i, o in spec.feedback.items()))
    if spec.validate_fn is not None:
        lines.append(f"  input checks (expect_error cases: a kernel must raise the same "
                     f"TypeError / ValueError): {registry._where(spec.validate_fn)}")
    lines.append(f"  default standard: {json.dumps(spec.standard)}")
    if spec.cases:
        lines.append(f"  case file(s): {spec.cases}")
    lines.append(f"  kernels: {_kernel_list(spec) or '(none registered)'}")
    from verify.specs import bindings
    bound = bindings.of_op(spec.name)
    if bound:
        lines.append("  framework calls bound (verify judge / verify.capture judge their "
                     "recorded calls):")
        lines += [f"    {b.describe()}" for b in sorted(bound, key=lambda b: b.name)]
    else:
        lines.append("  framework calls bound: none (declare_op(..., calls={...}) binds them)")
    return "\n".join(lines)
