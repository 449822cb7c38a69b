"""Every test run gets its own golden store, so no test sees another run's goldens."""
import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_golden_store(tmp_path_factory):
    old = os.environ.get("VERIFY_STORE")
    os.environ["VERIFY_STORE"] = str(tmp_path_factory.mktemp("golden-store"))
    yield
    if old is None:
        os.environ.pop("VERIFY_STORE", None)
    else:
        os.environ["VERIFY_STORE"] = old
