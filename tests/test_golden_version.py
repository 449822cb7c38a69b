"""The golden version follows the code a golden runs: a comment, a docstring or another
op's edit keeps it; an edit to the golden or to any helper it reaches (in another module,
through a closure, a partial or a constant) changes it."""
import importlib
import sys
import textwrap

import pytest

from verify.specs import golden_version as gv

HELPERS = '''
SCALE = 2.0


def scale(x):
    """Doubles."""
    return x * SCALE


def unused(x):
    return x + 1
'''

GOLDENS = '''
import functools
import myhelpers


def _inner(x):
    return myhelpers.scale(x)


def golden_a(x):
    """The golden of op a."""
    # a comment
    return _inner(x) + 1


def golden_b(x):
    return x - 1


def make(offset):
    def golden(x):
        return myhelpers.scale(x) + offset
    return golden


golden_c = make(3.0)
golden_d = functools.partial(myhelpers.scale)
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))

    def load(helpers=HELPERS, goldens=GOLDENS):
        for name in ("myhelpers", "mygoldens"):
            sys.modules.pop(name, None)
        (tmp_path / "myhelpers.py").write_text(textwrap.dedent(helpers))
        (tmp_path / "mygoldens.py").write_text(textwrap.dedent(goldens))
        importlib.invalidate_caches()
        mod = importlib.import_module("mygoldens")
        return {n: gv.fingerprint(getattr(mod, n))
                for n in ("golden_a", "golden_b", "golden_c", "golden_d")}

    yield load
    for name in ("myhelpers", "mygoldens"):
        sys.modules.pop(name, None)


def test_comments_docstrings_and_layout_change_nothing(project):
    before = project()
    edited = GOLDENS.replace("# a comment", "# another comment\n\n    # and more") \
        .replace('"""The golden of op a."""', '"""Reworded entirely."""')
    after = project(goldens=edited)
    assert after == before


def test_another_ops_edit_changes_only_that_op(project):
    before = project()
    after = project(goldens=GOLDENS.replace("return x - 1", "return x - 2"))
    assert after["golden_b"] != before["golden_b"]
    assert {k: after[k] for k in ("golden_a", "golden_c", "golden_d")} == \
        {k: before[k] for k in ("golden_a", "golden_c", "golden_d")}


def test_a_helper_in_another_module_changes_every_golden_that_reaches_it(project):
    before = project()
    after = project(helpers=HELPERS.replace("return x * SCALE", "return x * SCALE * 1.0"))
    for name in ("golden_a", "golden_c", "golden_d"):  # direct, closure and partial routes
        assert after[name] != before[name], name
    assert after["golden_b"] == before["golden_b"]


def test_a_constant_a_helper_reads_is_part_of_the_version(project):
    before = project()
    after = project(helpers=HELPERS.replace("SCALE = 2.0", "SCALE = 2.5"))
    assert after["golden_a"] != before["golden_a"]
    assert after["golden_b"] == before["golden_b"]


def test_unreached_helpers_and_closure_values(project):
    before = project()
    assert project(helpers=HELPERS.replace("return x + 1", "return x + 7")) == before
    after = project(goldens=GOLDENS.replace("make(3.0)", "make(4.0)"))
    assert after["golden_c"] != before["golden_c"] and after["golden_a"] == before["golden_a"]


def test_builtin_golden_versions_are_stable_and_distinct():
    import verify
    versions = {name: verify.op(name).golden_version for name in verify.ops()}
    assert len(set(versions.values())) == len(versions)
    assert all(len(v) == 16 for v in versions.values())


def test_the_optimizer_goldens_reach_the_shared_chunked_helper():
    """goldens/chunked.py holds no golden of its own, yet every optimizer golden runs it."""
    import verify
    fp = gv._Fingerprint(frozenset({"verify"}))
    fp.add(verify.op("lion").golden_fn)
    assert any(p.startswith("code verify.goldens.chunked.") for p in fp.parts)


def test_a_numba_compiled_helper_is_followed_into_its_python_source(project):
    """A golden calling an @njit helper runs the helper's Python code: editing it must
    change the version (a dispatcher is not a plain function, and was not followed)."""
    helpers = HELPERS.replace("def scale(x):", "import numba\n\n\n@numba.njit\ndef scale(x):")
    before = project(helpers=helpers)
    after = project(helpers=helpers.replace("return x * SCALE", "return x * SCALE * 1.0001"))
    assert after["golden_a"] != before["golden_a"] and after["golden_b"] == before["golden_b"]
