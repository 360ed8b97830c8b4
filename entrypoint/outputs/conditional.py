"""Conditional writes through the storage seam: of two writers of one file (the job dir's lease), one wins.

``create_exclusive`` writes only where nothing is; ``replace_if`` and ``remove_if`` only while the file is still at
the version read (``read_versioned``). On Cloud Storage the store checks it: one request with a generation
precondition (``ifGenerationMatch``; ``0``: the object must not exist), answered 412 when another writer won.
On a disk: a complete temp file hard-linked into place (``link`` fails where the name exists), and a compare and
rename under an ``flock`` of the directory. Where the file system has neither (a FUSE mount), and on fsspec stores
other than Cloud Storage, the check and the write are two steps: a writer that lost finds it out at its next check.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from entrypoint.outputs.storage import Location, RemotePath


@dataclass(frozen=True)
class Versioned:
    """A file's (object's) content, its version (an object's generation; a local file's content digest) and the
    time of its last write (seconds since the epoch, as the file system or the store recorded it)."""

    data: bytes
    version: str
    written: float


def create_exclusive(target: Location, data: bytes) -> str | None:
    """Write ``data`` at ``target`` only if nothing is there, in one step: the new version, None if something was.

    A local file appears with its whole content (a hard link of a complete temp file); where the file system has
    no hard links, an ``O_EXCL`` create, whose content follows a moment later (a reader may see it empty).
    """
    if isinstance(target, RemotePath):
        return _write_if(target, data, "0")
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    temporary.write_bytes(data)
    try:
        os.link(temporary, target)
    except FileExistsError:
        return None
    except OSError:  # no hard links here
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    finally:
        temporary.unlink(missing_ok=True)
    return _digest(data)


def read_versioned(target: Location) -> Versioned | None:
    """``target``'s content, version and last write; None when absent."""
    if isinstance(target, RemotePath):
        return _read_remote(target)
    try:
        with target.open("rb") as handle:
            data, written = handle.read(), os.fstat(handle.fileno()).st_mtime
    except FileNotFoundError:
        return None
    return Versioned(data, _digest(data), written)


def replace_if(target: Location, data: bytes, version: str) -> str | None:
    """Replace ``target`` with ``data`` only if it still is at ``version``: the new version, None if it is not
    (changed or removed by another writer)."""
    if isinstance(target, RemotePath):
        return _write_if(target, data, version)
    with _locked(target.parent):
        current = read_versioned(target)
        if current is None or current.version != version:
            return None
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
        temporary.write_bytes(data)
        os.replace(temporary, target)
    return _digest(data)


def remove_if(target: Location, version: str) -> bool:
    """Delete ``target`` only if it still is at ``version``; whether it was."""
    if isinstance(target, RemotePath):
        return _unlink_if(target, version)
    with _locked(target.parent):
        current = read_versioned(target)
        if current is None or current.version != version:
            return False
        target.unlink(missing_ok=True)
    return True


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` for the block (nothing where the file system offers none)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _generations(target: RemotePath) -> bool:
    """Whether the store checks a write's precondition itself (Cloud Storage's generations)."""
    return target.protocol in ("gs", "gcs")


def _key(target: RemotePath) -> str:
    return str(target).split("://", 1)[1]


def _read_remote(target: RemotePath) -> Versioned | None:
    """The object with its version and last write; the content read is that generation's, even if the object is
    replaced meanwhile."""
    for _ in range(5):
        try:
            info = target._call("info", _key(target))
            if _generations(target):
                version = str(info["generation"])
                data: bytes = target._call("cat_file", _key(target), generation=version)
            else:
                data = target.read_bytes()
                version = _digest(data)
        except FileNotFoundError:  # absent, or replaced between the two requests (its old generation gone)
            if not target.exists():
                return None
            continue
        written = info.get("mtime")
        return Versioned(data, version, written.timestamp() if hasattr(written, "timestamp") else 0.0)
    return None


def _write_if(target: RemotePath, data: bytes, version: str) -> str | None:
    """Write the object only if its version is still ``version`` ("0": only if absent); the new version, None when
    the precondition failed. On Cloud Storage: gcsfs's own upload request (``core.simple_upload``), with the
    precondition it offers only as "0" (``mode="create"``)."""
    if not _generations(target):
        current = _read_remote(target)
        if (current is None) != (version == "0") or (current is not None and current.version != version):
            return None
        target.write_bytes(data)
        return _digest(data)
    bucket, _, key = _key(target).partition("/")
    metadata = json.dumps({"name": key})
    body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{metadata}\n--==0==\n"
            "Content-Type: application/octet-stream\n\n").encode() + data + b"\n--==0==--"
    try:
        out = target._call("call", "POST", f"{target.checked_fs()._location}/upload/storage/v1/b/{quote(bucket)}/o",
                           uploadType="multipart", headers={"Content-Type": 'multipart/related; boundary="==0=="'},
                           data=body, json_out=True, ifGenerationMatch=version)
    except FileExistsError:  # 412 Precondition Failed
        return None
    return str(out["generation"])


def _unlink_if(target: RemotePath, version: str) -> bool:
    try:
        if not _generations(target):
            current = _read_remote(target)
            if current is None or current.version != version:
                return False
            target.unlink()
            return True
        bucket, _, key = _key(target).partition("/")
        target._call("call", "DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=version)
    except (FileNotFoundError, FileExistsError):
        return False
    return True
