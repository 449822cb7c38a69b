"""``verify.capture(DIR)``: record a model's calls of bound ops without msprobe.

    with verify.capture("calls/", max_calls=10_000, max_bytes=2 << 30) as cap:
        loss = model(ids).sum(); loss.backward()
    verify judge calls/            # or: verify run --cases calls/ --backend mine

Every call of a callable an op binds (torch functions named in the bindings, torch_npu's
where it is installed, and your own ``@verify.kernel`` functions) is written to
``DIR/calls.jsonl`` (one JSON object per call: its name, arguments, outputs, device) with
its tensors in ``DIR/blobs/ab/<blake3>.safetensors``: content-addressed, so a tensor seen
twice (a weight in every step) is stored once; the golden store's blob format. Inputs are
written before the call runs (an in-place call changes nothing recorded) and every tensor
is detached: the forward's results and its autograd graph are the model's own.

Torch functions are seen through a TorchFunctionMode (only the outermost call: what a
bound call does inside is its own business); torch_npu functions and the user's own bound
functions are wrapped in their modules for the duration of the capture; @verify.kernel
functions record themselves while a capture runs.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from blake3 import blake3
from safetensors.torch import save_file
from torch.overrides import TorchFunctionMode

from verify.errors import ConfigError
from verify.specs import bindings, registry
from verify.specs import calls as calls_table

log = logging.getLogger("verify.capture")
INDEX = "calls.jsonl"
_STATE = threading.local()  # depth of bound calls being recorded (only the outermost is)
_ACTIVE = calls_table.ACTIVE  # the captures running now, innermost last


class CaptureLimit(UserWarning):
    """A capture reached max_calls or max_bytes: later calls are counted, not recorded."""


@dataclass
class Capture:
    folder: Path
    ops: set | None
    max_calls: int | None
    max_bytes: int | None
    calls: int = 0
    bytes: int = 0
    blobs: int = 0
    step: int = 0
    skipped: dict = field(default_factory=dict)  # api -> calls not recorded (a limit)
    limit_message: str = ""
    _counts: dict = field(default_factory=dict)
    _index: object = None
    _seen: set = field(default_factory=set)

    def kernel_call(self, op: str, kernel_name: str, fn, args, kwargs):
        """A ``@verify.kernel`` function called while this capture runs."""
        return kernel_call(self, op, kernel_name, fn, args, kwargs)

    def next_step(self) -> None:
        """Mark the start of the next training step (records carry their step)."""
        self.step += 1

    # -- writing --------------------------------------------------------------------
    def _blob(self, t: torch.Tensor) -> dict:
        data = t.detach().to("cpu").contiguous()
        h = blake3(max_threads=blake3.AUTO)
        h.update(f"{data.dtype}|{tuple(data.shape)}|".encode())
        if data.numel():
            h.update(memoryview(data.reshape(-1).view(torch.uint8).numpy()))
        digest = h.hexdigest()
        ref = {"type": "tensor", "dtype": str(data.dtype), "shape": list(data.shape),
               "blob": digest}
        if digest in self._seen:
            return ref
        path = self.folder / "blobs" / digest[:2] / f"{digest}.safetensors"
        if not path.exists():
            size = data.numel() * data.element_size()
            if self.max_bytes is not None and self.bytes + size > self.max_bytes:
                raise _Full(f"max_bytes {self.max_bytes} reached ({self.bytes} bytes of "
                            f"tensors written)")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".part{os.getpid()}")
            save_file({"t": data.clone() if data.is_shared() else data}, str(tmp))
            os.replace(tmp, path)
            self.bytes += size
            self.blobs += 1
        self._seen.add(digest)
        return ref

    def _encode(self, value):
        if isinstance(value, torch.Tensor):
            return self._blob(value)
        if isinstance(value, torch.dtype):
            return {"type": "dtype", "name": str(value).split(".")[-1]}
        if isinstance(value, tuple):
            return {"type": "tuple", "items": [self._encode(v) for v in value]}
        if isinstance(value, list):
            return [self._encode(v) for v in value]
        if isinstance(value, dict):
            return {str(k): self._encode(v) for k, v in value.items()}
        if isinstance(value, torch.Size):
            return list(value)
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return repr(value)

    def _skip(self, api: str, why: str) -> None:
        self.skipped[api] = self.skipped.get(api, 0) + 1
        if not self.limit_message:
            self.limit_message = (f"verify.capture({self.folder}): {why}: later calls are "
                                  f"counted, not recorded")
            warnings.warn(self.limit_message, CaptureLimit, stacklevel=4)

    def record(self, api: str, args, kwargs, run):
        """Run the call (``run()``), recording its inputs first and its outputs after."""
        if self.max_calls is not None and self.calls >= self.max_calls:
            self._skip(api, f"max_calls {self.max_calls} reached")
            return run()
        try:
            enc_args, enc_kwargs = self._encode(list(args)), self._encode(dict(kwargs))
        except _Full as exc:
            self._skip(api, str(exc))
            return run()
        result = run()
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        try:
            enc_outs = self._encode(outs)
        except _Full as exc:
            self._skip(api, str(exc))
            return result
        n = self._counts.get(api, 0)
        self._counts[api] = n + 1
        device = next((t.device.type for t in _tensors(args, kwargs)), "cpu")
        line = {"record": f"{api}.{n}.forward", "api": api, "direction": "forward",
                "args": enc_args, "kwargs": enc_kwargs, "outputs": enc_outs,
                "device": device, "step": self.step}
        self._index.write(json.dumps(line) + "\n")
        self.calls += 1
        return result

    def close(self) -> None:
        for api, n in sorted(self.skipped.items()):
            self._index.write(json.dumps({"note": "limit", "api": api, "count": n,
                                          "reason": self.limit_message or "a limit"}) + "\n")
        self._index.close()


class _Full(Exception):
    pass


def _tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (t for t in v if isinstance(t, torch.Tensor))


class _Mode(TorchFunctionMode):
    def __init__(self, cap: Capture, targets: dict[int, bindings.Binding]):
        super().__init__()
        self.cap, self.targets = cap, targets

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        binding = self.targets.get(id(func))
        if binding is None or getattr(_STATE, "depth", 0):
            return func(*args, **kwargs)
        return _recorded(self.cap, binding.name, args, kwargs, lambda: func(*args, **kwargs))


def _recorded(cap: Capture, api: str, args, kwargs, run):
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        return cap.record(api, args, kwargs, run)
    finally:
        _STATE.depth -= 1


def kernel_call(cap: "Capture", op: str, kernel_name: str, fn, args, kwargs):
    """A user kernel called while a capture runs (registry.kernel's wrapper)."""
    if cap is None or getattr(_STATE, "depth", 0) or (cap.ops and op not in cap.ops):
        return fn(*args, **kwargs)
    return _recorded(cap, bindings.kernel_api(op, kernel_name), args, kwargs,
                     lambda: fn(*args, **kwargs))


def _npu_wrappers(cap: Capture, wanted):
    """torch_npu's bound functions, wrapped for the capture (where torch_npu exists)."""
    try:
        import torch_npu  # noqa: F401
    except Exception:
        return []
    patched = []
    for b in wanted:
        if not b.name.startswith("NPU."):
            continue
        fname = b.name.split(".", 1)[1]
        for owner in (torch_npu, getattr(torch, "ops", None) and torch_npu):
            fn = getattr(owner, fname, None)
            if fn is None:
                continue

            def wrapper(*args, _fn=fn, _api=b.name, **kwargs):
                if getattr(_STATE, "depth", 0):
                    return _fn(*args, **kwargs)
                return _recorded(cap, _api, args, kwargs, lambda: _fn(*args, **kwargs))
            setattr(owner, fname, wrapper)
            patched.append((owner, fname, fn))
            break
    return patched


def _own_wrappers(cap: Capture, wanted):
    """The user's own bound Python functions, wrapped in their modules for the capture
    (a call through the module, ``my_ops.fused(...)``, is recorded; a reference taken
    before the capture is not: decorate such a function with @verify.kernel instead)."""
    import inspect
    import sys
    patched = []
    for b in wanted:
        fn = b.target
        if fn is None or not inspect.isfunction(fn) or fn.__module__.startswith("torch"):
            continue
        owner = sys.modules.get(fn.__module__)
        if owner is None or getattr(owner, fn.__name__, None) is not fn:
            continue

        def wrapper(*args, _fn=fn, _api=b.name, **kwargs):
            if getattr(_STATE, "depth", 0):
                return _fn(*args, **kwargs)
            return _recorded(cap, _api, args, kwargs, lambda: _fn(*args, **kwargs))
        setattr(owner, fn.__name__, wrapper)
        patched.append((owner, fn.__name__, fn))
    return patched


@contextlib.contextmanager
def capture(folder, ops=None, max_calls: int | None = None, max_bytes: int | None = None):
    """Record every call of a bound callable made inside the block into ``folder``
    (created; an existing capture there is added to). ``ops``: only these ops' calls;
    ``max_calls`` / ``max_bytes``: stop recording (with a CaptureLimit warning, and the
    calls not recorded counted in calls.jsonl) past that many calls / bytes of new
    tensors. Yields the Capture (``.calls``, ``.bytes``, ``.skipped``,
    ``.next_step()``)."""
    registry.load_builtin()
    for name, value in (("max_calls", max_calls), ("max_bytes", max_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ConfigError(f"verify.capture: {name} must be a whole number >= 0, not "
                              f"{value!r}")
    wanted_ops = None
    if ops is not None:
        wanted_ops = {ops} if isinstance(ops, str) else set(ops)
        unknown = wanted_ops - set(registry.ops())
        if unknown:
            raise ConfigError(f"verify.capture: unknown op(s) {sorted(unknown)}")
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        index = open(path / INDEX, "a", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"verify.capture: cannot write {path}: {exc}") from None
    cap = Capture(path, wanted_ops, max_calls, max_bytes, _index=index)
    chosen = [b for b in bindings.targets() if wanted_ops is None or b.op in wanted_ops]
    targets = {id(b.target): b for b in chosen}
    patched = _npu_wrappers(cap, [b for b in bindings.all_bindings()
                                  if wanted_ops is None or b.op in wanted_ops])
    patched += _own_wrappers(cap, chosen)
    _ACTIVE.append(cap)
    try:
        with _Mode(cap, targets):
            yield cap
    finally:
        _ACTIVE.remove(cap)
        for owner, fname, fn in patched:
            setattr(owner, fname, fn)
        cap.close()
        log.info("verify.capture: %d calls, %d tensors (%d bytes) in %s", cap.calls,
                 cap.blobs, cap.bytes, path)
