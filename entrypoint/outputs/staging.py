"""Local staging for writers that speak only local paths, mirrored to remote outputs through the storage seam.

TensorFlow 2.21's own ``gs://`` file system has Google's endpoint compiled in (no emulator setting) and no
marker-last commit, so for ``gs://`` outputs without Vertex's FUSE mount the TensorFlow hooks loop writes
local staging directories and this module copies what is complete to the store:

- one private directory per process under the node's temp dir (``tempfile.mkdtemp``: mode 0700, made on
  first use), one subdirectory per staged output (``model``, ``checkpoints``, ``tensorboard``). An output
  that is local (or on the FUSE mount) is written where it is, and every method here leaves it alone;
- a committed checkpoint is uploaded file by file with its commit marker LAST (the layout of a local one,
  so ``checkpoints.committed`` / ``verify`` / ``Retention`` work on the store), then its staging copy goes;
  a checkpoint to load is downloaded under ``restore/``;
- ``publish`` uploads a whole output (the names in ``last`` last), ``push`` / ``pull`` mirror one directory
  (``prune``: objects no longer there locally are deleted after the upload);
- uploads are synchronous: the writer waits for them (TensorFlow's checkpoints are small), so whatever the
  job committed is on the store when it ends; ``close`` (at exit, on failure too) removes the directory.

Every store failure is a ``storage.StorageError`` (``failures.classify``: 197 when unreachable, retryable).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from types import TracebackType

from entrypoint.outputs import storage
from entrypoint.outputs.checkpoints import MARKER
from entrypoint.outputs.locations import OutputDirs, local_path
from entrypoint.outputs.storage import Location, RemotePath

log = logging.getLogger("entrypoint.staging")
KINDS = ("model", "checkpoints", "tensorboard")


class Staging:
    """Where a local-only writer puts each output, and the copies from there to the store (chief's job)."""

    def __init__(self, outputs: OutputDirs) -> None:
        uris = {"model": outputs.model_dir, "checkpoints": outputs.checkpoint_dir,
                "tensorboard": outputs.tensorboard_dir}
        self.targets: dict[str, Location] = {kind: storage.path(local_path(uri)) for kind, uri in uris.items()}
        self._root: Path | None = None

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    @property
    def root(self) -> Path:
        """The private staging directory (made on first use)."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="trainer-staging-"))
        return self._root

    def staged(self, kind: str) -> bool:
        """Whether output ``kind`` goes to a store (written here first)."""
        return isinstance(self.targets[kind], RemotePath)

    @property
    def any_staged(self) -> bool:
        """Whether any output goes through staging."""
        return any(self.staged(kind) for kind in KINDS)

    def target(self, kind: str) -> Location:
        """Where output ``kind`` finally lives: the store's URL, or the local directory."""
        return self.targets[kind]

    def local(self, kind: str) -> Path:
        """Where the writer writes output ``kind``: its staging subdirectory, or the output itself when local."""
        if not self.staged(kind):
            return Path(str(self.targets[kind]))
        path = self.root / kind
        path.mkdir(exist_ok=True)
        return path

    def push_checkpoint(self, path: Path) -> Location:
        """A checkpoint committed in staging, uploaded (its files, then its marker) and its staging copy removed;
        where it now is. A checkpoint outside staging (local outputs) is left where it is."""
        if not self.staged("checkpoints"):
            return path
        remote = self.targets["checkpoints"] / path.name
        assert isinstance(remote, RemotePath)
        (remote / MARKER).unlink(missing_ok=True)  # a re-run reached the same step: never mix two saves
        storage.rmtree(remote)
        storage.upload_tree(path, remote, last=(MARKER,))
        shutil.rmtree(path, ignore_errors=True)
        return remote

    def pull_checkpoint(self, path: Location) -> Path:
        """A local copy of the checkpoint at ``path`` to load from (a local one as it is)."""
        if not isinstance(path, RemotePath):
            return path
        local = self.root / "restore" / path.name
        shutil.rmtree(local, ignore_errors=True)
        storage.download_tree(path, local)
        return local

    def publish(self, kind: str, last: tuple[str, ...] = ()) -> None:
        """Upload staged output ``kind``; the names in ``last`` are deleted first and uploaded last, so one found
        on the store means the upload it ends is whole (``saved_model.pb`` for an export)."""
        remote = self.targets[kind]
        if isinstance(remote, RemotePath):
            for name in last:
                (remote / name).unlink(missing_ok=True)
            storage.upload_tree(self.local(kind), remote, last=last)

    def push(self, local: Path, remote: Location, last: tuple[str, ...] = (), prune: bool = False) -> None:
        """Mirror the local directory ``local`` to ``remote`` (no-op when ``remote`` is local): upload (``last``
        last), then with ``prune`` delete the objects that are no longer there locally."""
        if not isinstance(remote, RemotePath):
            return
        names = set(storage.upload_tree(local, remote, last=last)) if local.is_dir() else set()
        if prune:
            for item in remote.rglob("*"):
                if storage.relative(item, remote) not in names:
                    item.unlink(missing_ok=True)

    def pull(self, remote: Location, local: Path) -> list[str]:
        """Copy ``remote`` (a store prefix) into ``local``; the names copied (none when ``remote`` is local)."""
        if not isinstance(remote, RemotePath):
            return []
        return storage.download_tree(remote, local)

    def discard(self, remote: Location) -> None:
        """Delete ``remote`` from the store (nothing for a local path: the writer removed its own)."""
        if isinstance(remote, RemotePath):
            storage.rmtree(remote)

    def close(self) -> None:
        """Remove the staging directory (every upload was synchronous: nothing committed is only here)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
