"""Every failure classified in one place: an exception (``classify``) or a bare exit status (``code_class``).

``classify`` is the only place an exception becomes a failure class and an exit code; ``code_class`` reads a
bare exit status (a child that left no record, a script's own exit code) with the same table (``errors.py``).

A lost peer is told by where the failure happened and its type, never by words alone: a type a framework
declares as its own lost peer (``Framework.peer_errors``: torch's ``DistNetworkError``, Horovod's
``HorovodInternalError``, TensorFlow's ``UnavailableError``...), or a runtime or connection error raised where a
collective or the job's store runs (``Framework.peer_modules``: ``torch.distributed``, ``horovod``...) that
names a connection or a timeout. This module knows no framework: ``planning.registry`` adds the registered
frameworks' signs (``add_peer_source``), so a new framework's lost peer is retryable once it declares them.
"""

from __future__ import annotations

import errno
import os
import shutil
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from entrypoint import errors
from entrypoint.errors import FailureClass, TrainerError
from entrypoint.outputs import storage
from entrypoint.outputs.locations import local_path
from entrypoint.outputs.storage import StorageError

_MAX_MESSAGE = 8000  # a record keeps the whole message (the last line clips it: records.clip), bar a pathological one
_MAX_TRACEBACK_LINES = 60
_MAX_TRACEBACK_CHARS = 8000
# What a collective or a store says when a peer is gone or stuck (gloo, nccl, the OS; a framework adds its own words,
# ``PeerSigns.messages``): read only of an error raised where a collective or the store runs (a framework's
# ``peer_modules``), never of the user's own.
_PEER_MESSAGES = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "connection refused",
    "timed out waiting", "timeout waiting", "wait timeout", "socket timeout", "collective operation timeout",
    "communicator was aborted", "remote process exited", "ncclremoteerror", "ncclsystemerror",
    "gloo context", "read error", "connection closed",
    "caused pair closure",  # gloo: "Application timeout caused pair closure" (a frozen peer, gloo's own timeout)
)
# What NCCL says when it refuses this node's configuration, not a peer's state: ``ncclInvalidUsage`` at the
# communicator's start (seen on an H200: a stray ``NCCL_NET=gIB`` on a node without gIB, "Failed to initialize any
# NET plugin"; also two ranks on one GPU). Read, like a lost peer's words, only of an error out of a collective.
_NCCL_REFUSED = "ncclinvalidusage"


@dataclass(frozen=True)
class PeerSigns:
    """What a framework's lost peer looks like: its exception types, and where its collectives and store run.

    ``errors``: dotted names (``torch.distributed.DistNetworkError``); a type matches by its name and its top
    package (``torch``), wherever the package defines it. ``modules``: module prefixes (``torch.distributed``).
    ``messages``: what its own errors say when a peer is gone, beside the transports' words (lower case).
    """

    errors: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()


_sources: list[Callable[[], Iterable[PeerSigns]]] = []


def add_peer_source(source: Callable[[], Iterable[PeerSigns]]) -> None:
    """Consult ``source()`` (the registered frameworks' signs, read when a failure is classified) from now on."""
    if source not in _sources:
        _sources.append(source)


def peer_signs() -> list[PeerSigns]:
    """Every registered sign of a lost peer (none until a framework registry adds its own)."""
    return [signs for source in _sources for signs in source()]


@dataclass(frozen=True)
class Failure:
    """A classified failure: its class, exit code and one-line message (not yet redacted)."""

    cls: FailureClass
    message: str
    traceback: str = ""

    @property
    def exit_code(self) -> int:
        """The exit code this failure ends the process with."""
        return int(self.cls.exit_code)


def classify(exc: BaseException, outputs: Iterable[str] = (), hooks: bool = False) -> Failure:
    """The failure class and exit code of ``exc`` (the one place this is decided)."""
    name = type(exc).__name__
    if isinstance(exc, (TrainerError, errors.Interrupted)):
        return Failure(exc.failure, str(exc))
    if isinstance(exc, StorageError):
        return _storage_failure(exc)
    if isinstance(exc, KeyboardInterrupt):
        return Failure(errors.signal_class(2), "interrupted (SIGINT)")
    if isinstance(exc, SystemExit):
        if hooks:
            return Failure(errors.USER_CODE, f"the user's code called sys.exit({exc.code!r}) before training finished")
        code = errors.sys_exit_code(exc)
        return Failure(FailureClass("user_code", code, "the user's code exited"), f"exited with {code}")
    if isinstance(exc, OSError) and (found := _os_failure(exc, outputs)) is not None:
        return found
    text = str(exc)
    if _NCCL_REFUSED in text.lower() and _from_collective(exc):
        return Failure(errors.CONFIG, _nccl_refused(text))
    if _is_peer_failure(exc, text):
        return Failure(errors.PEER_LOST, f"a peer is gone or timed out ({name}: {_first_line(text)})")
    if "inline_container" in text and _nearly_full(outputs):
        return Failure(errors.DISK_FULL, f"no space left where outputs go ({', '.join(outputs)})")
    return Failure(errors.USER_CODE, f"{name}: {_first_line(text)}" if text else name, _traceback(exc))


def is_peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is classified as a lost peer (the class survivors-keep-training recovers from)."""
    return classify(exc).cls.name == errors.PEER_LOST.name


def first_cause(failed: BaseException, *also: BaseException | None) -> BaseException:
    """Of the failures one process met together, the one it ends with (the rule of the records' root cause):
    ``failed``, unless it is a consequence of another (a lost peer, a hang) and one of ``also`` is not (its own
    checkpoint write, failed on the full disk that a peer met first and left the group on)."""
    if classify(failed).cls.name not in errors.CONSEQUENCES:
        return failed
    return next((e for e in also if e is not None and classify(e).cls.name not in errors.CONSEQUENCES), failed)


_CREDENTIAL_TYPES = ("DefaultCredentialsError", "RefreshError", "TransportError")
_SET_CREDENTIALS = ("set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or run `gcloud auth "
                    "application-default login`; on Vertex AI the job's service account is used")


def _storage_failure(exc: StorageError) -> Failure:
    """A store's failure: credentials missing or denied and a missing bucket are permanent output failures
    (one line naming the bucket and what to set); anything else (unreachable, 5xx, timeouts) is retryable."""
    cause, code = exc.cause, getattr(exc.cause, "code", None)
    kind = type(cause).__name__
    if kind == "DefaultCredentialsError" and (exc.key_file_named or cause.__cause__ is not None):
        # found, but unusable (a malformed or missing key file): google-auth's own words say what is wrong with it
        where = "the key file GOOGLE_APPLICATION_CREDENTIALS names" if exc.key_file_named else "the credentials found"
        said = cause.args[0] if cause.args and isinstance(cause.args[0], str) else str(cause)  # (message, cause)
        return Failure(errors.OUTPUT_NOT_WRITABLE, f"{exc.bucket}: {where} cannot be used (google-auth: "
                       f"{_first_line(said)[:300]}); fix it, or {_SET_CREDENTIALS}")
    if kind == "DefaultCredentialsError":
        return Failure(errors.OUTPUT_NOT_WRITABLE, f"{exc.bucket}: no Application Default Credentials found "
                       f"({_SET_CREDENTIALS})")
    if kind == "RefreshError" or code == 401:
        return Failure(errors.OUTPUT_NOT_WRITABLE, f"{exc.bucket}: the Application Default Credentials were "
                       f"rejected (expired or revoked?): {_SET_CREDENTIALS}")
    if code == 403:
        return Failure(errors.OUTPUT_NOT_WRITABLE, f"{exc.bucket}: access denied to the Application Default "
                       "Credentials' account (grant it roles/storage.objectAdmin on the bucket, or "
                       f"{_SET_CREDENTIALS})")
    if code == 404 or isinstance(cause, FileNotFoundError):
        return Failure(errors.OUTPUT_NOT_WRITABLE, f"{exc.bucket}: no such bucket (create it, or fix the URL): "
                       f"{exc.url}")
    return Failure(errors.STORAGE_UNAVAILABLE, f"{exc.bucket} unreachable or failing writing {exc.url} "
                   f"({kind}: {_first_line(str(cause))[:200]}); retry the job")


def _os_failure(exc: OSError, outputs: Iterable[str]) -> Failure | None:
    where = f" at {exc.filename}" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return Failure(errors.DISK_FULL, f"no space left on device{where}")
    if exc.errno == errno.EROFS:
        return Failure(errors.OUTPUT_NOT_WRITABLE, f"read-only file system{where}")
    if exc.errno in (errno.EACCES, errno.EPERM) and exc.filename and _under(str(exc.filename), outputs):
        return Failure(errors.OUTPUT_NOT_WRITABLE, f"permission denied{where} for uid {os.getuid()}")
    return None


def _nccl_refused(text: str) -> str:
    """One line: what NCCL refused (its "Last error", else its first line), the NCCL variables set here (names)."""
    said = " ".join(text.split())
    reason = said.partition("Last error:")[2].strip() or _first_line(text)
    names = sorted(name for name in os.environ if name.startswith("NCCL_"))
    return (f"NCCL refused this node's configuration (ncclInvalidUsage: {reason[:300]}); NCCL variables set here: "
            f"{', '.join(names) or 'none'}: fix or drop them (run's default --fabric auto removes a stray "
            "NCCL_NET=gIB on a node without gIB), and start one process per GPU")


def _declared_peer_error(exc: BaseException, signs: list[PeerSigns]) -> bool:
    types = {(name.split(".", 1)[0], name.rsplit(".", 1)[-1]) for s in signs for name in s.errors}
    return any((c.__module__.split(".", 1)[0], c.__name__) in types for c in type(exc).__mro__)


def _from_collective(exc: BaseException) -> bool:
    """A framework's declared collective error type, or an error raised where a collective or the store runs."""
    signs = peer_signs()
    modules = [m for s in signs for m in s.modules]
    return _declared_peer_error(exc, signs) or _within(type(exc).__module__, modules) or (
        isinstance(exc, (RuntimeError, OSError)) and _within(raised_in(exc), modules))


def _is_peer_failure(exc: BaseException, text: str) -> bool:
    """A framework's own lost-peer type, or a runtime / OS error out of a collective or the store (or an error of
    a type defined there) naming a connection or a timeout (the user's own ``RuntimeError("timed out waiting")``
    is the user's)."""
    signs = peer_signs()
    if _declared_peer_error(exc, signs):
        return True
    modules = [m for s in signs for m in s.modules]
    # the framework's own error types (TensorFlow's ClosureInputError wrapping a refused connection) count as
    # raised where its collectives run, wherever their last frame is
    own = _within(type(exc).__module__, modules)
    if not own and not isinstance(exc, (RuntimeError, OSError)):
        return False
    inside = own or _within(raised_in(exc), modules)
    lowered = text.lower()
    messages = _PEER_MESSAGES + tuple(m for s in signs for m in s.messages)
    return inside and any(m in lowered for m in messages)


def _within(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def raised_in(exc: BaseException) -> str:
    """The module whose code raised ``exc`` (its innermost Python frame; a C++ call counts as its caller's)."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", ""))


def _under(path: str, outputs: Iterable[str]) -> bool:
    """``path`` is an output directory, inside one, or a parent one had to be created in."""
    resolved = Path(os.path.abspath(path))
    for out in outputs:
        output = Path(os.path.abspath(local_path(out)))
        if resolved == output or output in resolved.parents or resolved in output.parents:
            return True
    return False


def _nearly_full(outputs: Iterable[str]) -> bool:
    for out in outputs:
        if storage.is_remote(local_path(out)):
            continue  # an object store is never full
        probe = Path(local_path(out))
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            if shutil.disk_usage(probe).free < (1 << 20):
                return True
        except OSError:
            continue
    return False


def _first_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 3] + "..."


def _traceback(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(exc)).splitlines()[-_MAX_TRACEBACK_LINES:]
    return "\n".join(lines)[-_MAX_TRACEBACK_CHARS:]


def code_class(code: int) -> FailureClass:
    """The class of a bare exit status (a child that left no record, a script's own exit code)."""
    known = {c.exit_code: c for c in (errors.CONFIG, errors.OUTPUT_NOT_WRITABLE, errors.DISK_FULL, errors.PEER_LOST,
                                      errors.NONFINITE_LOSS, errors.HOST_UNRESOLVABLE, errors.START_DEADLINE,
                                      errors.STORAGE_UNAVAILABLE)}
    if code in known:
        return known[code]
    if 128 < code < 128 + 65:
        return errors.signal_class(code - 128)
    return FailureClass("user_code", code, "the user's code exited non-zero")


def exit_failure(code: int, message: str | None = None) -> Failure:
    """The failure of a bare exit status: its class, and ``message`` (else what the status says)."""
    cls = code_class(code)
    return Failure(cls, message or (cls.meaning if code > 128 else f"exited with {code}"))
