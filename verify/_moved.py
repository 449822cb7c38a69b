"""Import paths of the flat layout before the stage packages (0.2): ``verify.registry``,
``verify.comparison``, ``verify.metrics``, ... keep working for one release, with a
DeprecationWarning naming the new path. An old name is the new module itself (the same
object in sys.modules), so state and ``isinstance`` checks agree whichever path a user's
code imported."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old module (under verify.) -> where it lives now
MOVED = {
    "dtype_traits": "comparator.dtype_traits", "dtypes": "comparator.dtypes",
    "metrics": "comparator.metrics", "metric_fields": "comparator.metric_fields",
    "histbins": "comparator.histbins", "standards": "comparator.standards",
    "comparison": "comparator.comparison", "benchmark": "comparator.benchmark",
    "plotdata": "comparator.plotdata",
    "registry": "specs.registry", "bindings": "specs.bindings", "oplist": "specs.oplist",
    "golden_version": "specs.golden_version", "inputs": "specs.inputs",
    "selection": "cases.selection", "shards": "cases.shards", "recorded": "cases.recorded",
    "msprobe_dump": "cases.msprobe_dump", "capture_calls": "cases.capture",
    "golden_source": "golden.source", "store": "golden.store",
    "registry_client": "golden.registry_client", "registry_records": "golden.registry_records",
    "service": "golden.service", "audit": "golden.audit", "compute_floor": "golden.compute_floor",
    "results": "report.results", "difftable": "report.difftable",
    "runner": "running.runner", "isolation": "running.isolation",
    "deadline": "running.deadline", "devices": "running.devices",
    "triton_probe": "running.triton_probe", "pytest_plugin": "running.pytest_plugin",
    "ray_run": "running.ray_run", "ray_tasks": "running.ray_tasks",
    "strategies": "running.strategies", "judge_records": "api",
}


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(f"verify.{old} moved to verify.{new}; the old path goes in the next "
                  f"release", DeprecationWarning, stacklevel=stacklevel)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``verify.<old>`` and hands back the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("verify.") or fullname.count(".") != 1:
            return None
        old = fullname.split(".", 1)[1]
        if old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        old = spec.name.split(".", 1)[1]
        _warn(old, MOVED[old], 3)
        return importlib.import_module(f"verify.{MOVED[old]}")

    def exec_module(self, module):
        pass  # the new module is already executed


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())


def attribute(name: str):
    """``verify.<old>`` as an attribute (``from verify import registry``)."""
    _warn(name, MOVED[name], 4)
    return importlib.import_module(f"verify.{MOVED[name]}")
