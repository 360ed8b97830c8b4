"""entrypoint/cluster/envvars.py names every environment variable the entrypoint reads or sets (docs/ARCHITECTURE.md),
and docs/ENVIRONMENT.md documents each: checked by reading the source, without importing any framework.

Each module under entrypoint/ is parsed (AST) for environment variable names written as string literals where
an environment is read or written: ``os.environ[...]``, ``.get``/``.pop``/``.setdefault`` on an environment
mapping (any name containing "env", ``os.getenv``), ``"X" in env``, the keys of a dict that is an environment
(assigned to or returned as one, passed as ``env=``, merged with ``**os.environ`` or keyed by ``ev.*`` names),
and the names given to ``environments/_parse.py``'s readers. Such a name must be in envvars.py, and be
written ``ev.NAME`` there; a literal equal to a name envvars.py has is reported anywhere. Names written
``ev.NAME`` are in envvars.py by construction.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

from entrypoint.cluster import envvars
from tests.conftest import ROOT

PACKAGE = ROOT / "entrypoint"
NAMES = frozenset(value for key, value in vars(envvars).items() if key.isupper() and isinstance(value, str))
VARIABLE = re.compile(r"[A-Z_][A-Z0-9_]*")
READERS = frozenset({"get_int", "require_int", "host_port", "load_object", "ProcessVariables"})  # _parse.py's

# TODO(owner of these files): write these ``ev.NAME`` (HOROVOD_GLOO_IFACE is in envvars.py now). They are
# in files another change is rewriting, so they are left there for it; test_todo_names_come_from_envvars
# passes once they are gone, and then this set (and that test) can go.


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}: {self.why}"


def _name_of(node: ast.expr) -> str:
    """The last name of ``env``, ``os.environ``, ``replica.env`` (lower case), else ""."""
    if isinstance(node, ast.Name):
        return node.id.lower()
    if isinstance(node, ast.Attribute):
        return node.attr.lower()
    return ""


def _is_env(node: ast.expr) -> bool:
    return "env" in _name_of(node)


def _literal(node: ast.expr | None) -> tuple[str, int] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE.fullmatch(node.value):
        return node.value, node.lineno
    return None


def _is_env_dict(node: ast.Dict) -> bool:
    """A dict that holds variables: merged with an environment, or keyed by at least one ``ev.NAME``."""
    return any((key is None and _is_env(value)) or
               (isinstance(key, ast.Attribute) and isinstance(key.value, ast.Name) and key.value.id == "ev")
               for key, value in zip(node.keys, node.values, strict=True))


def _keys(node: ast.expr) -> Iterator[tuple[str, int]]:
    """The literal variable names a dict display or ``dict(...)`` call sets."""
    if isinstance(node, ast.Dict):
        yield from (found for key in node.keys if key is not None and (found := _literal(key)))
    elif isinstance(node, ast.Call) and _name_of(node.func) == "dict":
        yield from ((kw.arg, kw.value.lineno) for kw in node.keywords if kw.arg and VARIABLE.fullmatch(kw.arg))


def _env_names(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Every literal variable name ``tree`` reads or sets in an environment."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_env(node.value) and (found := _literal(node.slice)):
            yield found
        elif isinstance(node, ast.Call):
            func, args = node.func, node.args
            method, owner = (func.attr, func.value) if isinstance(func, ast.Attribute) else ("", func)
            if (method in ("get", "pop", "setdefault") and _is_env(owner)) or method in ("getenv", "putenv",
                                                                                          "unsetenv"):
                yield from filter(None, [_literal(args[0])] if args else [])
            elif method == "update" and _is_env(owner):
                for arg in args:
                    yield from _keys(arg)
                yield from ((kw.arg, kw.value.lineno) for kw in node.keywords if kw.arg and VARIABLE.fullmatch(kw.arg))
            elif _name_of(func) in {r.lower() for r in READERS}:
                yield from filter(None, map(_literal, [*args, *(kw.value for kw in node.keywords)]))
            for kw in node.keywords:
                if kw.arg == "env":
                    yield from _keys(kw.value)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if any(_is_env(c) for c in node.comparators) and (found := _literal(node.left)):
                yield found
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(_is_env(t) for t in targets):
                yield from _keys(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "env" in node.name.lower():
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and ret.value is not None:
                    yield from _keys(ret.value)
        if isinstance(node, ast.Dict) and _is_env_dict(node):
            yield from _keys(node)


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def scan(source: str, path: str) -> list[Finding]:
    """What in ``source`` names a variable other than through envvars.py."""
    tree = ast.parse(source)
    found = {Finding(path, line, name, "not in envvars.py: add it there (and to docs/ENVIRONMENT.md), use ev."
                     + name) for name, line in _env_names(tree) if name not in NAMES}
    skip = _docstrings(tree)
    found |= {Finding(path, node.lineno, node.value, f"a literal: write ev.{node.value}")
              for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in NAMES
              and id(node) not in skip}
    return sorted(found, key=lambda f: (f.path, f.line, f.name))


def findings() -> list[Finding]:
    return [finding for module in sorted(PACKAGE.rglob("*.py")) if module.name != "envvars.py"
            for finding in scan(module.read_text(), str(module.relative_to(ROOT)))]


def test_every_variable_name_comes_from_envvars() -> None:
    found = findings()
    assert not found, "\n".join(map(str, found))


def test_the_scan_finds_each_way_of_naming_a_variable() -> None:
    source = '''
import os
from entrypoint import envvars as ev
"""RANK in a docstring is prose."""
a = os.environ["A_READ"]
b = os.environ.get("B_GET", "")
c = os.getenv("C_GETENV")
d = environ.get("D_ENVIRON")
env = {"E_ASSIGNED": "1"}
child_env["F_SET"] = "1"
if "G_IN" in os.environ: pass
run(cmd, env={**os.environ, "H_KWARG": "1"})
x = {ev.RANK: "0", "I_MIXED": "1"}
os.environ.update(J_UPDATE="1")
n = get_int(environ, "K_READER")
def torch_env(): return {"L_RETURNED": "1"}
other = {"not_a_variable": 1, "NOT_AN_ENV_DICT": 2}
m = some.env_vars.pop("M_POP", None)
y = ev.WORLD_SIZE
z = "RANK"
'''
    names = {f.name for f in scan(source, "x.py")}
    assert names == {"A_READ", "B_GET", "C_GETENV", "D_ENVIRON", "E_ASSIGNED", "F_SET", "G_IN", "H_KWARG", "I_MIXED",
                     "J_UPDATE", "K_READER", "L_RETURNED", "M_POP", "RANK"}, names


def test_every_name_in_envvars_is_documented() -> None:
    documented = set(re.findall(r"`([A-Z_][A-Z0-9_]*)", (ROOT / "docs" / "ENVIRONMENT.md").read_text()))
    assert NAMES - documented == set()
