"""kernel-verify: prove a kernel precise enough against float64 goldens.

Python API (README "Use it in your project"):
    verify.ops()                                   names of the registered ops
    verify.op(name).golden(**inputs, **params)     the float64 golden
    verify.op(name).signature()                    the call convention of its kernels
    verify.compare(actual, golden, dtype=..., standard=...)  -> Verdict
    verify.run(level="L0", ops=..., backends=...)  -> RunResult (.df is a DataFrame)
    @verify.kernel("apply_adam_w_v2", backend="mine")  register your kernel (named after
                                                   the function, or name=...)
    @verify.backward_kernel("mhc_post", backend="mine")  its separate backward (optional:
                                                   otherwise autograd through the kernel)
    @verify.declare_op("my_op", inputs=[verify.InputSpec("x")], ...)  declare your own op
                                                   on its float64 golden

Names are imported on first use, so ``import verify`` (and ``verify --help``) stays cheap.
As a pytest plugin it is switched on explicitly: ``pytest -p verify`` or
``pytest_plugins = ["verify"]`` in a conftest.py; installing the package changes nothing
for other pytest runs.
"""
from __future__ import annotations

import importlib
import os as _os

# ``-p verify`` registers this module as a pytest plugin; pytest then loads the real one.
pytest_plugins = ["verify.running.pytest_plugin"]

# In a source checkout the built-in op pack sits beside this package (goldens/, kernels/,
# test_cases/); installed, it lives under verify/. A bare checkout resolves the same names.
_HERE = _os.path.dirname(_os.path.abspath(__file__))
_ROOT = _os.path.dirname(_HERE)
if not _os.path.isdir(_os.path.join(_HERE, "goldens")) and all(
        _os.path.isfile(_os.path.join(_ROOT, d, "__init__.py")) for d in ("goldens", "kernels")):
    __path__.append(_ROOT)  # noqa: F821  (a package's __path__)

_EXPORTS = {
    "run": "api", "RunResult": "api", "judge": "api",
    "compare": "comparator.comparison", "Verdict": "comparator.comparison",
    "ConfigError": "errors", "CaseFileError": "errors", "Unsupported": "errors",
    "ops": "specs.registry", "op": "specs.registry", "kernel": "specs.registry",
    "backward_kernel": "specs.registry", "declare_op": "specs.registry",
    "InputSpec": "specs.registry", "OutputSpec": "specs.registry", "Gradients": "specs.registry",
    "broadcast_length": "specs.registry", "WORKING": "specs.registry",
    "Backend": "specs.registry", "register_backend": "specs.registry", "backend": "specs.registry",
    "working": "golden.compute_floor",
    "Call": "specs.calls", "NotCovered": "specs.calls", "bind": "specs.calls",
    "capture": "cases.capture", "CaptureLimit": "cases.capture",
    "hunt": "running.hunt", "shrink": "running.shrink",
}

__all__ = sorted(_EXPORTS)

from verify import _moved  # noqa: E402  (the old import paths, with a deprecation warning)

_moved.install()


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        if name in _moved.MOVED:  # an old flat-layout module: verify/_moved.py
            return _moved.attribute(name)
        raise AttributeError(f"module 'verify' has no attribute '{name}'")
    attr = "declare_backend" if name == "backend" else name  # verify.backend(...) declares
    value = getattr(importlib.import_module(f"verify.{module}"), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
