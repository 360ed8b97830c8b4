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
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from entrypoint import errors, logs, storage
from entrypoint.errors import ExitCode, FailureClass, TrainerError, is_retryable
from entrypoint.outputs import local_path, missing_fuse_mount
from entrypoint.storage import Location, StorageError

log = logging.getLogger("entrypoint")
FAILURES_DIR = "failures"
SCHEMA_VERSION = 1
_MAX_MESSAGE = 400
_MAX_TRACEBACK_LINES = 60
_MAX_TRACEBACK_CHARS = 8000
_CLOCK_SKEW = 2.0  # seconds: a peer's record written just before our start still belongs to this run
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
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
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


# ---- records ---------------------------------------------------------------------------------
def record_dir(job_dir: str) -> Location:
    """Where every replica of the job writes its failure records (a prefix on an object store)."""
    return storage.path(local_path(job_dir)) / FAILURES_DIR


def write_record(ctx: Context, failure: Failure, **extra: Any) -> Location | None:
    """One JSON record of this process's failure (best effort: a failing disk must not hide the failure)."""
    if ctx.job_dir is None:
        return None
    return store_record(ctx.job_dir, render_record(ctx, failure, **extra))


def render_record(ctx: Context, failure: Failure, **extra: Any) -> dict[str, Any]:
    """This process's failure as a record, stamped now (redacted; not yet written)."""
    return stamped({
        "schema_version": SCHEMA_VERSION, "replica": ctx.replica, "rank": ctx.rank, "host": socket.gethostname(),
        "pid": os.getpid(), "step": ctx.step, "exit_code": failure.exit_code, "class": failure.cls.name,
        "retryable": is_retryable(failure.exit_code), "message": redact(failure.message, ctx.secrets),
        "traceback": redact(failure.traceback, ctx.secrets), **extra,
    })


def stamped(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with the time it happened: now."""
    now = time.time()
    return {**record, "time": now, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}


def store_record(job_dir: str, record: dict[str, Any]) -> Location | None:
    """Write ``record`` under the job's ``failures/`` (else the node's temp dir); its path, None if neither took it."""
    rank = "node" if record.get("rank") is None else f"rank{record['rank']}"
    name = f"{time.time_ns()}-{record['replica']}-{rank}-{record['pid']}.json"
    text = json.dumps(record, indent=2, sort_keys=True)
    failed = ""
    places: tuple[Location, ...] = (record_dir(job_dir), Path(tempfile.gettempdir()) / "trainer-failures")
    for directory in places:
        try:
            if isinstance(directory, Path) and missing_fuse_mount(directory) is not None:
                raise OSError(errno.ENOENT, "no Cloud Storage FUSE mount there")  # never create /gcs/... locally
            if isinstance(directory, storage.RemotePath) and directory.unreachable():
                raise OSError(errno.EHOSTUNREACH, "the store was unreachable moments ago")
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text)  # one object on a store: whole or absent
        except (OSError, StorageError, TrainerError) as exc:  # read-only, full, unreachable: the node's temp dir
            reason = exc.strerror if isinstance(exc, OSError) else classify(exc).message
            failed = f"could not write the failure record to {directory} ({reason})"
            continue
        if failed:
            print(f"entrypoint: {failed}; it went to {directory / name} instead", file=sys.stderr)
        return directory / name
    print(f"entrypoint: {failed}, nor to the temp dir: this failure has no record", file=sys.stderr)
    return None


def read_records(job_dir: str | None, since: float) -> list[dict[str, Any]]:
    """Every failure record written since ``since`` (minus a little clock skew), oldest first."""
    if job_dir is None:
        return []
    found = []
    place = record_dir(job_dir)
    if isinstance(place, storage.RemotePath) and place.unreachable():
        return []
    try:
        paths = sorted(str(p) for p in place.glob("*.json"))
    except (OSError, StorageError, TrainerError):
        return []
    for name in paths:
        try:
            data = json.loads(storage.path(name).read_text())
        except (OSError, ValueError, StorageError, TrainerError):
            continue
        if isinstance(data, dict) and float(data.get("time", 0)) >= since - _CLOCK_SKEW:
            found.append(data)
    return sorted(found, key=lambda r: float(r["time"]))


def root_cause(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest failure that is not a consequence of another (a lost peer, a hang), else the earliest.

    A survivor's verdict about a peer that stopped responding (``reported_by``) names the culprit: it
    comes before every consequence, after what the culprit (or its supervisor) recorded itself.
    """
    for record in records:
        if record.get("class") not in errors.CONSEQUENCES and not record.get("reported_by"):
            return record
    for record in records:
        if record.get("reported_by"):
            return record
    return records[0] if records else None


def record_verdict(ctx: Context, replica: str, rank: int | None, cls: FailureClass, message: str) -> None:
    """Record, on a silent peer's behalf, that it stopped responding (this process is the witness)."""
    witness = ctx.replica if ctx.rank is None else f"{ctx.replica} (rank {ctx.rank})"
    write_record(replace(ctx, replica=replica, rank=rank, step=None), Failure(cls, message), reported_by=witness)


def last_line(record: dict[str, Any]) -> str:
    """The one line a failing job ends with."""
    rank = "" if record.get("rank") is None else f", rank {record['rank']}"
    kind = "retryable" if record.get("retryable") else "permanent"
    return (f"entrypoint: error: {record['class']} on {record['replica']}{rank}, host {record['host']}: "
            f"{record['message']} (exit {record['exit_code']}, {kind})")


def as_record(ctx: Context, failure: Failure) -> dict[str, Any]:
    """This process's failure in record form (for the last line when no record could be written)."""
    return {"replica": ctx.replica, "rank": ctx.rank, "host": socket.gethostname(), "class": failure.cls.name,
            "message": redact(failure.message, ctx.secrets), "exit_code": failure.exit_code,
            "retryable": is_retryable(failure.exit_code)}


def conclude(ctx: Context, own: dict[str, Any]) -> int:
    """Print the job's root cause as the last line (this process's failure unless an earlier one caused it)."""
    cause = own
    if own.get("class") in errors.CONSEQUENCES:
        earlier = root_cause([r for r in read_records(ctx.job_dir, ctx.started)
                             if r.get("pid") != own.get("pid", os.getpid()) or r.get("reported_by")])
        if earlier is not None and (earlier.get("class") not in errors.CONSEQUENCES or earlier.get("reported_by")):
            print(f"entrypoint: {own['replica']} failed with {own['class']} ({own.get('message', '')}) because of "
                  f"an earlier failure", file=sys.stderr)
            cause = earlier
    return announce(ctx, cause)


def announce(ctx: Context, cause: dict[str, Any]) -> int:
    """Print the root cause as the job's last line (and Kubernetes' termination message); its exit code."""
    line = last_line(cause)
    logs.error_line(line)
    if ctx.termination_log:
        _termination_log(line)
    return int(cause["exit_code"])


def _termination_log(line: str) -> None:
    with contextlib.suppress(OSError), open("/dev/termination-log", "w") as f:
        f.write(line + "\n")


def fail(ctx: Context, failure: Failure) -> int:
    """Record this process's failure and report it; returns the exit code to end with."""
    if failure.traceback and failure.cls.name == "user_code":
        print(redact(failure.traceback, ctx.secrets), file=sys.stderr)
    write_record(ctx, failure)
    _torch_error_file(ctx, failure)
    return report(ctx, as_record(ctx, failure))


def report(ctx: Context, own: dict[str, Any]) -> int:
    """End with the last line: the job's root cause in a top-level process, else this process's own failure."""
    if not ctx.top_level:
        logs.error_line(last_line(own))
        return int(own["exit_code"])
    return conclude(ctx, own)


def _torch_error_file(ctx: Context, failure: Failure) -> None:
    """torch elastic's error file (its agent reads it to name the first failure)."""
    if ctx.error_file is None:
        return
    payload = {"message": {"message": f"{failure.cls.name}: {redact(failure.message, ctx.secrets)}",
                           "extraInfo": {"py_callstack": redact(failure.traceback, ctx.secrets),
                                         "timestamp": str(int(time.time()))}}}
    with contextlib.suppress(OSError):
        Path(ctx.error_file).write_text(json.dumps(payload))


def code_class(code: int) -> FailureClass:
    """The class of a bare exit status (a child that left no record, a script's own exit code)."""
    known = {c.exit_code: c for c in (errors.CONFIG, errors.OUTPUT_NOT_WRITABLE, errors.DISK_FULL, errors.PEER_LOST,
                                      errors.HOST_UNRESOLVABLE, errors.START_DEADLINE, errors.STORAGE_UNAVAILABLE)}
    if code in known:
        return known[code]
    if 128 < code < 128 + 65:
        return errors.signal_class(code - 128)
    return FailureClass("user_code", code, "the user's code exited non-zero")


def record_exit(ctx: Context, code: int, message: str) -> None:
    """Record that this process ends with ``code`` without an exception (a script's own exit code)."""
    failure = Failure(code_class(code), message)
    write_record(ctx, failure)
    if not ctx.top_level:
        logs.error_line(last_line(as_record(ctx, failure)))


def conclude_exit(ctx: Context, code: int, who: str | None = None, note: str = "") -> int:
    """A child (or the user's script) ended with ``code``: record it if nobody did, then name the root cause.

    ``who`` names the child when it is not this process (its record is written on its behalf); ``note``
    is added to the last line (why no restart followed, say).
    """
    records = read_records(ctx.job_dir, ctx.started)
    if not records or (who is not None and all(r.get("replica") != who for r in records)):
        cls = code_class(code)  # the child left no record (killed by a signal, or a script's exit code)
        child = replace(ctx, replica=who, rank=None) if who else ctx
        write_record(child, Failure(cls, cls.meaning if code > 128 else f"exited with {code}"))
        records = read_records(ctx.job_dir, ctx.started)
    cause = root_cause(records)
    if cause is None:  # not even a fallback record could be written
        cls = code_class(code)
        cause = as_record(ctx, Failure(cls, cls.meaning))
    if note:
        cause = {**cause, "message": f"{cause['message']}; {note}"}
    return announce(ctx, cause)


_active: Context | None = None


def active() -> Context:
    """The failure context of this process (the one ``guarded`` runs under)."""
    return _active if _active is not None else Context()


def guarded(body: Callable[[], int], ctx: Context) -> int:
    """Run ``body``; turn any failure into a record, a last line and an exit code."""
    global _active
    _active = ctx
    logs.identify(ctx)
    try:
        return body()
    except BaseException as exc:
        failure = classify(exc, ctx.outputs, ctx.hooks)
        if failure.exit_code == ExitCode.OK:
            return ExitCode.OK
        return fail(ctx, failure)
