"""docs/ARCHITECTURE.md, the map, held to the tree: what it names exists, its module lists are the packages' modules,
and every rule it states names the test that keeps it.

- Every path it names in backticks (``cluster/envvars.py``, ``pytorch/loop/``, ``images/catalog.py``) exists: under
  ``entrypoint/`` or from the repository's root; a bare name (``launch.py``, ``image.toml``) exists somewhere in
  ``entrypoint/``, ``images/`` or ``tests/``.
- "The tree": its layers are the ones ``test_layers.py`` checks (``LAYERS``), and each package's row names every
  module of the package and no module it lacks (the frameworks' row: every module it names, in each framework).
- The floors of a grouped package: the groups ``test_layers.py`` checks (``GROUPS``), in order, each with every
  module of its group and no other.
- Every class (a capitalised name in backticks: ``StepGuard``, ``LoopCheckpoints``) is defined or named in the
  repository's Python (``entrypoint/``, ``images/``, ``tests/``, ``bench/``), bar the outside ones it explains.
- "Rules the code keeps": every rule names a test file (or ``tests/...py::name``) that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT
from tests.unit.test_layers import GROUPS, LAYERS

MAP = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGE = ROOT / "entrypoint"
TICKED = re.compile(r"`([^`\s]+)`")
PATHLIKE = re.compile(r"^[\w.*/-]+(\.(py|md|toml|txt|yaml|sh|json|mk)|/|Dockerfile)$")
# Paths the map names that are not in the checkout: made by a run or a build, or a pattern
NOT_IN_THE_TREE = {".build/images.mk", "job.json", "gs://"}
# Rows of "The tree" whose packages the map describes elsewhere (their own floors, or "Who owns what")
DESCRIBED_ELSEWHERE = {"doctor/", "jobs/", "local/"}
FRAMEWORKS_LAYER = 6
CLASSLIKE = re.compile(r"`([A-Z][a-z]+(?:[A-Z][A-Za-z]*)?)`")  # a class: not a variable (``RANK``)
# Classes of other projects the map explains (torch's C++ allreduce work held by a thread at exit)
OUTSIDE_CLASSES = {"AsyncAllreduceWork"}


def text() -> str:
    return MAP.read_text()


def section(title: str) -> str:
    """The map's text from the heading ``title`` to the next heading of its level or above."""
    body = text()
    match = re.search(rf"^(#+) {re.escape(title)}\n", body, re.MULTILINE)
    assert match, f"docs/ARCHITECTURE.md has no section {title!r}"
    level = len(match.group(1))
    rest = body[match.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    return rest[:end.start()] if end else rest


def rows(part: str, first: str) -> list[list[str]]:
    """The cells of each row of the table in ``part`` whose header's first cell is ``first``."""
    lines = part.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    found: list[list[str]] = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        found.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return found


def modules(package: Path) -> set[str]:
    """A package's modules as the map names them: ``name.py``, and ``name/`` for a subpackage."""
    found = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    return found | {f"{p.name}/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def exists(path: str) -> bool:
    if path in NOT_IN_THE_TREE or "<" in path:
        return True
    bare = path.rstrip("/")
    if "/" not in bare:  # a module, or a file every image folder or test tier has
        return (ROOT / bare).exists() or any(any((ROOT / top).rglob(bare)) for top in ("entrypoint", "images", "tests"))
    return any(any(root.glob(bare)) for root in (PACKAGE, ROOT))


def test_every_path_the_map_names_exists() -> None:
    named = sorted({t for t in TICKED.findall(text()) if PATHLIKE.match(t)})
    assert len(named) > 100, "the pattern finds the map's paths"
    missing = [path for path in named if not exists(path)]
    assert not missing, f"docs/ARCHITECTURE.md names paths that are not in the tree: {missing}"


def test_every_class_the_map_names_exists() -> None:
    named = set(CLASSLIKE.findall(text())) - OUTSIDE_CLASSES
    assert len(named) > 20, "the pattern finds the map's classes"
    source = "\n".join(p.read_text() for top in ("entrypoint", "images", "tests", "bench")
                       for p in (ROOT / top).rglob("*.py"))
    missing = sorted(name for name in named if not re.search(rf"\b{name}\b", source))
    assert not missing, f"docs/ARCHITECTURE.md names classes the code does not have: {missing}"


def test_the_tree_gives_the_layers_the_layer_rule_checks() -> None:
    table = rows(section("The tree"), "layer")
    mapped = sorted((f"entrypoint.{name.rstrip('/').removesuffix('.py')}", int(layer))
                    for layer, packages, _ in table for name in TICKED.findall(packages))
    assert mapped == sorted(LAYERS), "the map's layers and tests/unit/test_layers.py's LAYERS differ"


def test_each_package_row_of_the_tree_names_its_modules_and_no_others() -> None:
    for layer, packages, holds in rows(section("The tree"), "layer"):
        named = set(TICKED.findall(holds))
        dirs = [p for p in TICKED.findall(packages) if p.endswith("/") and p not in DESCRIBED_ELSEWHERE]
        if int(layer) == FRAMEWORKS_LAYER:  # each framework has the modules the row names (a group for a module)
            for package in dirs:
                have = {m.rstrip("/").removesuffix(".py") for m in modules(PACKAGE / package)}
                lacking = [m for m in named if m.endswith(".py") and m.removesuffix(".py") not in have]
                assert not lacking, f"the map's layer {layer} names {lacking}, which {package} lacks"
            continue
        for package in dirs:
            have = modules(PACKAGE / package)
            unnamed = sorted(have - named)
            assert not unnamed, f"the map's row for {package} does not name {unnamed}"
        top = {p for p in TICKED.findall(packages) if p.endswith(".py")}
        strays = sorted(m for m in named if PATHLIKE.match(m) and "/" not in m.rstrip("/") and m not in top
                        and not any(m in modules(PACKAGE / package) for package in dirs))
        assert not strays, f"the map's layer {layer} names modules its packages lack: {strays}"


def test_the_floors_of_each_grouped_package_are_the_groups_the_rule_checks() -> None:
    table = rows(text(), "package")
    for package, floors in GROUPS.items():
        relative = package.removeprefix("entrypoint.") + "/"
        mine = [row for row in table if TICKED.findall(row[0]) == [relative]]
        assert [int(row[1]) for row in mine] == list(range(len(floors))), f"{relative}: the map's floors"
        for (_, _, name, listed, _), names in zip(mine, floors, strict=True):
            base = PACKAGE / relative
            listed_modules = set(TICKED.findall(listed))
            if name == "shared":  # the package's own modules, its first floor
                expected = {f"{n}.py" for n in names if n != "__init__"}
            elif name.endswith("/`"):  # a group of modules in a folder
                assert TICKED.findall(name) == [f"{names[0]}/"], f"{relative} floor {names}: the map says {name}"
                expected = modules(base / names[0])
            else:  # a module of its own
                expected = {f"{names[0]}.py"}
            assert listed_modules == expected, f"{relative}{names}: the map lists {sorted(listed_modules)}, " \
                                               f"the tree has {sorted(expected)}"


def test_every_rule_names_the_test_that_keeps_it() -> None:
    rules = re.split(r"^- ", section("Rules the code keeps"), flags=re.MULTILINE)[1:]
    assert len(rules) >= 8
    for rule in rules:
        tests = [t for t in TICKED.findall(rule) if t.startswith("tests/")]
        assert tests, f"a rule names no test that keeps it: {rule[:100]!r}"
        for test in tests:
            path, _, name = test.partition("::")
            assert (ROOT / path).is_file(), f"a rule names {path}, which does not exist"
            assert not name or f"def {name}(" in (ROOT / path).read_text(), f"{path} has no test {name}"
