"""Remove unreadable compiled bytecode (.pyc) from a venv and this checkout before a tier runs (standard library only).

    .venv/tensorflow/bin/python tests/bytecode.py      # the running interpreter's venv, and the repository

Python writes a .pyc once and trusts it from then on; its header (source size and time) is checked, its body is not.
A .pyc cut short - the disk filled while Python wrote it (a short write goes unnoticed) - makes every later import
of that module fail with "EOFError: marshal data too short", in every run, until the file is removed: a CI run on a
machine whose disk once filled failed a whole tier that way. This reads every .pyc of the running interpreter's
version under the venv and the repository, removes those whose body does not load (Python compiles them again from
the source), and says how many it removed and where. Silent when all load (about 2 s for the TensorFlow venv).
"""

from __future__ import annotations

import marshal
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = 16  # magic, flags, and the source's time and size (or hash): PEP 552


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
