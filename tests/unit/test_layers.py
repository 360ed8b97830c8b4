"""What docs/ARCHITECTURE.md promises about the tree, checked on the source.

- The layer order of the packages: a module imports only from its own layer or the layers above it in the map's
  table ("The tree").
- Signals are handled in ``lifecycle/signals.py`` only ("Rules the code keeps").
- A process exits (``sys.exit``, ``os._exit``, ``raise SystemExit``) only where "Process exit" says: through
  ``lifecycle/shutdown.py``, the hang watchdog and the start-deadline watcher (``lifecycle/watch/watchdog.py``), and a
  process whose parent is gone (``signals.die_with_parent``).
- Modules stay under 400 lines and functions under about 60 ("Rules the code keeps"; 60 is enforced), the image
  scripts under ``images/`` too.
- The platform's variables are read (``os.environ.get``, ``os.environ[...]``, ``in os.environ``, ``os.getenv``) in
  ``cluster/environments/`` only, bar the exception the map names ("Rules the code keeps").
- No module outside a framework's package names a framework, in code or in a message (docstrings and comments may),
  bar the names an outside API fixes (``FRAMEWORK_NAMES_ALLOWED``, each with its reason).
- Every checkpoint writer's ``load`` is reached from resume: ``LoopCheckpoints.load`` loads through the format, and
  each format's ``load`` through its writers' readers.
- The hooks loop and the resume policy hold no test of the parallel layout (decided once: ``layout.py``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "entrypoint"
# docs/ARCHITECTURE.md, "The tree": the first matching prefix gives a module's layer.
LAYERS: list[tuple[str, int]] = [
    ("entrypoint.errors", 0), ("entrypoint.options", 0), ("entrypoint.periodic", 0),
    ("entrypoint.cluster", 1),
    ("entrypoint.outputs", 2),
    ("entrypoint.failures", 3),
    ("entrypoint.planning", 4),
    ("entrypoint.lifecycle", 5), ("entrypoint.context", 5),
    ("entrypoint.pytorch", 6), ("entrypoint.horovod", 6), ("entrypoint.tensorflow", 6), ("entrypoint.jax", 6),
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
    "entrypoint.lifecycle.watch.watchdog": {"sys.exit", "os._exit"},  # the start-deadline watcher; the hang watchdog
    "entrypoint.lifecycle.signals": {"os._exit"},  # die_with_parent: the parent is gone already
    # a rank's client under its node's fork server: the standard library only (no module of ours), ends as its
    # forked rank ended, or execs the rank itself
    "entrypoint.pytorch.launch.forkclient": {"os._exit"},
}
SIGNALS_ALLOWED = {"entrypoint.pytorch.launch.forkclient"}  # it relays every signal to its rank, by itself
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
    if module_name(path) == SIGNAL_MODULE or module_name(path) in SIGNALS_ALLOWED:
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


def size_problems(path: Path) -> list[str]:
    """What makes a source too big: fewer than MAX_MODULE_LINES lines, functions of at most MAX_FUNCTION_LINES."""
    text = path.read_text()
    lines = len(text.splitlines())
    found = [f"{module_name(path)} has {lines} lines"] if lines >= MAX_MODULE_LINES else []
    long = [f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    return found + ([f"{module_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"] if long else [])


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    assert not size_problems(path)


# the image scripts (images/catalog.py, images/vuln_gate.py and their parts) keep the same limits
IMAGE_SCRIPTS = sorted((ROOT / "images").rglob("*.py"))


@pytest.mark.parametrize("path", IMAGE_SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_image_scripts_and_their_functions_stay_small(path: Path) -> None:
    assert not size_problems(path)


def test_the_rules_see_what_they_look_for() -> None:
    """The checks above find a handler, an exit and a long function where there is one (they are not vacuous)."""
    source = "import signal, sys, os\nsignal.signal(2, None)\nsys.exit(1)\nos._exit(2)\nraise SystemExit(3)\n"
    assert sorted(calls(ast.parse(source))) == [(2, "signal.signal"), (3, "sys.exit"), (4, "os._exit"),
                                                (5, "SystemExit")]
    assert set(EXITS_ALLOWED) | {SIGNAL_MODULE} <= {module_name(p) for p in MODULES}
    assert {"images.catalog", "images.vuln_gate"} <= {module_name(p) for p in IMAGE_SCRIPTS}


# "Rules the code keeps": only cluster/environments/ reads the platform's variables; the one exception the map names
ENVIRON_READS_ALLOWED = {"entrypoint.pytorch.launch.node"}  # restores the user's TORCH_CPP_LOG_LEVEL after one import


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def environ_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Every read of this process's environment in a source: ``os.environ.get(...)``, ``os.environ[...]`` (a load),
    ``... in os.environ``, ``os.getenv(...)`` (passing ``os.environ`` on, setting or deleting a variable is not)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and _is_environ(node.func.value):
                found.append((node.lineno, "os.environ.get"))
            elif node.func.attr == "getenv" and isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
                found.append((node.lineno, "os.getenv"))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            found.append((node.lineno, "os.environ[...]"))
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(_is_environ(c) for c in node.comparators):
            found.append((node.lineno, "in os.environ"))
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_platforms_variables_are_read_where_the_map_says(path: Path) -> None:
    name = module_name(path)
    if name.startswith("entrypoint.cluster.environments") or name in ENVIRON_READS_ALLOWED:
        return
    found = [f"line {line}: {what}" for line, what in environ_reads(ast.parse(path.read_text()))]
    assert not found, f"{name} reads the environment itself (cluster/environments/ does: settings.py): {found}"


FRAMEWORK_PACKAGES = ("entrypoint.pytorch", "entrypoint.horovod", "entrypoint.tensorflow", "entrypoint.jax")
FRAMEWORK_WORDS = re.compile(r"\b(pytorch|tensorflow|horovod|jax|keras)\b", re.IGNORECASE)
# Names an outside API fixes, by module: (line text that holds it, why)
FRAMEWORK_NAMES_ALLOWED: dict[str, tuple[str, ...]] = {
    # the registry's lines name each framework's package: the one place that does
    "entrypoint.planning.registry": ("pytorch", "tensorflow", "horovod", "jax"),
    # Kubeflow's PyTorchJob and TFJob require their containers to be named "pytorch" and "tensorflow"
    "entrypoint.jobs.kubeflow.job": ("pytorch", "tensorflow"),
    # the torchrun variable format is named after its launcher (a platform format, not one of our frameworks)
    "entrypoint.cluster.environments.torch_nodes": ("PyTorch",),
    # the help of the hooks loop's options and its refusal name the loop they apply to: the PyTorch hooks loop,
    # which Horovod runs too (the frameworks' own records say which frameworks run it: ``Framework.init_from``)
    "entrypoint.planning.runargs": ("PyTorch", "Horovod"),
    "entrypoint.planning.plan": ("PyTorch",),
}


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def framework_names(tree: ast.AST) -> list[tuple[int, str]]:
    """Every framework named in a source's strings (its docstrings aside): ``(line, name)``."""
    docs = _docstrings(tree)
    return [(node.lineno, match) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            for match in FRAMEWORK_WORDS.findall(node.value)]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_outside_a_frameworks_package_names_a_framework(path: Path) -> None:
    name = module_name(path)
    if any(name == p or name.startswith(p + ".") for p in FRAMEWORK_PACKAGES):
        return
    allowed = {word.lower() for word in FRAMEWORK_NAMES_ALLOWED.get(name, ())}
    found = [f"line {line}: {word}" for line, word in framework_names(ast.parse(path.read_text()))
             if word.lower() not in allowed]
    assert not found, (f"{name} names a framework (ask the registry: a Framework record's fields, "
                       f"registry.serving, Framework.label): {found}")


def _calls_in(path: Path, cls: str, method: str) -> set[str]:
    """The ``x.y(...)`` calls in ``cls.method`` of the module at ``path``, as dotted text (``self.io.load``)."""
    tree = ast.parse(path.read_text())
    (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (func,) = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == method]
    return {ast.unparse(n.func) for n in ast.walk(func) if isinstance(n, ast.Call)}


def test_every_checkpoint_writers_load_is_reached_from_resume() -> None:
    pytorch = PACKAGE / "pytorch" / "checkpoints"
    assert "self.format.load" in _calls_in(pytorch / "resume.py", "LoopCheckpoints", "load")
    replicated = _calls_in(pytorch / "formats.py", "ReplicatedFormat", "load")
    sharded = _calls_in(pytorch / "formats.py", "ShardedFormat", "load")
    assert "self.io.load" in replicated and "self.io.load" in sharded  # each format's own writer
    assert "ShardedCheckpointIO.load_whole" in replicated  # a sharded checkpoint into a replicated model
    assert "ReplicatedCheckpointIO.load" in sharded  # a replicated checkpoint into a sharded model
    for path, cls in ((pytorch / "checkpoint_io.py", "ReplicatedCheckpointIO"),
                      (pytorch / "sharded_io.py", "ShardedCheckpointIO")):
        tree = ast.parse(path.read_text())
        (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        loads = {n.name for n in klass.body if isinstance(n, ast.FunctionDef) and n.name.startswith("load")}
        reached = {call.rsplit(".", 1)[-1] for call in replicated | sharded
                   if call.count(".") and call.split(".")[-2] in ("io", cls)}
        assert loads <= reached, f"{cls}: {sorted(loads - reached)} not reached from a format's load"


# docs/ARCHITECTURE.md, "Rules the code keeps": the layout is decided once; these modules read its facts, never test it
LAYOUT_BLIND = ("pytorch/loop/trainer.py", "pytorch/loop/evaluation.py", "pytorch/checkpoints/resume.py")
LAYOUT_CLASSES = {"Replicated", "Sharded", "ReplicatedFormat", "ShardedFormat", "Layout", "Choice"}
LAYOUT_FACTS = {"collective", "sharded", "choice", "every_rank"}  # attributes that would say which layout it is
LAYOUT_NAMES = {"default", "ddp", "fsdp", "hsdp", "horovod", "replicated", "sharded"}  # strategies', formats' names


def layout_tests(tree: ast.AST) -> list[tuple[int, str]]:
    """Every test of the layout in a source: ``isinstance`` of a layout or format class, and a condition (``if``,
    ``while``, ``assert``, a conditional expression, a comparison or boolean operation) that reads a format's
    ``collective`` or ``sharded``, a layout's ``choice``, a name of a layout class, or compares with a strategy's or
    format's name."""
    found: list[tuple[int, str]] = []
    conditions: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and \
                len(node.args) == 2 and {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.args[1])
                                         if isinstance(n, (ast.Name, ast.Attribute))} & LAYOUT_CLASSES:
            found.append((node.lineno, "isinstance"))
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            conditions.append(node.test)
        elif isinstance(node, (ast.Compare, ast.BoolOp)):
            conditions.append(node)
        elif isinstance(node, ast.comprehension):
            conditions.extend(node.ifs)
    for condition in conditions:
        for part in ast.walk(condition):
            if isinstance(part, ast.Attribute) and part.attr in LAYOUT_FACTS:
                found.append((part.lineno, f".{part.attr}"))
            elif isinstance(part, ast.Name) and part.id in LAYOUT_FACTS | LAYOUT_CLASSES:  # a local holding a fact
                found.append((part.lineno, part.id))
            elif isinstance(part, ast.Constant) and isinstance(part.value, str) and part.value in LAYOUT_NAMES:
                found.append((part.lineno, repr(part.value)))
    return sorted(set(found))


@pytest.mark.parametrize("relative", LAYOUT_BLIND)
def test_the_loop_and_the_resume_policy_hold_no_test_of_the_layout(relative: str) -> None:
    found = layout_tests(ast.parse((PACKAGE / relative).read_text()))
    assert not found, f"{relative} tests which layout it has (read the layout's facts: layout.py): {found}"


def test_the_layout_rule_sees_what_it_looks_for() -> None:
    source = ("if layout.format.collective: pass\nx = a if self.parallel.choice.sharded else b\n"
              "ok = isinstance(p, parallel.Sharded)\nassert fmt.name == 'sharded'\n"
              "y = layout.evaluates_in_lockstep\nmeta = {'sharded': self.format.sharded}\nif collective: pass\n")
    assert layout_tests(ast.parse(source)) == [(1, ".collective"), (2, ".choice"), (2, ".sharded"),
                                               (3, "isinstance"), (4, "'sharded'"), (7, "collective")]


# docs/ARCHITECTURE.md, "The tree": a package past ~15 modules is grouped by concern, each group a floor
# of its own: a module imports from its own group or the ones before it in this list (the package's shared modules
# first: its record, the training state, the hooks' defaults).
GROUPS: dict[str, list[tuple[str, ...]]] = {
    "entrypoint.pytorch": [("__init__", "framework", "state", "defaults"), ("launch",), ("checkpoints",),
                           ("recovery",), ("loop",)],
    "entrypoint.outputs": [("__init__", "storage", "conditional", "locations", "checkpoints", "staging", "summary",
                            "hypertune", "redaction", "logs", "progress", "sbom"), ("goodput",)],
    "entrypoint.lifecycle": [("__init__", "waiting", "signals", "shutdown", "lost_work"), ("jobdir",), ("startup",),
                             ("watch",), ("supervision",), ("recorder",), ("script_context",), ("runner",)],
    "entrypoint.jobs": [("__init__", "args", "images", "machines", "model", "network", "pinning", "planned",
                         "replicaenv", "specdoc", "yamltext"), ("vertex",), ("kubeflow",), ("cli",)],
}


def group(module: str) -> tuple[str, int] | None:
    """The package ``module`` is grouped in, and its group's floor there (None: not in a grouped package)."""
    for package, floors in GROUPS.items():
        if module == package:
            return package, 0
        if module.startswith(package + "."):
            first = module[len(package) + 1:].split(".")[0]
            return package, next(i for i, names in enumerate(floors) if first in names)
    return None


@pytest.mark.parametrize("path", [p for p in MODULES if group(module_name(p)) is not None],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_grouped_module_imports_nothing_from_a_later_group(path: Path) -> None:
    mine = group(module_name(path))
    assert mine is not None
    later = [f"line {line}: {name}" for line, name in imported(ast.parse(path.read_text()))
             if (theirs := group(name)) is not None and theirs[0] == mine[0] and theirs[1] > mine[1]]
    assert not later, f"{module_name(path)} (group {mine[1]} of {mine[0]}) imports from a later group: {later}"


def test_every_module_of_a_grouped_package_is_in_a_group() -> None:
    for package in GROUPS:
        base = PACKAGE.joinpath(*package.split(".")[1:])
        assert [p.name for p in base.glob("*.py") if all(p.stem not in names for names in GROUPS[package])] == [], \
            f"{package}: a module outside its groups"
        assert all(group(module_name(p)) is not None for p in base.rglob("*.py"))


def unit(module: str) -> str:
    """The top-level piece of ``entrypoint`` a module belongs to (``entrypoint.jobs``, ``entrypoint.context``)."""
    return ".".join(module.split(".")[:2])


def test_no_import_runs_back_up_the_structure() -> None:
    """Within a layer too, the top-level pieces stand one above another: no two import each other, through any
    chain (``jobs`` and ``local`` share layer 7, ``lifecycle`` and ``context`` layer 5; ``local`` uses ``jobs``, and
    ``jobs`` must not use ``local``)."""
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        mine = unit(module_name(path))
        if mine == "entrypoint":
            continue
        graph.setdefault(mine, set()).update(
            theirs for _, name in imported(ast.parse(path.read_text()))
            if (theirs := unit(name)) != mine and theirs != "entrypoint")
    back = []
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            here = todo.pop()
            if here == start:
                back.append(start)
                break
            if here not in seen:
                seen.add(here)
                todo.extend(graph.get(here, ()))
    assert not back, f"these pieces import each other, through some chain: {sorted(back)}"


def test_the_new_rules_see_what_they_look_for() -> None:
    """The environment and framework-name checks find a read and a name where there is one."""
    source = ("import os\na = os.environ.get('X')\nb = os.environ['Y']\nc = 'Z' in os.environ\nd = os.getenv('W')\n"
              "os.environ['V'] = '1'\ne = dict(os.environ)\n")
    assert environ_reads(ast.parse(source)) == [(2, "os.environ.get"), (3, "os.environ[...]"), (4, "in os.environ"),
                                                (5, "os.getenv")]
    named = 'def f():\n    """PyTorch here is fine."""\n    return x == "horovod" or "TensorFlow image"\n'
    assert sorted(framework_names(ast.parse(named))) == [(3, "TensorFlow"), (3, "horovod")]
