"""What a local image build's result depends on, as one digest: an image built from the inputs at hand is current,
and `make test` does not build it again. Each build's digest is recorded beside the image id it produced, in
``~/.cache/trainer-images/built/`` (XDG_CACHE_HOME is honoured): the record holds for that image only, so an image
built or removed by other means is built again. (Not an image label: a label given to `podman build` is set on every
stage, which moves each stage's cache key and rebuilt everything from the first `apt-get`.)

The engine's own layer cache would reuse every layer of such a build too, but only after hashing each COPY's
source to look the layer up, the builder stage's venv included (1-3 GB an image): 25-35 s of CPU an image and
1.5-2 min of wall time on two cores, every warm `make test`. The digest covers what the engine's cache keys on
and what it does not: every file of the build context (the allowlist in .dockerignore), the build command (the
Dockerfile, its build arguments, the engine's flags), the base image's id, and the wheels served to the build
(torch's +cpu wheel, Horovod's wheel cache: their names, sizes and times, as pip sees a new wheel).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from build_common import ROOT, cache_dir

SKIPPED_PARTS = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc",)


def context_roots(root: Path = ROOT) -> list[Path] | None:
    """What .dockerignore lets into the context (``*`` then ``!path`` lines); None for any other form, which this
    module does not read (every build then runs: nothing is taken as current that might not be)."""
    lines = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    if not patterns or patterns[0] != "*":
        return None
    allowed: list[str] = []
    excluded: list[str] = []
    for pattern in patterns[1:]:
        (allowed if pattern.startswith("!") else excluded).append(pattern.removeprefix("!").rstrip("/"))
    if any(p not in ("**/__pycache__", "**/*.pyc") for p in excluded) or any("*" in p for p in allowed):
        return None
    return [root / p for p in allowed]


def context_files(roots: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for top in roots:
        if top.is_file():
            found.append(top)
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_PARTS)
            found += [Path(folder) / f for f in sorted(files) if not f.endswith(SKIPPED_SUFFIXES)]
    return found


REVISION_ARG = "--build-arg=REVISION="


def without_revision(command: Sequence[str]) -> list[str]:
    """The build command without the commit it names (a label only): an image built at an earlier commit from the same
    inputs is current, and a commit that changes no input (tests, docs) rebuilds nothing. Its revision label names the
    commit that built it."""
    return [arg for arg in command if not arg.startswith(REVISION_ARG)]


def record_dir() -> Path:
    return cache_dir() / "built"


def _record(ref: str) -> Path:
    return record_dir() / (re.sub(r"[^A-Za-z0-9_.-]", "_", ref) + ".json")


def is_current(ref: str, image_id: str, inputs: str) -> bool:
    """Whether the image ``ref`` names now (``image_id``) is the one a build of these inputs produced."""
    try:
        record = json.loads(_record(ref).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("id") == image_id and record.get("inputs") == inputs


def remember(ref: str, image_id: str, inputs: str) -> None:
    """Record that a build of ``inputs`` produced ``image_id`` (written whole: a reader never sees half of it)."""
    path = _record(ref)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"id": image_id, "inputs": inputs}))
    tmp.replace(path)


def read_record(ref: str) -> dict[str, str]:
    """The record of ``ref``'s build ({} when there is none or it cannot be read)."""
    try:
        record = json.loads(_record(ref).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in record.items()} if isinstance(record, dict) else {}


def record_path(ref: str) -> Path:
    """Where the record of ``ref``'s build is (``job --pin`` of a local build reads its digest there too)."""
    return _record(ref)


def annotate(ref: str, **fields: str) -> None:
    """Add what was learned of the built image to its record (its digest, its bill of materials beside it)."""
    path = _record(ref)
    record = {**read_record(ref), **fields}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, sort_keys=True))
    tmp.replace(path)


def _stat_line(path: Path) -> str:
    info = path.stat()
    return f"{path.name} {info.st_size} {info.st_mtime_ns}\n"


def digest(command: Sequence[str], base_id: str | None, wheels: Iterable[Path], root: Path = ROOT) -> str | None:
    """The inputs' digest, or None when the context's form is not one this module reads."""
    roots = context_roots(root)
    if roots is None or base_id is None:
        return None
    h = hashlib.sha256()
    h.update("\0".join(command).encode() + b"\n" + base_id.encode() + b"\n")
    for path in context_files(roots):
        info = path.stat()
        h.update(f"{path.relative_to(root)} {info.st_mode & 0o777:o} {info.st_size}\n".encode())
        h.update(path.read_bytes())
    for wheel in sorted(wheels):
        if wheel.is_file():
            h.update(_stat_line(wheel).encode())
    return h.hexdigest()
