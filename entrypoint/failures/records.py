"""Failure records: one typed record per failing process, where it is written and how the root cause is read.

A record is one JSON object under ``<job dir>/failures/`` (docs/OUTPUTS.md has the schema), written whole
(one object on a store), or under the node's temp dir when the job dir cannot take it (its name starting with
the job dir's digest, so a node reads its own job's records there and no other's). Supervisors and the chief
read the records written since they started, minus those of an attempt the job recovered from (``current``: a
replica restarted since); ``root_cause`` names the earliest failure that is not a consequence of another (a
peer's crash shows up on the others as ``peer_lost``). Records are built and redacted by ``failures``; this
module only stores, reads and orders them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from entrypoint import errors
from entrypoint.errors import TrainerError, is_retryable
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.locations import local_path, missing_fuse_mount
from entrypoint.outputs.storage import Location, StorageError

FAILURES_DIR = "failures"
FALLBACK_DIR = "trainer-failures"  # under the node's temp dir: the records the job dir could not take
SCHEMA_VERSION = 1
# A last line is at most this long: a long message (a value's repr, a very long name) is cut in its middle
# (``clip``); the record keeps the whole message.
LAST_LINE_CHARS = 400
_MIN_MESSAGE_CHARS = 120  # what a message keeps however long the line's own words (replica, host) are
_CUT = " [...] "
_CLOCK_SKEW = 2.0  # seconds: a peer's record written just before our start still belongs to this run


@dataclass(frozen=True)
class FailureRecord:
    """One process's failure: who (replica, rank, host, pid), what (class, exit code, message), when.

    ``reported_by`` is set on a verdict a survivor wrote for a silent peer (it names the witness); such
    a record names the culprit even though its class (``peer_lost``, ``hang``) is otherwise a consequence.
    In JSON the class is written ``class``, with ``retryable`` beside the exit code.
    """

    replica: str
    rank: int | None
    host: str
    failure_class: str
    exit_code: int
    message: str
    pid: int | None = None
    step: int | None = None
    traceback: str = ""
    time: float = 0.0
    time_utc: str = ""
    reported_by: str | None = None
    phase: str | None = None  # what a hooks loop was doing (its hang watchdog's phase), when it knew
    schema_version: int = SCHEMA_VERSION

    @property
    def retryable(self) -> bool:
        """Whether a restart can help (its exit code is 128 or above)."""
        return is_retryable(self.exit_code)

    @property
    def consequence(self) -> bool:
        """A failure another one may have caused (a lost peer, a hang), unless it is a verdict naming the culprit."""
        return self.failure_class in errors.CONSEQUENCES and not self.reported_by

    def stamped(self) -> FailureRecord:
        """This record, happening now."""
        now = time.time()
        return replace(self, time=now, time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))

    def noted(self, note: str) -> FailureRecord:
        """This record with ``note`` added to its message (why no restart followed, say)."""
        return replace(self, message=f"{self.message}; {note}") if note else self

    def last_line(self) -> str:
        """The one line a failing job ends with, at most ``LAST_LINE_CHARS`` long (the message is clipped)."""
        rank = "" if self.rank is None else f", rank {self.rank}"
        kind = "retryable" if self.retryable else "permanent"
        head = f"entrypoint: error: {self.failure_class} on {self.replica}{rank}, host {self.host}: "
        tail = f" (exit {self.exit_code}, {kind})"
        return head + clip(self.message, LAST_LINE_CHARS - len(head) - len(tail)) + tail

    def to_json(self) -> dict[str, Any]:
        """The record as written (``class`` and ``retryable`` spelled out; no ``reported_by`` or ``phase`` unless
        set)."""
        data = asdict(self)
        data["class"] = data.pop("failure_class")
        data["retryable"] = self.retryable
        for optional in ("reported_by", "phase"):
            if data[optional] is None:
                del data[optional]
        return data

    @classmethod
    def from_json(cls, data: Any) -> FailureRecord | None:
        """The record in ``data`` (as written by any replica); None when it is not one."""
        if not isinstance(data, dict):
            return None
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["failure_class"] = data.get("class")
        try:
            record = cls(**values)
            if not isinstance(record.failure_class, str) or not isinstance(record.replica, str):
                return None
            return replace(record, exit_code=int(record.exit_code), time=float(record.time))
        except (TypeError, ValueError):
            return None


def clip(message: str, limit: int) -> str:
    """``message`` on one line, cut in its middle to at most ``limit`` characters (never fewer than 120 kept):
    its start and its end (an exception's type and its last words, a note) stay."""
    line = " ".join(message.split())
    limit = max(limit, _MIN_MESSAGE_CHARS)
    if len(line) <= limit:
        return line
    keep = limit - len(_CUT)
    front = keep * 2 // 3
    return line[:front] + _CUT + line[len(line) - (keep - front):]


def error_line(message: str) -> str:
    """A command's one-line error (``describe``, ``doctor``, ``local``, ``job``: no record), capped like a last line."""
    head = "entrypoint: error: "
    return head + clip(message, LAST_LINE_CHARS - len(head))


def record_dir(job_dir: str) -> Location:
    """Where every replica of the job writes its failure records (a prefix on an object store)."""
    return storage.path(local_path(job_dir)) / FAILURES_DIR


def fallback_dir() -> Path:
    """Where this node's records go when the job dir cannot take them (read-only, full, unreachable)."""
    return Path(tempfile.gettempdir()) / FALLBACK_DIR


def _job_mark(job_dir: str) -> str:
    """What a record's name in the temp dir starts with: the job dir's digest (the temp dir is the node's)."""
    return hashlib.sha256(job_dir.encode()).hexdigest()[:12] + "-"


def store_record(job_dir: str, record: FailureRecord) -> Location | None:
    """Write ``record`` under the job's ``failures/`` (else the node's temp dir); its path, None if neither took it."""
    rank = "node" if record.rank is None else f"rank{record.rank}"
    name = f"{time.time_ns()}-{record.replica}-{rank}-{record.pid}.json"
    text = json.dumps(record.to_json(), indent=2, sort_keys=True)
    failed = ""
    places: tuple[tuple[Location, str], ...] = ((record_dir(job_dir), name),
                                                (fallback_dir(), _job_mark(job_dir) + name))
    for index, (directory, name) in enumerate(places):
        try:
            if index == 0:
                # Not into a job dir another job took over: the lease's fence, as for a commit (a worker naming its
                # lost peer after its chief stopped on the takeover would write into the other job's failures/).
                checkpoints.fenced()
            if isinstance(directory, Path) and missing_fuse_mount(directory) is not None:
                raise OSError(errno.ENOENT, "no Cloud Storage FUSE mount there")  # never create /gcs/... locally
            if isinstance(directory, storage.RemotePath) and directory.unreachable():
                raise OSError(errno.EHOSTUNREACH, "the store was unreachable moments ago")
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text)  # one object on a store: whole or absent
        except (OSError, StorageError, TrainerError) as exc:  # read-only, full, unreachable: the node's temp dir
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
            failed = f"could not write the failure record to {directory} ({reason})"
            continue
        if failed:
            print(f"entrypoint: {failed}; it went to {directory / name} instead", file=sys.stderr)
        return directory / name
    print(f"entrypoint: {failed}, nor to the temp dir: this failure has no record", file=sys.stderr)
    return None


def record_names(job_dir: str | None) -> frozenset[str]:
    """The names of the job's failure records now, its temp dir's too (a supervisor's "before I started")."""
    return frozenset(str(p) for p in _record_paths(job_dir))


def _record_paths(job_dir: str | None, private: Sequence[str] = ()) -> list[Location]:
    """The job dir's records, this job's in the node's temp dir, and every one in ``private``."""
    paths = [] if job_dir is None else _listed(record_dir(job_dir))
    if job_dir is not None:
        paths += [p for p in _listed(fallback_dir()) if p.name.startswith(_job_mark(job_dir))]
    for place in private:
        paths += _listed(Path(place))
    return paths


def _listed(place: Location) -> list[Location]:
    if isinstance(place, storage.RemotePath) and place.unreachable():
        return []
    try:
        return sorted(place.glob("*.json"), key=str)
    except (OSError, StorageError, TrainerError):
        return []


def read_records(job_dir: str | None, since: float, before: frozenset[str] = frozenset(),
                 private: Sequence[str] = ()) -> list[FailureRecord]:
    """Every failure record of the job written since ``since`` (minus a little clock skew), oldest first: in the
    job dir, this job's in the node's temp dir (where the job dir could not take them), and every one in the
    directories of ``private`` (only this job writes there: ``local``'s replicas' own temp dirs); none of
    ``before`` (the records that were there already when the reader started, whatever their time says)."""
    found = []
    paths = [str(p) for p in _record_paths(job_dir, private) if str(p) not in before]
    for name in paths:
        try:
            record = FailureRecord.from_json(json.loads(storage.path(name).read_text()))
        except (OSError, ValueError, StorageError, TrainerError):
            continue
        if record is not None and record.time >= since - _CLOCK_SKEW:
            found.append(record)
    return sorted(found, key=lambda r: r.time)


def current(records: list[FailureRecord], starts: Mapping[str, float]) -> list[FailureRecord]:
    """The records of the job's current attempt: none about a replica written before its latest start
    (``starts``: replica name -> wall time), since the platform restarted it: the job recovered from that failure.

    A replica's records of this attempt are written by its own processes (or on their behalf by a supervisor on
    the same host) after it started, so no clock skew is allowed here.
    """
    return [r for r in records if r.time >= starts.get(r.replica, r.time)]


def root_cause(records: list[FailureRecord]) -> FailureRecord | None:
    """The earliest failure that is not a consequence of another (a lost peer, a hang), else the earliest.

    A survivor's verdict about a peer that stopped responding (``reported_by``) names the culprit: it
    comes before every consequence, after what the culprit (or its supervisor) recorded itself.
    """
    for record in records:
        if not record.consequence and not record.reported_by:
            return record
    for record in records:
        if record.reported_by:
            return record
    return records[0] if records else None
