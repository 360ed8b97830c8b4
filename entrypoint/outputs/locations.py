"""Where models, checkpoints and TensorBoard logs go: flags, then Vertex's AIP_* variables, then the job dir."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from entrypoint import errors
from entrypoint.errors import OutputError
from entrypoint.outputs import storage

DEFAULT_JOB_DIR = "./outputs"


@dataclass(frozen=True)
class OutputDirs:
    """The resolved output locations of this run (a trial's own subdirectory during tuning)."""

    job_dir: str
    model_dir: str
    checkpoint_dir: str
    tensorboard_dir: str


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts]) if base not in ("", "/") else "/" + "/".join(parts)


def _has_trial(path: str, trial: str) -> bool:
    """Whether the platform already put the trial id in the path (Vertex tuning does: .../<trial>/model)."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    return any(p in (trial, f"trial{trial}", f"trial-{trial}", f"trial_{trial}") for p in parts)


def _vertex_base(model_dir: str | None) -> str | None:
    """``<base>`` of a Vertex-style ``<base>/model`` directory, else None."""
    if model_dir is None:
        return None
    head, _, leaf = model_dir.rstrip("/").rpartition("/")
    return head if leaf == "model" and head else None


def resolve_outputs(
    *,
    job_dir: str | None,
    model_dir: str | None,
    checkpoint_dir: str | None,
    tensorboard_dir: str | None,
    trial: str | None,
) -> OutputDirs:
    """Explicit directories win; the rest derive from the job dir; a trial gets its own subdirectory.

    Without a job dir, Vertex's layout (``<base>/model``, ``<base>/checkpoints``) makes ``<base>`` the job
    dir, so what the job writes besides (failure records) lands beside the model, not in the container.
    """
    base = job_dir or _vertex_base(model_dir) or DEFAULT_JOB_DIR
    if trial is not None and not _has_trial(base, trial):
        base = _join(base, trial)

    def pick(explicit: str | None, leaf: str) -> str:
        if explicit is None:
            return _join(base, leaf)
        if trial is not None and not _has_trial(explicit, trial):
            return _join(explicit, trial)
        return explicit.rstrip("/") or "/"

    return OutputDirs(
        job_dir=base,
        model_dir=pick(model_dir, "model"),
        checkpoint_dir=pick(checkpoint_dir, "checkpoints"),
        tensorboard_dir=pick(tensorboard_dir, "logs"),
    )


FUSE_ROOT = "/gcs"


def fuse_mounted(bucket: str) -> bool:
    """Whether Vertex's Cloud Storage FUSE mount serves ``bucket`` (all of /gcs, or /gcs/<bucket>)."""
    return os.path.ismount(FUSE_ROOT) or os.path.ismount(f"{FUSE_ROOT}/{bucket}")


def local_path(uri: str) -> str:
    """Where the process writes ``uri``: ``gs://b/p`` is Vertex's FUSE mount ``/gcs/b/p`` when it is there.

    Without the mount, a ``gs://`` URL (like any other fsspec URL) stays a URL: ``storage.path`` makes it
    a ``RemotePath`` written through gcsfs.
    """
    if uri.startswith("gs://"):
        bucket = uri[len("gs://"):].split("/", 1)[0]
        if fuse_mounted(bucket):
            return f"{FUSE_ROOT}/" + uri[len("gs://"):]
    return uri


def how_written(uri: str) -> str:
    """One phrase for the first log lines: the FUSE mount, gcsfs, or the local file system."""
    chosen = local_path(uri)
    if chosen != uri:
        return f"{uri} through the Cloud Storage FUSE mount at {chosen}"
    return storage.description(uri)


def missing_fuse_mount(path: str | Path) -> str | None:
    """For a path under /gcs with no Cloud Storage FUSE mount there, the bucket's ``gs://`` name; else None.

    Without the mount, /gcs/... is a plain directory of the container: whatever is written there is lost
    with it, so nothing may be created there.
    """
    parts = Path(path).parts
    if len(parts) < 3 or parts[:2] != ("/", FUSE_ROOT.strip("/")):
        return None
    bucket = Path(FUSE_ROOT) / parts[2]
    if os.path.ismount(FUSE_ROOT) or os.path.ismount(bucket):
        return None
    return f"gs://{parts[2]}"


def not_writable(path: Path, exc: OSError) -> OutputError:
    """A directory this user may not create or write: one line naming it, the user, and who owns the parent."""
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        info = parent.stat()
        owner = f"{parent} belongs to uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}"
    except OSError:
        owner = f"{parent} cannot be read"
    reason = (exc.strerror or "not writable").lower()
    return OutputError(errors.OUTPUT_NOT_WRITABLE, f"cannot write {path}: {reason} for uid {os.getuid()} ({owner}); "
                       "mount a volume this user can write, or pick another directory")


def ensure_writable(directories: Iterable[str | Path | storage.RemotePath]) -> None:
    """Create each output directory and prove it takes a file (before any training time is spent).

    A remote URL gets one probe object written and deleted (credentials and bucket checked; a failure is
    ``storage.StorageError``). A /gcs path without its FUSE mount, or a directory this user may not write,
    is an output failure (73) naming the directory, and so is one that cannot be created or written (permission,
    a read-only file system, a file or ``/proc`` in its path); a full disk is the file system's own, which the
    failure funnel classifies; nothing is left behind.
    """
    for directory in directories:
        if storage.is_remote(local_path(str(directory))):
            _probe_remote(storage.RemotePath(local_path(str(directory))))
            continue
        path = Path(local_path(str(directory)))
        bucket = missing_fuse_mount(path)
        if bucket is not None:
            raise OutputError(errors.OUTPUT_NOT_WRITABLE, f"{path}: no Cloud Storage FUSE mount at {FUSE_ROOT} for "
                              f"{bucket} (Vertex AI mounts one; elsewhere mount the bucket at {FUSE_ROOT}/"
                              f"{bucket[len('gs://'):]} or write to a local directory)")
        probe = path / f".write-probe-{os.getpid()}"
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"ok")
        except OSError as exc:  # not ours to create or write (a full disk is the file system's own: disk_full)
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR):
                raise
            raise not_writable(path, exc) from None
        finally:
            probe.unlink(missing_ok=True)


def _probe_remote(root: storage.RemotePath) -> None:
    """Write and delete one object under ``root``: the credentials and the bucket work (else ``StorageError``)."""
    probe = root / f".write-probe-{os.getpid()}"
    probe.write_bytes(b"ok")
    probe.unlink(missing_ok=True)
