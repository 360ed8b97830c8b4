"""What docs/ARCHITECTURE.md promises about the tree, checked on the source.

- The layer order of the packages: a module imports only from its own layer or the layers above it in the map's
  table ("The tree").
- Signals are handled in ``lifecycle/signals.py`` only ("Rules the code keeps").
- A process exits (``sys.exit``, ``os._exit``, ``raise SystemExit``) only where "Process exit" says: through
  ``lifecycle/shutdown.py``, the hang watchdog and the start-deadline watcher (``lifecycle/watchdog.py``), and a
  process whose parent is gone (``signals.die_with_parent``).
- Modules stay under 400 lines and functions under about 60 ("Rules the code keeps"; 60 is enforced).
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


SIGNAL_MODULE = "entrypoint.lifecycle.signals"
# signal's calls that install a handler or arm one (sending a signal, os.kill, is anyone's business)
HANDLER_CALLS = {"signal", "alarm", "setitimer", "set_wakeup_fd", "siginterrupt", "pthread_sigmask"}
# docs/ARCHITECTURE.md, "Process exit": who may end the process itself, and how
EXITS_ALLOWED = {
    "entrypoint.lifecycle.shutdown": {"sys.exit", "os._exit"},  # shutdown.end: every process's way out
    "entrypoint.lifecycle.watchdog": {"sys.exit", "os._exit"},  # the start-deadline watcher; the hang watchdog
    "entrypoint.lifecycle.signals": {"os._exit"},  # die_with_parent: the parent is gone already
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def calls(tree: ast.AST) -> list[tuple[int, str]]:
    """Every ``module.function(...)`` call and ``raise SystemExit`` in a source, as ``(line, "module.function")``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value,
                                                                                             ast.Name):
            found.append((node.lineno, f"{node.func.value.id}.{node.func.attr}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exit", "quit"):
            found.append((node.lineno, node.func.id))
        elif isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(raised, ast.Name) and raised.id == "SystemExit":
                found.append((node.lineno, "SystemExit"))
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_signals_are_handled_in_the_signals_module_only(path: Path) -> None:
    if module_name(path) == SIGNAL_MODULE:
        return
    found = [f"line {line}: {name}" for line, name in calls(ast.parse(path.read_text()))
             if name.startswith("signal.") and name.split(".", 1)[1] in HANDLER_CALLS]
    assert not found, f"{module_name(path)} handles signals itself (lifecycle/signals.py does): {found}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_process_exits_only_where_the_map_says(path: Path) -> None:
    allowed = EXITS_ALLOWED.get(module_name(path), set())
    exits = {"sys.exit", "os._exit", "exit", "quit", "SystemExit"}
    found = [f"line {line}: {name}" for line, name in calls(ast.parse(path.read_text()))
             if name in exits and name not in allowed]
    assert not found, f"{module_name(path)} ends the process itself (shutdown.end does): {found}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) < MAX_MODULE_LINES, f"{module_name(path)} has {len(text.splitlines())} lines"
    long = [f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{module_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_rules_see_what_they_look_for() -> None:
    """The checks above find a handler, an exit and a long function where there is one (they are not vacuous)."""
    source = "import signal, sys, os\nsignal.signal(2, None)\nsys.exit(1)\nos._exit(2)\nraise SystemExit(3)\n"
    assert sorted(calls(ast.parse(source))) == [(2, "signal.signal"), (3, "sys.exit"), (4, "os._exit"),
                                                (5, "SystemExit")]
    assert set(EXITS_ALLOWED) | {SIGNAL_MODULE} <= {module_name(p) for p in MODULES}
