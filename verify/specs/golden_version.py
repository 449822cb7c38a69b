"""A golden's version: a hash of the code it runs, not of the text around it.

The fingerprint covers the golden function and everything of the project it reaches:
functions and classes it names (through module attributes, closures and
``functools.partial`` too, recursively, in any module), and the plain constants it reads
(``EPS = 1e-6``). Third-party and standard-library code is left out (torch is versioned by
the environment, not by us). Each piece of code is reduced to its tokens without comments,
blank lines, docstrings or decorators, so editing a comment, a docstring or another op's
golden changes nothing, while editing a helper changes every golden that calls it.

Code reached only dynamically (``getattr(module, name)``, a function looked up in a dict
built at run time) is not seen: give such a golden an explicit ``version=``.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import io
import os
import site
import sys
import sysconfig
import textwrap
import tokenize
import types

_SIMPLE = (int, float, complex, str, bytes, bool, type(None))


@functools.lru_cache(maxsize=1)
def _external_roots() -> tuple[str, ...]:
    """Folders whose code is not the project's: the standard library and site-packages."""
    paths = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            paths.add(os.path.realpath(p))
    try:
        paths.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:  # some virtualenv flavours
        pass
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        paths.add(os.path.realpath(user))
    return tuple(sorted(paths))


def _is_project(module_name: str | None, roots: frozenset[str]) -> bool:
    """Code we fingerprint: the harness and the golden's own package wherever they are
    installed, and any module that lives outside the standard library and site-packages
    (a user's project folder)."""
    if not module_name:
        return False
    if module_name.split(".")[0] in roots:
        return True
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if not path:
        return False
    path = os.path.realpath(path)
    return not any(path.startswith(root + os.sep) for root in _external_roots())


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers of every docstring in a parsed piece of code."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(
                    getattr(body[0], "value", None), ast.Constant) and isinstance(
                    body[0].value.value, str):
                lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return lines


def _def_start(tree: ast.AST) -> int:
    """The line of the first ``def`` / ``class`` keyword (decorators are left out)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return node.lineno
    return 1


@functools.lru_cache(maxsize=4096)
def normalized_source(source: str) -> tuple[str, ast.AST | None]:
    """(the code's tokens without comments, blank lines, docstrings and decorators; its
    syntax tree, or None when it does not parse on its own, as a lambda's line may not).
    Cached by the text: every op's version reads the input generator and shared helpers,
    and tokenizing them once per op was most of a worker's start-up."""
    source = textwrap.dedent(source)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    skip = _docstring_lines(tree) if tree is not None else set()
    start = _def_start(tree) if tree is not None else 1
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING):
                continue
            if tok.start[0] < start or (tok.type == tokenize.STRING and tok.start[0] in skip):
                continue
            out.append(tok.string if tok.type not in (tokenize.INDENT, tokenize.DEDENT)
                       else tokenize.tok_name[tok.type])
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source, tree
    return " ".join(out), tree


@functools.lru_cache(maxsize=4096)
def _source(obj) -> str:
    """inspect.getsource, once per object: for a class it parses the whole module, and the
    same helpers are reached from many goldens."""
    return inspect.getsource(obj)


def _code_summary(code: types.CodeType) -> str:
    """Where no source can be read: names, constants and nested code, not bytecode (which
    changes with the Python version)."""
    consts = []
    for c in code.co_consts:
        consts.append(_code_summary(c) if isinstance(c, types.CodeType) else repr(c))
    return repr((code.co_names, code.co_varnames, code.co_freevars, consts))


def _referenced_names(tree: ast.AST | None, code: types.CodeType | None) -> list[list[str]]:
    """Dotted name chains the code reads: ``a``, ``a.b.c`` as ['a', 'b', 'c']."""
    chains: list[list[str]] = []
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                parts, cur = [], node
                while isinstance(cur, ast.Attribute):
                    parts.append(cur.attr)
                    cur = cur.value
                if isinstance(cur, ast.Name):
                    chains.append([cur.id] + parts[::-1])
            elif isinstance(node, ast.Name):
                chains.append([node.id])
    elif code is not None:
        chains.extend([n] for n in code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                chains.extend(_referenced_names(None, c))
    return chains


def _compiled_source(obj):
    """The Python function behind a compiled one (a numba dispatcher's ``py_func``), whose
    code is what the golden runs; anything else as it is."""
    func = getattr(obj, "py_func", None)
    return func if isinstance(func, types.FunctionType) else obj


class _Fingerprint:
    def __init__(self, roots: frozenset[str]):
        self.roots = roots
        self.seen: set[int] = set()
        self.parts: list[str] = []

    def add(self, obj, label: str = "") -> None:
        if isinstance(obj, functools.partial):
            self.parts.append(f"partial {label} {obj.args!r} {sorted(obj.keywords)!r}")
            self.add(obj.func)
            for v in list(obj.args) + list(obj.keywords.values()):
                self.add_value(v, label)
            return
        obj = inspect.unwrap(obj) if callable(obj) else obj
        obj = _compiled_source(obj)
        if id(obj) in self.seen:
            return
        if isinstance(obj, (types.FunctionType, type)):
            self.seen.add(id(obj))
            if not _is_project(getattr(obj, "__module__", None), self.roots):
                self.parts.append(f"external {getattr(obj, '__module__', '')}."
                                  f"{getattr(obj, '__qualname__', '')}")
                return
            self._add_code(obj)

    def add_value(self, value, label: str) -> None:
        """A value a piece of code reads: code of ours is followed, constants recorded."""
        if isinstance(value, _SIMPLE):
            self.parts.append(f"const {label}={value!r}")
        elif isinstance(value, (tuple, list, frozenset)) and all(
                isinstance(v, _SIMPLE) for v in value):
            self.parts.append(f"const {label}={value!r}")
        elif isinstance(value, (types.FunctionType, type, functools.partial)) or \
                _compiled_source(value) is not value:
            self.add(value, label)

    def _add_code(self, obj) -> None:
        name = f"{obj.__module__}.{obj.__qualname__}"
        try:
            text, tree = normalized_source(_source(obj))
            if tree is None and isinstance(obj, types.FunctionType):
                text = _code_summary(obj.__code__)
        except (OSError, TypeError):
            text, tree = (_code_summary(obj.__code__) if isinstance(obj, types.FunctionType)
                          else repr(obj)), None
        self.parts.append(f"code {name}\n{text}")
        code = obj.__code__ if isinstance(obj, types.FunctionType) else None
        scope = self._scope(obj)
        for chain in _referenced_names(tree, code):
            if chain[0] not in scope:
                continue
            value = scope[chain[0]]
            for attr in chain[1:]:  # follow a.b.c as far as it resolves
                if not isinstance(value, (types.ModuleType, type)):
                    break
                nxt = getattr(value, attr, None)
                if nxt is None:
                    break
                value = nxt
            if isinstance(value, types.ModuleType):
                continue
            self.add_value(value, ".".join(chain))
        if isinstance(obj, type):  # methods: their module globals are the class's
            for member in vars(obj).values():
                func = member.__func__ if isinstance(member, (staticmethod, classmethod)) \
                    else member
                if isinstance(func, types.FunctionType):
                    self.seen.add(id(func))  # their text is in the class's already
                    for chain in _referenced_names(None, func.__code__):
                        if chain[0] in func.__globals__:
                            self.add_value(func.__globals__[chain[0]], chain[0])

    @staticmethod
    def _scope(obj) -> dict:
        if isinstance(obj, types.FunctionType):
            scope = dict(vars(__builtins__)) if isinstance(__builtins__, types.ModuleType) \
                else {}
            scope.update(obj.__globals__)
            if obj.__closure__:
                for var, cell in zip(obj.__code__.co_freevars, obj.__closure__):
                    try:
                        scope[var] = cell.cell_contents
                    except ValueError:  # an empty cell
                        pass
            return scope
        module = sys.modules.get(getattr(obj, "__module__", ""), None)
        return dict(vars(module)) if module else {}


def fingerprint(fn, extra_modules=()) -> str:
    """Hex digest of ``fn``'s code, everything of the project it reaches, and the code of
    ``extra_modules`` (the input generator: the golden is a function of its inputs)."""
    roots = frozenset({"verify", (getattr(fn, "__module__", "") or "").split(".")[0]})
    fp = _Fingerprint(roots)
    fp.add(fn, getattr(fn, "__name__", ""))
    for module in extra_modules:
        try:
            fp.parts.append(f"module {module.__name__}\n"
                            + normalized_source(_source(module))[0])
        except (OSError, TypeError):
            fp.parts.append(f"module {module.__name__}")
    return hashlib.sha256("\n".join(fp.parts).encode()).hexdigest()
