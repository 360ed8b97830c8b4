"""Remove unreadable compiled bytecode (.pyc) from a venv and this checkout before a tier runs, and compile the
checkout's own packages (standard library only).

    .venv/tensorflow/bin/python tests/bytecode.py      # the running interpreter's venv, and the repository

Python writes a .pyc once and trusts it from then on; its header (source size and time) is checked, its body is not.
A .pyc cut short - the disk filled while Python wrote it (a short write goes unnoticed) - makes every later import
of that module fail with "EOFError: marshal data too short", in every run, until the file is removed: a CI run on a
machine whose disk once filled failed a whole tier that way. This reads every .pyc of the running interpreter's
version under the venv and the repository, removes those whose body does not load (Python compiles them again from
the source), and says how many it removed and where. Silent when all load (about 2 s for the TensorFlow venv).

Then it compiles the checkout's packages (``PACKAGES``) where their .pyc is missing or stale. A shell with
PYTHONDONTWRITEBYTECODE set (this machine's is) never writes them, so every process of the suite - over a thousand
replicas, workers and agents - compiled the package's modules from source again, 0.05-0.1 s of CPU each; reading a
.pyc is allowed under that variable, only writing one is not.

Last, pytest's own cache of the test modules: pytest imports each test module and conftest.py with its asserts
rewritten, from a ``<name>.cpython-311-pytest-<version>.pyc`` beside the plain one, and writes that file only where
bytecode may be written. Under PYTHONDONTWRITEBYTECODE every pytest process - each xdist worker of each tier, 15 or
so in `make test` - parsed and rewrote all of the tests again: about 3.7 s of CPU per process of its 9 s collection.
``rewrite_tests`` writes them once (one tier at a time, under a lock; pytest checks each against its source's hash,
and every venv has the same pytest); a pytest other than the one whose format this writes ignores them.
"""

from __future__ import annotations

import ast
import compileall
import contextlib
import fcntl
import importlib.util
import marshal
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = 16  # magic, flags, and the source's time and size (or hash): PEP 552
PACKAGES = ("entrypoint", "trainers", "tests", "bench")  # what the suite's processes import from the checkout


def caches(top: Path, tag: str) -> Iterator[Path]:
    """Every .pyc of this interpreter's version (``tag``, for example cpython-311) under ``top``."""
    suffix = f".{tag}.pyc"
    for folder, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d not in (".git", ".venv") or Path(folder) != ROOT]
        if os.path.basename(folder) == "__pycache__":
            yield from (Path(folder, name) for name in files if name.endswith(suffix))


def unreadable(path: Path) -> bool:
    try:
        data = path.read_bytes()
        marshal.loads(memoryview(data)[HEADER:])
    except (EOFError, ValueError, TypeError):
        return True
    except OSError:  # removed beside us (another tier's import rewrote it): nothing to check
        return False
    return False


def heal(tops: list[Path], tag: str) -> list[Path]:
    removed = []
    for top in tops:
        for path in caches(top, tag):
            if unreadable(path):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def compile_packages(root: Path, packages: tuple[str, ...]) -> None:
    """Write the .pyc of every module of ``packages`` under ``root`` that has none or a stale one (also where
    PYTHONDONTWRITEBYTECODE is set: it stops imports from writing, not this); tiers doing it at once each write
    whole files (compileall writes to a temporary name and renames it)."""
    for package in packages:
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=1)


def rewritten_by_pytest(root: Path) -> list[Path]:
    """What pytest imports with its asserts rewritten: the test modules (its default ``python_files``), every
    conftest.py and the plugins tests/conftest.py names in ``pytest_plugins``."""
    tests = root / "tests"
    found = [p for p in tests.rglob("*.py") if p.name == "conftest.py" or p.name.startswith("test_")
             or p.name.endswith("_test.py")]
    conftest = ast.parse((tests / "conftest.py").read_text())
    for node in conftest.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytest_plugins"
                                                for t in node.targets):
            found += [root.joinpath(*name.split(".")).with_suffix(".py") for name in ast.literal_eval(node.value)]
    return sorted(p for p in set(found) if p.is_file())


def rewrite_tests(root: Path) -> list[Path]:
    """Write pytest's assertion-rewritten .pyc of every module pytest rewrites under ``root`` (its test modules,
    conftest.py files and plugins) whose cached one is missing or stale, as pytest's own import hook writes them
    (``_pytest.assertion.rewrite``); the ones written. Nothing where this venv's pytest has no such functions."""
    try:
        from _pytest.assertion import rewrite
        read, rewrite_asserts, write_fp, tail = rewrite._read_pyc, rewrite.rewrite_asserts, rewrite._write_pyc_fp, \
            rewrite.PYC_TAIL
    except (ImportError, AttributeError):
        return []
    written = []
    (root / "tests" / "__pycache__").mkdir(exist_ok=True)
    with (root / "tests" / "__pycache__" / "rewrite.lock").open("a") as lock, contextlib.ExitStack() as stack:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the tiers start together: one of them rewrites, the others find it done
        stack.callback(fcntl.flock, lock, fcntl.LOCK_UN)
        for source in rewritten_by_pytest(root):
            pyc = source.parent / "__pycache__" / (source.name[:-3] + tail)
            if read(source, pyc) is not None:
                continue
            text = source.read_bytes()
            tree = ast.parse(text, filename=str(source))
            rewrite_asserts(tree, text, str(source), None)  # None: no ini option of ours changes the rewrite
            code = compile(tree, str(source), "exec", dont_inherit=True)
            pyc.parent.mkdir(exist_ok=True)
            partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
            with partial.open("wb") as out:
                write_fp(out, importlib.util.source_hash(text), code)
            os.replace(partial, pyc)  # whole files only, as pytest writes them
            written.append(pyc)
    return written


def main() -> int:
    tag = sys.implementation.cache_tag
    if tag is None:  # an interpreter that writes no bytecode
        return 0
    tops = [Path(sys.prefix), ROOT]
    removed = heal(tops, tag)
    if removed:
        free = shutil.disk_usage(ROOT).free / 2**30
        shown = ", ".join(str(p) for p in removed[:3]) + (f" and {len(removed) - 3} more" if len(removed) > 3 else "")
        print(f"[bytecode] removed {len(removed)} unreadable .pyc file(s) (cut short, most likely when the disk "
              f"filled; {free:.1f} GiB free now), Python compiles them again: {shown}", flush=True)
    compile_packages(ROOT, PACKAGES)
    rewrite_tests(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
