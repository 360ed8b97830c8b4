"""The job ledger: what every attempt of a job did, appended by the processes that did it (docs/goodput.md).

One file per writing process under ``<job dir>/ledger/``, one JSON record per line, read back together as one
ledger (``read``). A node's ``run`` process writes its attempt's ``start`` and ``end``; the chief's training
process writes the phases it went through, its training progress (aggregated: one ``progress`` record per
flush, never one per step), its checkpoints, restores and in-place recoveries. Each record carries the attempt
it belongs to (``TRAINER_ATTEMPT``, set by the node for its training processes), the replica and the rank.

Writes go through the storage seam. On a disk each record is one ``write`` of a whole line to a file opened
for appending, so a process SIGKILLed at any moment leaves whole lines and at most one torn last line, which
``read`` skips with a warning. An object store has no append: the writer keeps its file's lines and replaces
the object with all of them, from a background thread, at most every ``REMOTE_EVERY`` seconds and at
``flush`` (a replaced object is never torn; a SIGKILL loses the records since the last upload).

Nothing the user passed is written here: records hold times, steps, phase names, classes and the failure's
last line, which is redacted like every last line.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.storage import Location, StorageError
from entrypoint.periodic import Periodic

log = logging.getLogger("entrypoint")

LEDGER_DIR = "ledger"
SCHEMA_VERSION = 1
REMOTE_EVERY = 30.0  # seconds between uploads of a writer's file to an object store
CLOSE_WAIT = 30.0  # seconds ``close`` waits for an upload in flight, at most
SUFFIX = ".jsonl"


def process_start_time(pid: int | None = None) -> float:
    """When process ``pid`` (this one by default) started, as a Unix time; now when it cannot be read."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", "rb") as stat:
            ticks = int(stat.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as uptime:  # /proc/stat's btime is whole seconds: off by up to one
            boot = time.time() - float(uptime.read().split()[0])
        return min(boot + ticks / os.sysconf("SC_CLK_TCK"), time.time())
    except (OSError, ValueError, IndexError):
        return time.time()


def attempt_id(replica: str, started: float, pid: int | None = None) -> str:
    """A node's attempt: its replica, its host, its process and when it started (unique across restarts)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started)) + f".{int(started * 1000) % 1000:03d}"
    return f"{replica}@{socket.gethostname()}:{pid or os.getpid()}:{stamp}"


class Ledger:
    """One process's records in the job's ledger. ``add`` never raises: the ledger must not stop a training."""

    def __init__(self, job_dir: str, attempt: str, replica: str, rank: int | None) -> None:
        self.attempt, self.replica, self.rank = attempt, replica, rank
        safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in f"{attempt}.{os.getpid()}")
        self.location: Location = storage.path(job_dir) / LEDGER_DIR / f"{safe}{SUFFIX}"
        self.remote = storage.is_remote(str(job_dir))
        self._lines: list[str] = []
        self._file: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._uploading = threading.Lock()
        self._dirty = threading.Event()
        self._uploader = Periodic("ledger-upload", self._upload_due, REMOTE_EVERY, join=CLOSE_WAIT)
        self._uploaded = 0
        self._failed = False
        self._fenced = False

    def add(self, kind: str, **fields: Any) -> None:
        """Append one record (``t`` defaults to now)."""
        record = {"v": SCHEMA_VERSION, "kind": kind, "t": round(float(fields.pop("t", time.time())), 3),
                  "attempt": self.attempt, "replica": self.replica, "rank": self.rank, "pid": os.getpid(), **fields}
        line = json.dumps(record, sort_keys=True, allow_nan=False, default=str) + "\n"
        if self._fenced:
            return
        try:
            checkpoints.fenced()  # a job displaced from its job dir writes nothing more there
        except Exception:
            self._fenced = True
            return
        try:
            if self.remote:
                self._queue(line)
            else:
                self._append(line)
        except (OSError, StorageError, ValueError) as exc:
            self._warn(exc)

    def _append(self, line: str) -> None:
        with self._lock:
            if self._file is None:
                assert not isinstance(self.location, storage.RemotePath)
                self.location.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.location, "ab", buffering=0)  # noqa: SIM115 (held until close)
            self._file.write(line.encode())  # one write of one whole line

    def _queue(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)
        self._dirty.set()
        if not self._uploader.started:
            self._uploader.start()

    def _upload_due(self) -> None:
        if self._dirty.is_set():  # records came since the last upload
            self._upload()

    def _upload(self) -> None:
        with self._uploading:  # one upload at a time: an older copy never lands after a newer one
            with self._lock:
                self._dirty.clear()
                lines, count = "".join(self._lines), len(self._lines)
            if count <= self._uploaded:
                return
            if isinstance(self.location, storage.RemotePath) and self.location.unreachable():
                return  # the store failed this process already: asking again only adds the client's retries
            try:
                self.location.write_bytes(lines.encode())
                self._uploaded = count
            except (OSError, StorageError) as exc:
                self._warn(exc)

    def flush(self) -> None:
        """Make every record so far durable where it can be (an object store: one upload now)."""
        if self.remote:
            self._upload()

    def close(self) -> None:
        self._uploader.stop()  # an upload in flight finishes first (CLOSE_WAIT at most)
        self.flush()
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _warn(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            log.warning("the job ledger %s could not be written (%s: %s); training goes on, goodput will miss "
                        "this process's records", self.location, type(exc).__name__, exc)


def shared(job_dir: str) -> bool:
    """Whether this replica sees the chief's ledger (the chief wrote its start before the start-up barrier): a job
    dir on a shared store or mount. Otherwise each replica's job dir is its own disk, and only the chief's counts."""
    try:
        return (storage.path(job_dir) / LEDGER_DIR).is_dir()
    except (OSError, StorageError):
        return False


@dataclass
class Read:
    """The ledger as read: every whole record, oldest first, and what could not be read."""

    records: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files: int = 0


def parse(name: str, text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """A writer's file: its whole records; a torn last line (a writer killed mid-write) is skipped with a warning,
    a bad line elsewhere too."""
    records, warnings = [], []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = number == len(lines)  # no newline after it: the writer was stopped in the middle of it
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "kind" not in record or isinstance(record.get("t"), bool) or \
                    not isinstance(record.get("t"), (int, float)):
                raise ValueError("not a ledger record")
        except ValueError:
            why = "torn: its writer stopped while writing it" if last else "not a ledger record"
            warnings.append(f"{name}: line {number} skipped ({why})")
            continue
        if last:
            warnings.append(f"{name}: line {number} has no end of line (its writer stopped after writing it); kept")
        records.append(record)
    return records, warnings


def read(job_dir: str) -> Read:
    """Every writer's records under ``<job dir>/ledger/``, ordered by time."""
    folder = storage.path(job_dir) / LEDGER_DIR
    found = Read()
    if not folder.is_dir():
        return found
    entries: list[Location] = sorted(folder.iterdir(), key=str)
    for entry in entries:
        if not entry.name.endswith(SUFFIX):
            continue
        found.files += 1
        try:
            text = entry.read_bytes().decode("utf-8", errors="replace")
        except (OSError, StorageError) as exc:
            found.warnings.append(f"{entry.name}: unreadable ({type(exc).__name__}: {exc})")
            continue
        records, warnings = parse(entry.name, text)
        found.records.extend(records)
        found.warnings.extend(warnings)
    found.records.sort(key=lambda r: (float(r["t"]), str(r.get("kind"))))
    return found


def of_kind(records: Iterable[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") in kinds]
