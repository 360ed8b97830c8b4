"""Failures in one funnel: classify every failure into the exit-code table, record it, name the root cause.

``classify`` is the only place an exception becomes a failure class and an exit code. ``guarded`` wraps
a process's body: on failure it writes a record to ``<job dir>/failures/``, prints the traceback (for the
user's own errors) and ends with one line naming the class, replica, rank, host, message and exit code.
Supervisors and the chief read the records written since they started and name the earliest failure
that is not a consequence of another (a peer's crash shows up on the others as ``peer_lost``).
Nothing printed or recorded carries a secret value (``redact``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import socket
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from entrypoint import errors, logs, storage
from entrypoint.errors import ExitCode, FailureClass, TrainerError
from entrypoint.failure_records import FailureRecord, read_records, root_cause, store_record
from entrypoint.outputs import local_path
from entrypoint.storage import StorageError

log = logging.getLogger("entrypoint")
_MAX_MESSAGE = 400
_MAX_TRACEBACK_LINES = 60
_MAX_TRACEBACK_CHARS = 8000
# Messages of torch.distributed (gloo, nccl), Horovod and the OS that mean a peer is gone or stuck.
_PEER_MESSAGES = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "connection refused",
    "timed out waiting", "timeout waiting", "wait timeout", "socket timeout", "collective operation timeout",
    "communicator was aborted", "remote process exited", "ncclremoteerror", "ncclsystemerror",
    "horovod has been shut down", "gloo context", "read error", "connection closed",
)
_PEER_TYPES = ("DistNetworkError", "DistStoreError", "DistBackendError", "HorovodInternalError",
               "HostsUpdatedInterrupt", "RendezvousTimeoutError", "RendezvousClosedError", "RendezvousConnectionError")
_TF_PEER_TYPES = ("DeadlineExceededError", "UnavailableError", "AbortedError")


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


@dataclass
class Context:
    """Who this process is and where its failures go; filled in as the process learns (plan, rank)."""

    replica: str = "local"
    rank: int | None = None
    job_dir: str | None = None
    outputs: tuple[str, ...] = ()
    secrets: frozenset[str] = frozenset()
    hooks: bool = False  # a SystemExit from the user's code is a failure (the loop must finish)
    top_level: bool = True  # this process prints the job's root-cause line
    error_file: str | None = None  # torch elastic's TORCHELASTIC_ERROR_FILE, when a worker of its agent
    termination_log: bool = False  # Kubernetes: the message also goes to /dev/termination-log
    started: float = field(default_factory=time.time)
    step: int | None = None  # the training step this process reached (the hooks loops keep it current)


def classify(exc: BaseException, outputs: Iterable[str] = (), hooks: bool = False) -> Failure:
    """The failure class and exit code of ``exc`` (the one place this is decided)."""
    name = type(exc).__name__
    if isinstance(exc, TrainerError):
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
    if _is_peer_failure(exc, text):
        return Failure(errors.PEER_LOST, f"a peer is gone or timed out ({name}: {_first_line(text)})")
    if "inline_container" in text and _nearly_full(outputs):
        return Failure(errors.DISK_FULL, f"no space left where outputs go ({', '.join(outputs)})")
    return Failure(errors.USER_CODE, f"{name}: {_first_line(text)}" if text else name, _traceback(exc))


_CREDENTIAL_TYPES = ("DefaultCredentialsError", "RefreshError", "TransportError")
_SET_CREDENTIALS = ("set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or run `gcloud auth "
                    "application-default login`; on Vertex AI the job's service account is used")


def _storage_failure(exc: StorageError) -> Failure:
    """A store's failure: credentials missing or denied and a missing bucket are permanent output failures
    (one line naming the bucket and what to set); anything else (unreachable, 5xx, timeouts) is retryable."""
    cause, code = exc.cause, getattr(exc.cause, "code", None)
    kind = type(cause).__name__
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


def _is_peer_failure(exc: BaseException, text: str) -> bool:
    cls = type(exc)
    if cls.__name__ in _PEER_TYPES or any(c.__name__ in _PEER_TYPES for c in cls.__mro__):
        return True
    if cls.__module__.startswith("tensorflow") and cls.__name__ in _TF_PEER_TYPES:
        return True
    lowered = text.lower()
    return isinstance(exc, (RuntimeError, ConnectionError, TimeoutError)) and any(
        m in lowered for m in _PEER_MESSAGES)


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


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by ``***`` and control characters made visible."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)


# ---- records and the end of a process ------------------------------------------------------------
def make_record(ctx: Context, failure: Failure, reported_by: str | None = None) -> FailureRecord:
    """This process's failure as a record, redacted and stamped now (not yet written)."""
    return FailureRecord(
        replica=ctx.replica, rank=ctx.rank, host=socket.gethostname(), failure_class=failure.cls.name,
        exit_code=failure.exit_code, message=redact(failure.message, ctx.secrets), pid=os.getpid(), step=ctx.step,
        traceback=redact(failure.traceback, ctx.secrets), reported_by=reported_by,
    ).stamped()


def write_record(ctx: Context, failure: Failure, reported_by: str | None = None) -> FailureRecord:
    """Record this process's failure (best effort: a failing disk must not hide the failure); the record."""
    record = make_record(ctx, failure, reported_by)
    if ctx.job_dir is not None:
        store_record(ctx.job_dir, record)
    return record


def record_verdict(ctx: Context, replica: str, rank: int | None, cls: FailureClass, message: str) -> FailureRecord:
    """Record, on a silent peer's behalf, that it stopped responding (this process is the witness)."""
    witness = ctx.replica if ctx.rank is None else f"{ctx.replica} (rank {ctx.rank})"
    return write_record(replace(ctx, replica=replica, rank=rank, step=None), Failure(cls, message),
                        reported_by=witness)


def finish(ctx: Context, own: FailureRecord, *, stored: bool = True, blame: FailureRecord | None = None,
           note: str = "") -> int:
    """End with ``own`` (this process's failure, or the child's a supervisor saw end): the one way out.

    ``own`` is written first unless ``stored``. A worker's last line names its own failure, or ``blame``
    (the silent peer a watchdog waited for). A top-level process names the job's root cause: ``blame``
    when the caller knows it (a supervisor, from the records), else its own failure unless that is a
    consequence (a lost peer, a hang) of an earlier one recorded since it started. ``note`` is added to the
    line (why no restart followed). Returns the exit code to end with: the worker's own, else the cause's.
    """
    if not stored and ctx.job_dir is not None:
        store_record(ctx.job_dir, own)
    cause = blame or own
    if ctx.top_level and cause.consequence:
        earlier = root_cause([r for r in read_records(ctx.job_dir, ctx.started)
                              if r.pid != own.pid or r.reported_by])
        if earlier is not None and not earlier.consequence:
            logs.to_stderr(f"entrypoint: {own.replica} failed with {own.failure_class} ({own.message}) because of "
                           f"an earlier failure")
            cause = earlier
    line = cause.noted(note).last_line()
    logs.error_line(line)
    if ctx.top_level and ctx.termination_log:
        with contextlib.suppress(OSError), open("/dev/termination-log", "w") as f:
            f.write(line + "\n")
    return cause.exit_code if ctx.top_level else own.exit_code


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


def finish_child(ctx: Context, code: int, who: str | None = None, note: str = "") -> int:
    """A supervisor's end: its child (``who``, else this node's launcher) ended with ``code``.

    The child gets a record on its behalf if it left none (killed by a signal, a script's exit code); the
    last line names the root cause among every record written since the supervisor started.
    """
    records = read_records(ctx.job_dir, ctx.started)
    if not records or (who is not None and all(r.replica != who for r in records)):
        written = write_record(replace(ctx, replica=who, rank=None) if who else ctx, exit_failure(code))
        records = read_records(ctx.job_dir, ctx.started) or [written]  # written, or not even a record could be
    cause = root_cause(records)
    assert cause is not None
    return finish(ctx, cause, blame=cause, note=note)


def guarded(body: Callable[[], int], ctx: Context) -> int:
    """Run ``body``; turn any failure into a record, a last line and an exit code."""
    logs.identify(ctx)
    try:
        return body()
    except BaseException as exc:
        failure = classify(exc, ctx.outputs, ctx.hooks)
        if failure.exit_code == ExitCode.OK:
            return ExitCode.OK
        if failure.traceback and failure.cls.name == "user_code":
            logs.to_stderr(redact(failure.traceback, ctx.secrets))
        own = write_record(ctx, failure)
        _torch_error_file(ctx, failure)
        return finish(ctx, own)


def _torch_error_file(ctx: Context, failure: Failure) -> None:
    """torch elastic's error file (its agent reads it to name the first failure)."""
    if ctx.error_file is None:
        return
    payload = {"message": {"message": f"{failure.cls.name}: {redact(failure.message, ctx.secrets)}",
                           "extraInfo": {"py_callstack": redact(failure.traceback, ctx.secrets),
                                         "timestamp": str(int(time.time()))}}}
    with contextlib.suppress(OSError):
        Path(ctx.error_file).write_text(json.dumps(payload))
