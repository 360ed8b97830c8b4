"""Sharded checkpoints: every rank writes its own shards with torch.distributed.checkpoint; the chief commits last.

``ShardedCheckpointIO`` implements ``checkpoints.CheckpointWriter`` for FSDP and HSDP. ``save`` is called on
every rank with the same path: the state (sharded model and optimizer state dicts) is staged into host buffers
kept from one save to the next (pinned on a GPU) - the only part training waits for - then a background thread
writes it with ``torch.distributed.checkpoint`` over a gloo process group of its own (the training collectives
never wait on it), hashes this rank's files and gathers every rank's list; the chief writes ``extra.pt`` (the
position, history, RNG of every rank) and then the ``COMMITTED`` marker, listing every file of every rank with
its size and SHA-256, last. A rank killed mid-save leaves a checkpoint without a marker: resume skips it, as it
skips any torn checkpoint. ``--checkpoint-mode sync`` does the same in the training thread. Some torch releases
(2.11 among them) close the stager's copier after every stage, and a second stage of a DTensor then fails
(``KeyError: <class 'type'>``): there, each save gets a fresh stager (no buffers are kept between saves). At a
commit that also takes FSDP's snapshot in peer memory, the shards are that snapshot's host copy (``state["host"]``,
being made beside the next step), filled in the writer's thread once it is made: the stager copies nothing, and
training waits for no copy here. The stager's own buffers could not serve the snapshot instead: they are written
again at the next save, and a snapshot is kept until two commits later.

On an object store without a FUSE mount (``gs://``), each rank writes into a private local directory and uploads
its own files; loading downloads the checkpoint once per process. The checkpoint loads into any world size
(``dcp.load`` reshards) and into a replicated model (``load_whole``; ``formats.py`` pairs formats and models).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from entrypoint import failures
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.storage import Location, RemotePath, StorageError
from entrypoint.pytorch.checkpoints.checkpoint_io import BackgroundWriter, output_error, write_file

log = logging.getLogger("entrypoint.pytorch")
EXTRA_FILE = "extra.pt"
METADATA_FILE = ".metadata"
warnings.filterwarnings("ignore", message="Detected an existing checkpoint in", category=UserWarning)


def is_sharded_checkpoint(path: Location) -> bool:
    """Whether the checkpoint at ``path`` was written by torch.distributed.checkpoint (a ``.metadata`` file)."""
    return (path / METADATA_FILE).is_file()


def stager_closed_itself(stager: Any) -> bool:
    """Whether ``DefaultStager.stage`` closed the stager's copier (its dispatch table emptied: the next stage of a
    state with a class in it, as a DTensor's is, fails with ``KeyError: <class 'type'>``; torch 2.11 does this)."""
    table = getattr(getattr(stager, "_state_dict_stager", None), "_deepcopy_dispatch", None)
    return isinstance(table, dict) and not table


class HostCopy(Protocol):
    """A host copy of the training state being made elsewhere (FSDP's snapshot in peer memory) that can serve a
    save's shards (``recovery/host_copy.py``): ``serve`` lays them out now (None: it does not hold them all) as a
    call the writer's thread makes, which returns them filled from the copy once it is made."""

    def serve(self, shards: dict[str, Any]) -> Callable[[], dict[str, Any]] | None: ...


class _KeptError(io.FileIO):
    """A file that keeps the OSError of a failed write: ``torch.save``, which torch.distributed.checkpoint writes
    every shard with, turns it into ``unexpected pos`` (a full disk read as the user's error, exit 1)."""

    error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return super().write(data)
        except OSError as exc:
            self.error = exc
            raise


def _writer(target: str) -> Any:
    """torch.distributed.checkpoint's file system writer for ``target`` (the one ``checkpoint_id`` picks), whose
    files raise the disk's own error when a write fails (ENOSPC: ``disk_full``, 74), on the failing rank and, through
    the save's own gather of failures, on every other."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class Files(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
            if mode != "wb":
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            raw = _KeptError(os.fspath(path), "w")
            try:  # the buffer's last flush, at the end of the ``with``, can be the write that fails: named too
                with io.BufferedWriter(raw) as stream:
                    yield stream
            except Exception:
                if raw.error is not None:
                    raise OSError(raw.error.errno, raw.error.strerror, os.fspath(path)) from None
                raise

    writer = FileSystemWriter(target)
    writer.fs = Files()
    return writer


def disk_error(exc: BaseException) -> BaseException | None:
    """The disk's own error a failed ``dcp.save`` carries (this rank's or another's, from its ``failures``)."""
    failures = getattr(exc, "failures", None)
    for wrapped in (failures or {}).values() if isinstance(failures, dict) else ():
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        if isinstance(inner, OSError) and inner.errno is not None:
            return inner
    return None


def peer_loss(exc: BaseException) -> Exception | None:
    """The error of a lost peer that cut a save off: ``exc`` itself (a collective of the save failed), or one of a
    ``CheckpointException``'s ranks' errors; None where the save failed otherwise."""
    found = [exc] if isinstance(exc, Exception) else [e for e, _ in getattr(exc, "failures", {}).values()]
    return next((e for e in found if isinstance(e, Exception) and failures.is_peer_lost(e)), None)


class ShardedCheckpointIO(BackgroundWriter):
    """Every rank saves its shards (in the background by default); the chief commits the marker last."""

    def __init__(self, keep: int, rank: int, mode: str, timeout: float, cuda: bool) -> None:
        super().__init__(keep, mode)
        self.rank, self.cuda, self.timeout = rank, cuda, timeout
        self._group: Any = None  # the saves' gloo group: every rank forms it at its first save of a generation
        # Kept for the whole run: its staging buffers are reused from one save to the next.
        self.stager = self._new_stager()

    def _new_stager(self) -> Any:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        return DefaultStager(StagingOptions(use_pinned_memory=self.cuda, use_shared_memory=False,
                                            use_async_staging=False, use_non_blocking_copy=self.cuda))

    def _form_group(self) -> None:
        """The saves' gloo group, formed at the first save (every rank saves at the same step, in the training
        thread), and again after survivors re-formed the job's group (the old one went with it)."""
        if not self._group_live():
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout))

    def regroup(self) -> None:
        """The saves' group's connections were shut down (``Collectives.wake``): the next save forms a new gloo group
        over the job's store, with every rank (the broken one stays registered, unused)."""
        self._group = None

    def _stage(self, state: dict[str, Any]) -> Any:
        """``state["shards"]`` copied into host memory (with ``state["extra"]``): the snapshot's copy being made
        (``state["host"]``) where it holds them all (the write fills them in, waiting for it: the training thread
        does not), else the stager's, whose buffers a torch that closed it after the copy replaces for the next. The
        saves' group is formed here, in the training thread."""
        self._form_group()
        host = state.get("host")
        shared = host.serve(state["shards"]) if host is not None else None
        if shared is not None:
            return shared, state.get("extra")
        staged = self.stager.stage(state["shards"])  # synchronous (no Future)
        if stager_closed_itself(self.stager):
            self.stager.close()
            self.stager = self._new_stager()
        return staged, state.get("extra")

    def _group_rank(self) -> int:
        """This rank in the saves' group (DCP names its files by it): the placement's, or, while HSDP's survivors
        train with fewer replicas, its place among the live ranks."""
        return dist.get_rank(self._group) if self._group_live() else self.rank

    def _group_live(self) -> bool:
        """Whether the saves' group is formed and still in torch's registry (survivors destroy the job's groups)."""
        return self._group is not None and self._group in dist.distributed_c10d._world.pg_map

    @property
    def is_chief(self) -> bool:
        """The rank that commits and prunes."""
        return self.rank == 0

    def _by(self) -> str:
        return f" (sharded over {dist.get_world_size(self._group)} ranks)"

    def _write(self, path: Location, staged: Any, meta: dict[str, Any]) -> None:
        """Every rank its shards (``dcp.save`` over the writer's gloo group), then the chief ``extra.pt`` and the
        marker listing every rank's files. On a local disk the checkpoint is written beside ``path`` and the chief
        swaps it in once committed; on a store, which has no rename, in its place."""
        import torch.distributed.checkpoint as dcp

        shards, extra = staged
        if callable(shards):  # filled from the snapshot's host copy once it is made (``HostCopy.serve``)
            shards = shards()
        where: Location = path if isinstance(path, RemotePath) else checkpoints.partial_of(path)
        local = Path(tempfile.mkdtemp(prefix="trainer-shards-")) if isinstance(path, RemotePath) else None
        try:
            if self.is_chief and where.exists():  # what an earlier save of this step left: never mix two saves
                storage.rmtree(where)
            # No rank creates the directory before the chief has cleared it (a rank's writer makes it as it plans).
            dist.barrier(group=self._group)
            target = local or where
            dcp.save(shards, storage_writer=_writer(str(target)), process_group=self._group)
            mine = self._mine(target, local, where)
            everyone: list[Any] = [None] * dist.get_world_size(self._group)
            dist.all_gather_object(everyone, mine, group=self._group)
            failed = [f"rank {r}: {files}" for r, files in enumerate(everyone) if isinstance(files, str)]
            if failed:
                raise OSError(f"a rank could not write its shards of {path.name}: {'; '.join(failed)}")
            if self.is_chief:
                files = {name: digest for files in everyone for name, digest in files.items()}
                files[EXTRA_FILE] = write_file(extra, where / EXTRA_FILE)
                checkpoints.commit(where, meta, files)
                checkpoints.check_sizes(where)
                if not isinstance(path, RemotePath):
                    checkpoints.swap_in(checkpoints.partial_of(path), path)
        finally:
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)

    def _failure(self, path: Location, exc: BaseException) -> BaseException:
        """The disk's own error where a rank's write met one (ENOSPC: ``disk_full``), else the lost peer's error
        where the save's collectives were cut off by one (raised as it came, even on a store: a node lost while a
        checkpoint is written is that node's loss, which survivors recover from, not the store's), else what failed
        (a ``CheckpointException`` is a BaseException); what the save left removed."""
        cause = disk_error(exc) or peer_loss(exc) or (exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
        self._discard(path if isinstance(path, RemotePath) else checkpoints.partial_of(path))
        return cause if failures.is_peer_lost(cause) else output_error(cause, path)

    def _discard(self, path: Location) -> None:
        """A failed save leaves no partial checkpoint (a full disk stays full otherwise): every rank removes its own
        files of it, the chief the whole uncommitted directory (the save's collectives have ended on every rank)."""
        with contextlib.suppress(OSError, StorageError):
            if self.is_chief:
                storage.rmtree(path)
            elif not isinstance(path, RemotePath) and path.is_dir():  # this rank's own disk, or the shared one
                for part in path.iterdir():
                    if part.name.startswith(f"__{self._group_rank()}_"):
                        part.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    path.rmdir()  # only when empty: on a disk of its own

    def _mine(self, target: Location, local: Path | None, path: Location) -> dict[str, Any] | str:
        """This rank's files of the checkpoint and their digests (uploaded from its private directory to a store);
        a string saying what failed otherwise."""
        try:
            root = Path(str(target))
            found = {p.name: checkpoints.file_digest(p) for p in sorted(root.iterdir())
                     if p.name.startswith(f"__{self._group_rank()}_") or (self.is_chief and p.name == METADATA_FILE)}
            if local is not None and isinstance(path, RemotePath):
                storage.upload_tree(local, path)  # its private directory holds this rank's files only
            return found
        except (OSError, StorageError) as exc:
            return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"

    def load(self, path: Location, into: Any) -> Any:
        """Read the committed checkpoint at ``path`` into ``into`` (``{"shards": ..., "extra": None}``), resharded."""
        import torch.distributed.checkpoint as dcp

        with readable(path) as local:
            dcp.load(into["shards"], checkpoint_id=str(local))
            into["extra"] = torch.load(Path(local) / EXTRA_FILE, map_location="cpu", weights_only=False)
        return into

    @staticmethod
    def load_whole(path: Location, into: dict[str, Any]) -> dict[str, Any]:
        """Read the committed checkpoint at ``path`` whole into ``into`` (``{"model": ..., "optim": ...}``, full
        state dicts) in this process alone (``no_dist``: a replicated model); its ``extra.pt``."""
        import torch.distributed.checkpoint as dcp

        with readable(path) as local:
            dcp.load(into, checkpoint_id=str(local), no_dist=True)
            extra: dict[str, Any] = torch.load(Path(local) / EXTRA_FILE, map_location="cpu", weights_only=False)
        return extra

    def close(self) -> None:
        """The save in flight committed; the staging buffers released."""
        super().close()
        self.stager.close()


class readable:
    """A local directory holding the checkpoint at ``path`` (downloaded from a store - ``only`` those files, if
    given - and removed afterwards)."""

    def __init__(self, path: Location, only: tuple[str, ...] | None = None) -> None:
        self.path, self.only = path, only
        self.local: Path | None = None

    def __enter__(self) -> Path:
        if not isinstance(self.path, RemotePath):
            return Path(str(self.path))
        self.local = Path(tempfile.mkdtemp(prefix="trainer-shards-"))
        if self.only is None:
            storage.download_tree(self.path, self.local)
        for name in self.only or ():
            (self.local / name).write_bytes((self.path / name).read_bytes())
        return self.local

    def __exit__(self, *_exc: object) -> None:
        if self.local is not None:
            shutil.rmtree(self.local, ignore_errors=True)
