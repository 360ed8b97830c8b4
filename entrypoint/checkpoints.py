"""Framework-agnostic checkpoint bookkeeping: directories per step, a commit marker written last.

A checkpoint counts only once its marker exists (rename is not atomic on GCS or /gcs FUSE paths),
so a job killed mid-save leaves a torn directory that resume skips with a warning.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

from entrypoint.errors import ConfigError

MARKER = "COMMITTED"
_NAME = re.compile(r"^ckpt-(\d{8,})$")
log = logging.getLogger("entrypoint.checkpoints")


def checkpoint_path(checkpoint_dir: str | Path, step: int) -> Path:
    """The directory of the checkpoint taken at ``step``."""
    return Path(checkpoint_dir) / f"ckpt-{step:08d}"


def commit(path: str | Path, meta: dict[str, Any]) -> None:
    """Write the commit marker (last, after every file of the checkpoint is complete)."""
    marker = Path(path) / MARKER
    marker.write_text(json.dumps({**meta, "committed_at": time.time()}, sort_keys=True))


def is_committed(path: str | Path) -> bool:
    """Whether the checkpoint at ``path`` has its commit marker."""
    return (Path(path) / MARKER).is_file()


def read_marker(path: str | Path) -> dict[str, Any]:
    """The metadata stored in a checkpoint's commit marker."""
    data: dict[str, Any] = json.loads((Path(path) / MARKER).read_text())
    return data


def committed(checkpoint_dir: str | Path, warn: bool = True) -> list[tuple[int, Path]]:
    """Committed checkpoints, oldest first; torn ones (no marker) are skipped with a warning."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if not match or not child.is_dir():
            continue
        if is_committed(child):
            found.append((int(match.group(1)), child))
        elif warn:
            log.warning("skipping torn checkpoint %s (no %s marker)", child, MARKER)
    return sorted(found)


def latest(checkpoint_dir: str | Path) -> Path | None:
    """The newest committed checkpoint, or None."""
    found = committed(checkpoint_dir)
    return found[-1][1] if found else None


def resolve_resume(checkpoint_dir: str | Path, resume_from: str | None) -> Path | None:
    """``--resume-from`` (which must exist and be committed), else the newest committed checkpoint."""
    if resume_from is None:
        return latest(checkpoint_dir)
    path = Path(resume_from)
    if path.is_dir() and _NAME.match(path.name) is None:
        newest = latest(path)  # a checkpoint directory was given: take its newest
        if newest is not None:
            return newest
    if not path.exists():
        raise ConfigError("--resume-from", f"{resume_from} does not exist")
    if not is_committed(path):
        raise ConfigError("--resume-from", f"{resume_from} is not a committed checkpoint (no {MARKER} marker)")
    return path


def prune(checkpoint_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` committed checkpoints (and torn ones older than those)."""
    found = committed(checkpoint_dir, warn=False)
    if len(found) <= keep:
        return
    oldest_kept = found[-keep][0]
    for _step, path in found[:-keep]:
        shutil.rmtree(path, ignore_errors=True)
    for child in Path(checkpoint_dir).iterdir():
        match = _NAME.match(child.name)
        if match and int(match.group(1)) < oldest_kept and not is_committed(child):
            shutil.rmtree(child, ignore_errors=True)
