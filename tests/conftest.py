"""Every test run gets its own golden store, so no test sees another run's goldens."""
import os
import shutil

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_golden_store(tmp_path_factory):
    old = os.environ.get("VERIFY_STORE")
    store = tmp_path_factory.mktemp("golden-store")
    os.environ["VERIFY_STORE"] = str(store)
    # and its own cache of indexed dumps (verify judge)
    os.environ.setdefault("VERIFY_INDEX_CACHE", str(tmp_path_factory.mktemp("index-cache")))
    yield
    if old is None:
        os.environ.pop("VERIFY_STORE", None)
    else:
        os.environ["VERIFY_STORE"] = old
    # the L1 goldens alone take ~16 GB, and pytest keeps the last three runs' temporary
    # folders: three kept stores fill a CI disk
    from verify.golden.store import close_all
    close_all()
    shutil.rmtree(store, ignore_errors=True)


def _from_a_test(fn) -> bool:
    """A function a test registered (its own module or a user module it loaded), not
    one of the harness's op packs (verify.goldens, verify.kernels.*)."""
    return not (getattr(fn, "__module__", "") or "").startswith("verify.")


def _snapshot():
    import sys

    from verify.specs import registry
    registry.load_builtin()
    return (set(registry._OPS), {id(k) for k in registry._KERNELS}, set(registry._BACKWARDS),
            set(sys.modules))


def _restore(snapshot) -> None:
    import sys

    from verify.specs import registry
    ops, kernels, backwards, modules = snapshot
    registry._KERNELS[:] = [k for k in registry._KERNELS
                            if id(k) in kernels or not _from_a_test(k.fn)]
    for key in set(registry._BACKWARDS) - backwards:
        if _from_a_test(registry._BACKWARDS[key]):
            del registry._BACKWARDS[key]
    for name in set(registry._OPS) - ops:
        if _from_a_test(registry._OPS[name].golden_fn):
            del registry._OPS[name]
    for name in set(sys.modules) - modules:  # user modules loaded from a path: a later
        if name.startswith("verify_user_"):   # test loading the same file registers again
            del sys.modules[name]


@pytest.fixture(autouse=True)
def _registrations_end_with_their_test():
    """Kernels, backward kernels and ops that a test registers in this process are gone
    after it (a backend left without kernels makes no items): xdist runs many tests in
    one process, and a later in-process ``verify.run()`` without backends runs every
    default backend it knows, a test's deliberately bad kernels included. What was
    registered before the test (the op packs, registrations made when test modules were
    imported) stays."""
    snapshot = _snapshot()
    yield
    _restore(snapshot)


@pytest.fixture(scope="module")
def module_registrations():
    """The same for a module-scoped fixture that registers kernels or ops (it runs before
    any test's own snapshot): what it registers ends with the module."""
    snapshot = _snapshot()
    yield
    _restore(snapshot)
