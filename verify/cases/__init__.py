"""Stage 3, cases: what is run. Case files and their schema, the selection of a run
(levels, ops, dtypes, backends), shards, and recorded calls as cases (msprobe dumps,
verify.capture folders). May import: errors, notices, comparator, specs.

``verify.cases`` was the module of the Case type (now ``verify.cases.case``); its names
are still found here, with a deprecation warning, for one release."""
from __future__ import annotations


def __getattr__(name: str):
    import importlib
    import warnings
    case = importlib.import_module("verify.cases.case")
    if name.startswith("__") or not hasattr(case, name):
        raise AttributeError(f"module 'verify.cases' has no attribute '{name}'")
    warnings.warn(f"verify.cases.{name} moved to verify.cases.case.{name}; the old path "
                  f"goes in the next release", DeprecationWarning, stacklevel=2)
    return getattr(case, name)
