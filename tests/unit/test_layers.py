"""What docs/ARCHITECTURE.md promises about the tree, checked on the source: the layer order of the packages.

A module imports only from its own layer or the layers above it in the map's table ("The tree").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "entrypoint"
# docs/ARCHITECTURE.md, "The tree": the first matching prefix gives a module's layer.
LAYERS: list[tuple[str, int]] = [
    ("entrypoint.errors", 0), ("entrypoint.options", 0),
    ("entrypoint.cluster", 1),
    ("entrypoint.outputs", 2),
    ("entrypoint.failures", 3),
    ("entrypoint.planning", 4),
    ("entrypoint.lifecycle", 5), ("entrypoint.context", 5),
    ("entrypoint.pytorch", 6), ("entrypoint.horovod", 6), ("entrypoint.tensorflow", 6),
    ("entrypoint.cli", 7), ("entrypoint.worker", 7), ("entrypoint.__main__", 7), ("entrypoint.doctor", 7),
    ("entrypoint.jobs", 7), ("entrypoint.local", 7),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    for prefix, number in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return number
    return None


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """Every ``entrypoint`` module a source imports (``from entrypoint import x`` names module ``entrypoint.x``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("entrypoint") and not node.level:
            if node.module == "entrypoint":
                found += [(node.lineno, f"entrypoint.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("entrypoint")]
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    assert [module_name(p) for p in MODULES if layer(module_name(p)) is None] in ([], ["entrypoint"])


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_nothing_from_a_layer_below_its_own(path: Path) -> None:
    own = layer(module_name(path))
    if own is None:
        return
    upward = [f"line {line}: {name} (layer {layer(name)})" for line, name in imported(ast.parse(path.read_text()))
              if (theirs := layer(name)) is not None and theirs > own]
    assert not upward, f"{module_name(path)} (layer {own}) imports from a later layer: {upward}"
