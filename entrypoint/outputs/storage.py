"""The storage seam: local paths stay ``pathlib.Path``; ``gs://`` and other fsspec URLs become ``RemotePath``.

``RemotePath`` offers the part of ``Path``'s interface the writers use (``/``, ``name``, ``parent``,
``open``, ``read_bytes``, ``write_text``, ``exists``, ``is_dir``, ``iterdir``, ``rglob``, ``glob``,
``stat().st_size``, ``unlink``; ``mkdir`` is a no-op: object stores have no directories), so the
checkpoint, summary and failure-record code is written once. Object stores have no atomic rename: a
single object appears whole or not at all, so what must be atomic (a commit marker, a summary, a
failure record) is one object written last. Where two writers must not both win (the job dir's lease),
``conditional.py`` writes only if nothing is there, or the version read is still there.

Credentials: Application Default Credentials as ``google.auth.default()`` reads them; with
``STORAGE_EMULATOR_HOST`` set, gcsfs talks to that server anonymously (its documented emulator
setting). Every failure of the store (network, credentials, a missing bucket) is raised as
``StorageError`` naming the URL; ``failures.classify`` decides its class. No credential is ever logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import credentials_file_named, storage_emulator
from entrypoint.errors import ConfigError

log = logging.getLogger("entrypoint.storage")
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_filesystems: dict[str, Any] = {}
# Upload chunk of a written object: google-cloud-storage's default (100 MiB, a multiple of 256 KiB). gcsfs's own
# 5 MiB means 20x the requests for a checkpoint (and a pure-Python emulator slows down with each chunk).
UPLOAD_CHUNK = 100 << 20
_unreachable: set[str] = set()  # buckets this process could not reach (after gcsfs's own retries)
if storage_emulator():
    # gcsfs's default (experimental) file system asks the storage control API (gRPC) for each bucket's layout;
    # an emulator has no such API, so every call would retry it. Off for every gcsfs user of this process
    # (TensorBoard's writer included) unless the user chose otherwise.
    os.environ.setdefault(ev.GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT, "false")
logging.getLogger("gcsfs").setLevel(logging.WARNING)  # not its import-time INFO line in our log


class StorageError(Exception):
    """A remote store failed (unreachable, credentials missing or denied, no such bucket): ``classify`` decides.

    ``key_file_named``: GOOGLE_APPLICATION_CREDENTIALS named a key file when the credentials were looked up."""

    def __init__(self, url: str, cause: BaseException, key_file_named: bool = False) -> None:
        self.url, self.cause, self.key_file_named = url, cause, key_file_named
        super().__init__(f"{url}: {type(cause).__name__}: {' '.join(str(cause).split())[:300]}")

    @property
    def bucket(self) -> str:
        """``scheme://bucket`` of the URL."""
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"


def scheme(uri: str | os.PathLike[str]) -> str | None:
    """The URL scheme of ``uri`` (``gs``, ``s3``, ``memory``...), None for a local path (``file://`` too)."""
    match = _URL.match(str(uri))
    if match is None or match.group(1).lower() == "file":
        return None
    return match.group(1).lower()


def is_remote(uri: str | os.PathLike[str]) -> bool:
    """Whether ``uri`` names an object store reached through fsspec rather than the local file system."""
    return scheme(uri) is not None


def filesystem(protocol: str) -> Any:
    """The process's fsspec file system for ``protocol`` (gcsfs for ``gs``), listings never cached."""
    if protocol not in _filesystems:
        if protocol in ("gs", "gcs"):
            # gcsfs's JSON-API file system, not its default experimental gRPC extension: that one asks the
            # storage control API for every bucket's layout (an emulator has none: retries on every call).
            from gcsfs.core import GCSFileSystem

            emulator = storage_emulator()
            _filesystems[protocol] = GCSFileSystem(token=_gcs_token(), endpoint_url=emulator,
                                                   use_listings_cache=False, skip_instance_cache=True)
        else:
            import fsspec

            _filesystems[protocol] = fsspec.filesystem(protocol, use_listings_cache=False)
    return _filesystems[protocol]


def _gcs_token() -> Any:
    """Anonymous against ``STORAGE_EMULATOR_HOST``, else Application Default Credentials (raised when missing)."""
    if storage_emulator():
        return "anon"
    import google.auth

    credentials, _project = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_write"])
    return credentials


def description(uri: str) -> str:
    """How ``uri`` is written, for the first log lines (never a credential)."""
    if not is_remote(uri):
        return f"{uri} (local file system)"
    if scheme(uri) in ("gs", "gcs"):
        emulator = storage_emulator()
        how = f"the GCS emulator at {emulator}" if emulator else "Application Default Credentials"
        return f"{uri} (Cloud Storage through gcsfs, {how})"
    return f"{uri} (fsspec {scheme(uri)})"


@dataclass(frozen=True)
class _Stat:
    st_size: int


class RemotePath:
    """An object (or prefix) in an fsspec store, with the subset of ``pathlib.Path`` the writers use."""

    def __init__(self, uri: str) -> None:
        protocol = scheme(uri)
        if protocol is None:
            raise ValueError(f"not a remote URL: {uri}")
        self.protocol = protocol
        head, _, rest = uri.partition("://")
        self._key = rest.strip("/")  # bucket/prefix/..., no scheme
        self._scheme = head

    # ---- naming -------------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{self._scheme}://{self._key}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: RemotePath) -> bool:
        return str(self) < str(other)

    def __truediv__(self, part: str) -> RemotePath:
        return RemotePath(f"{self}/{str(part).strip('/')}")

    @property
    def name(self) -> str:
        """The last component."""
        return self._key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemotePath:
        """The prefix above (the bucket is its own parent)."""
        head, sep, _ = self._key.rpartition("/")
        return RemotePath(f"{self._scheme}://{head}") if sep else self

    def relative_to(self, other: RemotePath) -> str:
        """This path's key below ``other`` (``a/b``)."""
        prefix = other._key + "/"
        if not self._key.startswith(prefix):
            raise ValueError(f"{self} is not under {other}")
        return self._key[len(prefix):]

    @property
    def fs(self) -> Any:
        """The fsspec file system."""
        return filesystem(self.protocol)

    def checked_fs(self) -> Any:
        """The fsspec file system, its failures to start classified: no file system for the scheme in this image is a
        ConfigError, missing or unusable credentials a StorageError."""
        try:
            return self.fs  # made on first use: credentials are looked up here
        except ImportError as exc:  # an image without gcsfs: not the store's fault, nothing a retry fixes
            raise ConfigError(str(self), f"no fsspec file system for {self.protocol}:// in this image "
                              f"({type(exc).__name__}: {exc}); write to a local directory or a FUSE mount") from None
        except Exception as exc:  # no or unusable credentials
            raise StorageError(str(self), exc, credentials_file_named()) from exc

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fs = self.checked_fs()
        with failing_as_store(self):
            return getattr(fs, method)(*args, **kwargs)

    def unreachable(self) -> bool:
        """Whether this process already failed to reach the bucket (so a failure record goes elsewhere at once)."""
        return StorageError(str(self), Exception()).bucket in _unreachable

    # ---- queries ------------------------------------------------------------------------------
    def exists(self) -> bool:
        """An object or a non-empty prefix."""
        return bool(self._call("exists", self._key))

    def is_file(self) -> bool:
        """An object."""
        return bool(self._call("isfile", self._key))

    def is_dir(self) -> bool:
        """A non-empty prefix (or a bucket)."""
        return bool(self._call("isdir", self._key))

    def stat(self) -> _Stat:
        """The object's size."""
        return _Stat(int(self._call("size", self._key)))

    def iterdir(self) -> Iterator[RemotePath]:
        """Objects and prefixes directly below (nothing for a missing prefix)."""
        try:
            names = self._call("ls", self._key, detail=False, refresh=True)
        except FileNotFoundError:
            return iter(())
        base = self._key.strip("/") + "/"  # fsspec's memory file system lists names with a leading "/"
        return iter(sorted(RemotePath(f"{self._scheme}://{n.strip('/')}") for n in names
                           if n.strip("/").startswith(base) and n.strip("/") != self._key.strip("/")))

    def rglob(self, pattern: str) -> Iterator[RemotePath]:
        """Every object below (``pattern`` must be ``*``)."""
        if pattern != "*":
            raise ValueError("RemotePath.rglob supports '*' only")
        try:
            names = self._call("find", self._key)
        except FileNotFoundError:
            return iter(())
        return iter(sorted(RemotePath(f"{self._scheme}://{n}") for n in names))

    def glob(self, pattern: str) -> Iterator[RemotePath]:
        """Objects directly below whose name matches ``pattern`` (``*.json``)."""
        import fnmatch

        return iter([p for p in self.iterdir() if fnmatch.fnmatch(p.name, pattern)])

    # ---- data ---------------------------------------------------------------------------------
    def open(self, mode: str = "rb") -> IO[bytes]:
        """A binary file: written objects appear only once closed (a resumable upload finalized)."""
        if "b" not in mode:
            raise ValueError("RemotePath.open is binary only")
        options = {"block_size": UPLOAD_CHUNK} if "w" in mode else {}
        handle: IO[bytes] = self._call("open", self._key, mode, **options)
        return handle

    def read_bytes(self) -> bytes:
        """The whole object."""
        data: bytes = self._call("cat_file", self._key)
        return data

    def read_text(self) -> str:
        """The whole object as UTF-8."""
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> int:
        """One object, written in one request (it appears whole or not at all)."""
        self._call("pipe_file", self._key, data)
        return len(data)

    def write_text(self, text: str) -> int:
        """One UTF-8 object, written in one request."""
        return self.write_bytes(text.encode())

    def unlink(self, missing_ok: bool = False) -> None:
        """Delete the object."""
        try:
            self._call("rm_file", self._key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing: prefixes exist once an object is under them."""

Location = Path | RemotePath


@contextlib.contextmanager
def failing_as_store(target: RemotePath) -> Iterator[None]:
    """Whatever fails in the block (but a missing object) is the store's: ``StorageError`` naming ``target``.

    For the calls ``RemotePath`` makes, and for streaming through a file it opened (an upload is sent while
    written and finalized at close, outside any of its calls)."""
    try:
        yield
    except (FileNotFoundError, FileExistsError, StorageError):  # FileExistsError: a precondition failed (412)
        raise
    except Exception as exc:
        error = StorageError(str(target), exc)
        if isinstance(exc, (OSError, TimeoutError)):  # aiohttp's connection errors are OSErrors
            _unreachable.add(error.bucket)
        raise error from exc


def store_errors(where: Location | str) -> contextlib.AbstractContextManager[None]:
    """``failing_as_store`` when ``where`` is on an object store, else nothing: for a library that writes through
    fsspec itself (TensorBoard's event writer), whose connection errors would otherwise read as the user's code."""
    location = path(where)
    return failing_as_store(location) if isinstance(location, RemotePath) else contextlib.nullcontext()


def path(uri: str | os.PathLike[str] | RemotePath) -> Location:
    """``RemotePath`` for an fsspec URL, else ``pathlib.Path`` (``file://`` stripped)."""
    if isinstance(uri, (Path, RemotePath)):
        return uri
    text = str(uri)
    if is_remote(text):
        return RemotePath(text)
    return Path(text[len("file://"):] if text.startswith("file://") else text)


def relative(child: Location, root: Location) -> str:
    """``child``'s name below ``root`` (``a/b``)."""
    if isinstance(child, RemotePath) and isinstance(root, RemotePath):
        return child.relative_to(root)
    return str(Path(str(child)).relative_to(Path(str(root))))


def tensorboard_through_fsspec() -> None:
    """Make TensorBoard's event writer use its own file layer (fsspec: gcsfs for gs://), never TensorFlow's.

    Where TensorFlow is installed (the Horovod CPU image), TensorBoard would write gs:// through TensorFlow's
    GCS file system, which has its endpoint compiled in and ignores ``STORAGE_EMULATOR_HOST``, and would
    import TensorFlow into a PyTorch process. TensorBoard's own switch (tensorboard/compat/__init__.py) is the
    presence of a ``tensorboard.compat.notf`` module (its ``no_tensorflow`` build target); an empty one is registered.
    """
    import sys
    import types

    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


def upload_tree(source: Path, target: RemotePath, last: tuple[str, ...] = ()) -> list[str]:
    """Copy every file under the local directory ``source`` to objects under ``target``; the names (relative to
    ``source``) in ``last`` go last, in that order (a reader that finds them finds everything else whole).
    Returns the names copied."""
    names = [str(p.relative_to(source)) for p in sorted(source.rglob("*")) if p.is_file()]
    ordered = [n for n in names if n not in last] + [n for n in last if n in names]
    for name in ordered:
        with failing_as_store(target / name), (source / name).open("rb") as src, (target / name).open("wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
    return ordered


def download_tree(source: RemotePath, target: Path) -> list[str]:
    """Copy every object under ``source`` into the local directory ``target``, each file dated as its object was
    (its last write); returns the names copied (none for a missing prefix)."""
    try:
        found: dict[str, dict[str, Any]] = source._call("find", source._key, detail=True)
    except FileNotFoundError:
        return []
    names = []
    for key, info in sorted(found.items()):
        name = key.rstrip("/")[len(source._key) + 1:]
        if not name or key.endswith("/") or not key.startswith(source._key + "/"):
            continue
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        with failing_as_store(source / name), (source / name).open("rb") as src, destination.open("wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        written = info.get("mtime")
        if written is not None and hasattr(written, "timestamp"):
            os.utime(destination, (written.timestamp(), written.timestamp()))
        names.append(name)
    return names


def rmtree(target: Location) -> None:
    """Delete a directory (or prefix) and everything below; a missing one is fine."""
    if isinstance(target, RemotePath):
        with contextlib.suppress(FileNotFoundError):
            target._call("rm", target._key, recursive=True)
        return
    shutil.rmtree(target, ignore_errors=True)
