"""Framework-agnostic checkpoint bookkeeping: a directory per step, a commit marker written last.

A checkpoint counts only once its marker exists (rename is not atomic on GCS or /gcs FUSE paths), so a
job killed mid-save leaves a torn directory that resume skips. The marker lists every file with its
size and SHA-256; a committed checkpoint that fails to verify or load is named in a warning and the
next older one is used, so a restarted job never crash-loops on one bad checkpoint.

Retention (``Retention``) never deletes the newest checkpoint known to verify (the one restored from,
or one this process committed since), and deletes the ones known not to load before any good one:
at every moment at least one checkpoint that loads remains.

A checkpoint written again at a step that already has one (a rerun, a notice's save then the epoch's end at the
same step) is written whole beside it and swapped in (``write_beside``): the committed one stays loadable until the
new one is committed, whatever ends the process in between. On a file system that cannot exchange two names at
once, the old one waits as ``.replaced-ckpt-<step>`` for the moment between two renames, and counts as its step's
checkpoint while no ``ckpt-<step>`` exists.

Every writer does so on a local disk (JAX, Keras, PyTorch's replicated and sharded writers: there every rank writes
its shards into ``.partial-ckpt-<step>`` and the chief swaps it in after the commit); on a store, which has no rename,
the step's objects are replaced in place.

``CheckpointWriter`` is the one typed interface the training loops save and load through, whatever the
framework: PyTorch's ``ReplicatedCheckpointIO`` (``pytorch/checkpoints/checkpoint_io.py``, shared by Horovod) and
``ShardedCheckpointIO`` (``pytorch/checkpoints/sharded_io.py``), and Keras' ``KerasCheckpointIO``
(``tensorflow/checkpoint_io.py``) implement it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

from entrypoint.errors import ConfigError
from entrypoint.outputs import storage
from entrypoint.outputs.storage import Location

MARKER = "COMMITTED"
_NAME = re.compile(r"^ckpt-(\d{8,})$")
_REPLACED = re.compile(r"^\.replaced-ckpt-(\d{8,})$")  # an old checkpoint while a new one of its step is renamed in
PARTIAL = ".partial-"  # the prefix of a checkpoint being written beside its place
_PARTIAL = re.compile(r"^\.partial-ckpt-(\d{8,})$")  # one (a kill mid-write may leave it, pruned as a torn one)
_RENAME_EXCHANGE = 2  # renameat2's flag: both names swapped in one step
_CHUNK = 1 << 20
log = logging.getLogger("entrypoint.checkpoints")
T = TypeVar("T")
_fences: list[Callable[[], None]] = []


@contextlib.contextmanager
def fence(check: Callable[[], None]) -> Iterator[None]:
    """Within the block, call ``check`` before every commit (and summary) this process writes; it raises to refuse
    the write. The runner fences with the job-dir lease (``lifecycle/jobdir/lease.py``): a job whose job dir another job
    took over commits nothing more there."""
    _fences.append(check)
    try:
        yield
    finally:
        _fences.remove(check)


def fenced() -> None:
    """Raise if a registered fence refuses this process's next commit."""
    for check in _fences:
        check()


class CheckpointError(Exception):
    """A committed checkpoint whose files do not match its manifest."""


def checkpoint_path(checkpoint_dir: str | Location, step: int) -> Location:
    """The directory (or object prefix) of the checkpoint taken at ``step``."""
    return storage.path(checkpoint_dir) / f"ckpt-{step:08d}"


def file_digest(path: Location) -> dict[str, Any]:
    """A file's size and SHA-256."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def commit(path: str | Location, meta: dict[str, Any], files: dict[str, dict[str, Any]] | None = None) -> None:
    """Write the commit marker (last, after every file is complete) with each file's size and checksum.

    ``files`` maps relative names to ``{"size", "sha256"}`` when the writer already knows them;
    otherwise every file under ``path`` is read and hashed here. The marker is one file (one object on a
    store: it appears whole or not at all).
    """
    root = storage.path(path)
    if files is None:
        files = {storage.relative(p, root): file_digest(p) for p in root.rglob("*")
                 if p.is_file() and p.name != MARKER}
    fenced()
    (root / MARKER).write_text(json.dumps({**meta, "files": files, "committed_at": time.time()}, sort_keys=True))


def check_sizes(path: str | Location) -> None:
    """Every file the marker lists has the size it says (cheap: no reading; a lying disk shows up here)."""
    root = storage.path(path)
    for name, expected in (read_marker(root).get("files") or {}).items():
        target = root / name
        size = target.stat().st_size if target.is_file() else -1
        if size != expected.get("size"):
            raise CheckpointError(f"{name} is {size} bytes after the commit, the marker says {expected.get('size')}")


def is_committed(path: str | Location) -> bool:
    """Whether the checkpoint at ``path`` has its commit marker."""
    return (storage.path(path) / MARKER).is_file()


def read_marker(path: str | Location) -> dict[str, Any]:
    """The metadata stored in a checkpoint's commit marker."""
    data: dict[str, Any] = json.loads((storage.path(path) / MARKER).read_text())
    return data


def verify(path: str | Location, share: tuple[int, int] = (0, 1)) -> None:
    """Check every file against the marker's manifest (markers without one, from older versions, pass);
    ``share=(i, n)``: only the i-th of every n files, in name order (n processes verify one checkpoint together)."""
    root = storage.path(path)
    try:
        files = read_marker(root).get("files")
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"unreadable {MARKER} marker ({type(exc).__name__})") from None
    names = sorted(files or {})[share[0]::share[1]]
    for name, expected in ((n, (files or {})[n]) for n in names):
        target = root / name
        if not target.is_file():
            raise CheckpointError(f"{name} is missing")
        size = target.stat().st_size
        if size != expected.get("size"):
            raise CheckpointError(f"{name} is {size} bytes, the marker says {expected.get('size')} (truncated?)")
        if file_digest(target)["sha256"] != expected.get("sha256"):
            raise CheckpointError(f"{name} does not match its checksum")


def committed(checkpoint_dir: str | Location, warn: bool = True) -> list[tuple[int, Location]]:
    """Committed checkpoints, oldest first; torn ones (no marker) are skipped with a warning. A step's
    ``.replaced-`` checkpoint counts while the step has no committed ``ckpt-<step>`` (``write_beside``)."""
    root = storage.path(checkpoint_dir)
    if not root.is_dir():
        return []
    found: dict[int, Location] = {}
    for child in root.iterdir():
        match = _NAME.match(child.name) or _REPLACED.match(child.name)
        if not match or not child.is_dir():
            continue
        step = int(match.group(1))
        if is_committed(child):
            if step not in found or _NAME.match(child.name):
                found[step] = child
        elif warn and _NAME.match(child.name):
            log.warning("skipping torn checkpoint %s (no %s marker)", child, MARKER)
    return sorted(found.items())


def latest(checkpoint_dir: str | Location) -> Location | None:
    """The newest committed checkpoint, or None."""
    found = committed(checkpoint_dir)
    return found[-1][1] if found else None


def _explicit(resume_from: str) -> Location:
    """``--resume-from``: a committed checkpoint, or a directory of them (its newest)."""
    path = storage.path(resume_from)
    if path.is_dir() and _NAME.match(path.name) is None:
        newest = latest(path)
        if newest is not None:
            return newest
    if not path.exists():
        raise ConfigError("--resume-from", f"{resume_from} does not exist")
    if not is_committed(path):
        raise ConfigError("--resume-from", f"{resume_from} is not a committed checkpoint (no {MARKER} marker)")
    return path


def load_newest(checkpoint_dir: str | Location, resume_from: str | None, load: Callable[[Location], T],
                retention: Retention | None = None, *,
                check: Callable[[Location], None] | None = None) -> tuple[Location, T] | None:
    """Verify (``check``, default ``verify``) and ``load`` the job's own newest committed checkpoint that does;
    while the job has none of its own, ``--resume-from`` (which must load).

    ``--resume-from`` is where the job starts, not where it resumes: once the job committed a checkpoint, its
    restarts (the platform repeats the same arguments) go on from the job's own newest. A bad checkpoint met on
    the way back is named in a warning (and ``retention`` learns it is bad, and which one loaded). When the
    job's committed checkpoints exist and none loads, ``--resume-from`` is the start again if given (a warning
    says so); without it the job cannot resume: a configuration error naming the directory (never a silent fresh
    start over good work, never a crash loop on one torn file).
    """
    retention = retention or Retention(0)
    check = check or verify  # a sharded writer's ranks verify their share of the files inside ``load``
    found = committed(checkpoint_dir)
    for _step, path in reversed(found):
        try:
            check(path)
            loaded = load(path)
        except Exception as exc:
            log.warning("checkpoint %s does not load (%s): trying the next older one", path, _reason(exc))
            retention.bad[path] = _reason(exc)
            continue
        retention.verified(path)
        if resume_from is not None:
            log.info("the job has committed checkpoints of its own: resuming from its newest, %s, not from "
                     "--resume-from %s (its starting point)", path, resume_from)
        return path, loaded
    if resume_from is not None:
        if found:
            log.warning("none of the job's %d committed checkpoints in %s loads: starting again from --resume-from %s",
                        len(found), checkpoint_dir, resume_from)
        return _warm_start(resume_from, load, retention, check)
    if found:
        newest = retention.bad.get(found[-1][1], "")
        raise ConfigError(str(checkpoint_dir), f"none of the {len(found)} committed checkpoints loads (the newest: "
                          f"{newest}); move them away to start afresh or pass --resume-from")
    return None


def _warm_start(resume_from: str, load: Callable[[Location], T], retention: Retention,
                check: Callable[[Location], None]) -> tuple[Location, T]:
    """``--resume-from``, verified (``check``) and loaded (a configuration error when it does not)."""
    path = _explicit(resume_from)
    try:
        check(path)
        loaded = load(path)
    except Exception as exc:
        raise ConfigError("--resume-from", f"{path} does not load: {_reason(exc)}") from None
    retention.verified(path)
    return path, loaded


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


class Retention:
    """Which committed checkpoints go after a save: the known-bad ones first, never the newest that verifies.

    ``--keep-checkpoints K`` keeps K checkpoints; the newest checkpoint known to verify (the one restored
    from, or the newest this process committed) is kept whatever its step, and checkpoints that failed to
    verify or load at resume are deleted before any other (each named in a warning), so at every moment
    at least one checkpoint that loads remains.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.good: set[Location] = set()  # known to verify: restored from, or committed by this process
        self.bad: dict[Location, str] = {}  # committed, but failed to verify or load at resume: why

    def verified(self, path: Location) -> None:
        """``path`` is known to verify (a checkpoint rewritten at the step of a bad one is good from now on)."""
        self.good.add(storage.path(path))
        self.bad.pop(storage.path(path), None)

    def prune(self, checkpoint_dir: str | Location) -> list[Location]:
        """Delete what exceeds the budget (bad first, then the oldest), and torn or partial ones older than those
        kept."""
        found = [path for _step, path in committed(checkpoint_dir, warn=False)]
        good = [p for p in found if p in self.good]
        protected = good[-1] if good else None
        bad = [p for p in found if p in self.bad and p != protected]
        others = [p for p in found if p not in self.bad and p != protected]
        doomed = (bad + others)[: max(len(found) - self.keep, 0)]
        for path in doomed:
            if path in self.bad:
                log.warning("deleting checkpoint %s: it does not load (%s)", path, self.bad.pop(path))
            self.good.discard(path)
            storage.rmtree(path)
        kept = [p for p in found if p not in doomed]
        oldest_kept = min((_step_of(p) for p in kept), default=None)
        for child in storage.path(checkpoint_dir).iterdir():
            match = _NAME.match(child.name) or _PARTIAL.match(child.name)  # torn, or a rewrite a kill left
            older = match is not None and oldest_kept is not None and int(match.group(1)) < oldest_kept
            if older and (child.name.startswith(PARTIAL) or not is_committed(child)):
                storage.rmtree(child)
        return doomed


def _step_of(path: Location) -> int:
    match = _NAME.match(path.name) or _REPLACED.match(path.name)
    return int(match.group(1)) if match else -1


def write_beside(target: Path, write: Callable[[Path], None]) -> None:
    """Write the checkpoint directory ``target`` (local) with ``write``, which commits it, whole beside it first
    (``.partial-<name>``) and swap it in: a committed checkpoint already at ``target`` stays loadable until then
    (a failure or a kill mid-write leaves it as it was), and is removed after. A failed write's partial copy is
    removed (a full disk does not stay full); one a kill left is removed by the next write of the step or pruned."""
    partial = partial_of(target)
    shutil.rmtree(partial, ignore_errors=True)  # what an earlier attempt left
    partial.mkdir(parents=True)
    try:
        write(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    swap_in(partial, target)


def partial_of(target: Path) -> Path:
    """Where the checkpoint ``target`` is written beside its place before ``swap_in`` (never listed as committed)."""
    return target.with_name(PARTIAL + target.name)


def swap_in(partial: Path, target: Path) -> None:
    """Put the committed checkpoint ``partial`` at ``target``, removing what was there only after (one exchange
    where the system can, else two renames, between which the old one counts as its step's: ``committed``)."""
    replaced = target.with_name(f".replaced-{target.name}")
    if not target.exists():
        partial.rename(target)
    elif _exchange(partial, target):
        shutil.rmtree(partial, ignore_errors=True)  # the old checkpoint, now under the partial name
    else:
        shutil.rmtree(replaced, ignore_errors=True)
        target.rename(replaced)
        partial.rename(target)
    shutil.rmtree(replaced, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` at once (Linux's ``renameat2``); False where the system or the file system
    cannot."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_cwd = -100
    done = renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0
    if not done and ctypes.get_errno() not in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not here
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(b))
    return done


class CheckpointWriter(Protocol):
    """How a training loop saves and loads checkpoints (no framework here: each framework implements it).

    ``save`` writes every file of the checkpoint at ``path``, then commits the marker last (``commit``), then
    tells ``retention`` the checkpoint verifies and prunes ``path``'s parent; a writer may do this in the
    background (``wait``, ``check``). ``load`` is what ``load_newest`` calls on each candidate.
    """

    @property
    def retention(self) -> Retention:
        """What a save prunes; ``load_newest`` tells it which checkpoint loaded and which did not."""

    @property
    def blocked_seconds(self) -> float:
        """Training time spent waiting for saves so far (the summary's ``checkpoint_blocked_seconds``)."""

    @property
    def write_seconds(self) -> float:
        """Time spent writing and committing checkpoints so far (``checkpoint_write_seconds``)."""

    def save(self, path: Location, state: Any, meta: dict[str, Any]) -> None:
        """Write ``state`` as the checkpoint at ``path`` and commit it with ``meta`` in its marker (marker last)."""

    def wait(self) -> None:
        """Block until no save is in flight; raise the failure of one that failed."""

    def check(self) -> None:
        """Raise the failure of a save that failed in the background (cheap: called at every step)."""

    def load(self, path: Location, into: Any, /) -> Any:
        """The committed checkpoint at ``path``, restored onto ``into`` (a torch device, a Keras model)."""
