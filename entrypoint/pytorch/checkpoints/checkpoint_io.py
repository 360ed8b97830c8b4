"""Checkpoint I/O behind one seam: the loop saves, loads and exports through it, never with torch.save itself.

Every writer implements ``checkpoints.CheckpointWriter`` (the interface Keras' writer implements too) and shares
``BackgroundWriter``: at most one write in flight, in a thread of its own; the next save, the final export, a
preemption save and the process's exit all wait for it, and a failed write fails the job at the next step; how long
training was blocked and how long writes took. ``ReplicatedCheckpointIO`` (DDP, Horovod, one process) blocks the
training step only for a copy of the state into host memory, then its thread writes it, hashes it, commits the
marker (last) and prunes old checkpoints; ``--checkpoint-mode sync`` writes inline. The sharded writer
(``sharded_io.py``) shares the same base; ``formats.py`` pairs each writer with the layout it saves.

A checkpoint loads with one line: ``torch.load("ckpt-00000100/state.pt", weights_only=False)["model"]``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import threading
import time
from typing import IO, Any

import torch

from entrypoint.errors import OutputError
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.storage import Location, RemotePath, StorageError

log = logging.getLogger("entrypoint.pytorch")
STATE_FILE = "state.pt"
MODES = ("async", "sync")  # --checkpoint-mode: written in the writer's thread, or in the training thread
LOAD_WITH = 'torch.load("<checkpoint>/state.pt", weights_only=False)["model"]'


class _HashingWriter:
    """A binary file that hashes what it writes and keeps the real OSError torch.save would hide."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            written = self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self.sha.update(data)
        self.size += len(memoryview(data))
        return written

    def flush(self) -> None:
        self.f.flush()


def write_file(obj: Any, path: Location) -> dict[str, Any]:
    """``torch.save`` to ``path`` through a hashing writer; the file's size and SHA-256.

    A failure leaves no partial file and surfaces as the disk's own error (ENOSPC, EROFS), which
    torch.save would otherwise turn into an opaque ``unexpected pos`` message. On an object store the
    object is uploaded while torch.save writes and appears only when the upload is finalized.
    """
    writer: _HashingWriter | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            writer = _HashingWriter(f)
            torch.save(obj, writer)  # type: ignore[arg-type]
    except Exception as exc:
        path.unlink(missing_ok=True)
        cause = writer.error if writer is not None and writer.error is not None else exc
        raise output_error(cause, path) from None
    return {"size": writer.size, "sha256": writer.sha.hexdigest()}


def output_error(exc: BaseException, path: Location) -> BaseException:
    """A failed write of ``path``, with the path it concerns; ``failures.classify`` decides its class.

    On an object store every failure is the store's (``StorageError``); a disk's ``OSError`` keeps its
    errno and names ``path`` when it named no file (``torch.save`` to an open file does not).
    """
    if isinstance(path, RemotePath):
        return exc if isinstance(exc, (StorageError, OutputError)) else StorageError(str(path), exc)
    if isinstance(exc, OSError) and exc.errno is not None and not exc.filename:
        return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))
    return exc


class HostBuffers:
    """Host memory the state is copied into, kept from one save to the next (pinned for GPU tensors).

    Allocating a fresh copy per save pays a page fault per page; reusing the buffers makes the copy a
    plain memcpy (or one device-to-host transfer), the only part of a save the training step waits for.
    Safe because at most one write is in flight: the next copy starts after the previous write ended.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def copy(self, value: Any, key: str = "") -> Any:
        """``value`` with every tensor copied into this object's host buffers (shared tensors stay shared)."""
        memo: dict[int, torch.Tensor] = {}
        copied = self._copy(value, key, memo)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non-blocking device-to-host copies are complete
        return copied

    def _copy(self, value: Any, key: str, memo: dict[int, torch.Tensor]) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in memo:
                buffer = self._buffers.get(key)
                if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                    buffer = torch.empty(value.shape, dtype=value.dtype, pin_memory=value.is_cuda)
                    self._buffers[key] = buffer
                buffer.copy_(value.detach(), non_blocking=value.is_cuda)
                memo[id(value)] = buffer
            return memo[id(value)]
        if isinstance(value, dict):
            return {k: self._copy(v, f"{key}/{k}", memo) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._copy(v, f"{key}/{i}", memo) for i, v in enumerate(value))
        return value


class BackgroundWriter:
    """What every writer of the hooks loop shares: the save's template (``save``: the part training waits for, then
    the write and the commit, in the writer's thread or, ``--checkpoint-mode sync``, in the training thread), at most
    one write in flight (its thread is not a daemon: the process's exit waits for it), a failed write raised at the
    next ``check`` (every step boundary) or ``wait`` with its partial files removed, how long training was blocked and
    how long writes took, the commit's log line, and the retention of committed checkpoints (its committer prunes).

    A writer gives ``_stage`` (what training waits for: a copy into host memory), ``_write`` (every file, then the
    marker, last) and ``_failure`` (the error the training thread raises, once what the write left is removed)."""

    def __init__(self, keep: int, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"checkpoint mode {mode!r}: one of {', '.join(MODES)}")
        self.mode, self.background = mode, mode == "async"
        self.retention = checkpoints.Retention(keep)
        self.blocked_seconds = 0.0
        self.write_seconds = 0.0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def is_chief(self) -> bool:
        """The writer that commits, prunes and says so."""
        return True

    def save(self, path: Location, state: dict[str, Any], meta: dict[str, Any]) -> None:
        """Write ``state`` as the checkpoint at ``path`` and commit it, once the previous write ended: in the
        background after ``_stage`` (the only part the training step waits for), or inline (sync)."""
        self.wait()
        started = time.perf_counter()
        staged = self._stage(state)
        blocked = time.perf_counter() - started
        if not self.background:
            self._commit(path, staged, meta, started)
            self.check()
            return
        self.blocked_seconds += blocked
        self._thread = threading.Thread(target=self._commit, args=(path, staged, meta, started, blocked),
                                        name=f"checkpoint-{path.name}")
        self._thread.start()

    def _commit(self, path: Location, staged: Any, meta: dict[str, Any], started: float,
                blocked: float | None = None) -> None:
        """Write and commit ``staged``, prune, and say what training waited for (``blocked``; None: the whole save,
        in the training thread); a failure is kept for the training thread."""
        began = time.perf_counter()
        try:
            self._write(path, staged, meta)
        except BaseException as exc:
            self._error = self._failure(path, exc)
            where = " in the background" if self.background else ""
            log.error("checkpoint %s failed%s: %s", path.name, where, " ".join(str(self._error).split())[:300])
            return
        try:  # the checkpoint is committed: a failed prune leaves it (and older ones) as they are
            if self.is_chief:
                self.retention.verified(path)
                self.retention.prune(path.parent)
        except BaseException as exc:
            self._error = exc
            return
        written = time.perf_counter() - began
        self.write_seconds += written
        if blocked is None:
            blocked = time.perf_counter() - started
            self.blocked_seconds += blocked
        if self.is_chief:
            how = "in the background" if self.background else "in the training thread"
            log.info("checkpoint %s committed%s: training blocked %.2f s, written in %.2f s %s", path.name,
                     self._by(), blocked, written, how)

    def _stage(self, state: dict[str, Any]) -> Any:
        """What the write needs of ``state``, independent of training from here on (async)."""
        raise NotImplementedError

    def _write(self, path: Location, staged: Any, meta: dict[str, Any]) -> None:
        """Every file of the checkpoint, then its marker (last)."""
        raise NotImplementedError

    def _failure(self, path: Location, exc: BaseException) -> BaseException:
        """The error the training thread raises for a failed write of ``path`` (what it left removed)."""
        raise NotImplementedError

    def _by(self) -> str:
        """Who wrote a committed checkpoint, for its log line (nothing: the chief alone)."""
        return ""

    def wait(self) -> None:
        """Block until the write in flight (if any) is committed; raise its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.check()

    def check(self) -> None:
        """Raise the failure of a finished background write (called at every step boundary)."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """The write in flight committed (its failure raised); what the writer holds released."""
        self.wait()

    def regroup(self) -> None:
        """The connections the writer's collectives use were shut down (a sharded model's stop woke its peers): the
        next save forms new ones. A writer with no collective has none."""


class ReplicatedCheckpointIO(BackgroundWriter):
    """The whole state in one file, ``state.pt``, written by the chief: inline (``--checkpoint-mode sync``), or
    copied into host buffers in the training thread and written, committed and pruned in the background (async)."""

    def __init__(self, keep: int, mode: str = "async") -> None:
        super().__init__(keep, mode)
        self._host = HostBuffers()

    def _stage(self, state: dict[str, Any]) -> Any:
        """A copy into host buffers kept between saves (async); the live state itself when written inline."""
        return self._host.copy(state) if self.background else state

    def _write(self, path: Location, state: dict[str, Any], meta: dict[str, Any]) -> None:
        """On a local disk beside ``path``, swapped in once committed (a rerun that reached a committed step leaves
        it loadable until the new one is whole); on a store, which has no rename, in its place."""
        if not isinstance(path, RemotePath):
            checkpoints.write_beside(path, lambda where: self._write_state(where, state, meta))
            return
        if path.exists():  # a rerun reached the same step: replace, never mix two saves
            storage.rmtree(path)
        self._write_state(path, state, meta)

    @staticmethod
    def _write_state(path: Location, state: dict[str, Any], meta: dict[str, Any]) -> None:
        files = {STATE_FILE: write_file(state, path / STATE_FILE)}
        checkpoints.commit(path, meta, files)
        checkpoints.check_sizes(path)

    def _failure(self, path: Location, exc: BaseException) -> BaseException:
        """What the failed write left removed (on a local disk ``write_beside`` removed its partial copy: a committed
        ``path`` stays)."""
        if isinstance(path, RemotePath) and not isinstance(exc, StorageError):
            with contextlib.suppress(Exception):  # a store that failed would fail this too: uncommitted is skipped
                storage.rmtree(path)
        return output_error(exc, path)

    @staticmethod
    def load(path: Location, device: torch.device | str) -> dict[str, Any]:
        """A committed checkpoint's state, onto ``device`` (an object is read whole, then loaded): the one reader of
        ``state.pt``, whichever kind of model it goes into (``formats.py``)."""
        source = path / STATE_FILE
        target: Any = io.BytesIO(source.read_bytes()) if isinstance(source, RemotePath) else source
        state: dict[str, Any] = torch.load(target, map_location=device, weights_only=False)
        return state


def make_io(mode: str, keep: int) -> checkpoints.CheckpointWriter:
    """The replicated checkpoint I/O for ``--checkpoint-mode`` (mypy checks that it implements the interface)."""
    return ReplicatedCheckpointIO(keep, mode)
