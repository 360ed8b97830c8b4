"""Failures in one funnel: record every failure, end the process with one line naming the root cause.

``guarded`` wraps a process's body: on failure it classifies it (``classify.py``), writes a record to
``<job dir>/failures/``, prints the traceback (for the user's own errors) and ends with one line naming the
class, replica, rank, host, message and exit code. Supervisors and the chief read the records written since
they started and name the earliest failure that is not a consequence of another (a peer's crash shows up on
the others as ``peer_lost``). Nothing printed or recorded carries a secret value (``redact``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from entrypoint.errors import ExitCode, FailureClass
from entrypoint.failures.classify import Failure, classify, exit_failure
from entrypoint.failures.records import FailureRecord, clip, current, read_records, root_cause, store_record
from entrypoint.outputs import logs, redaction

log = logging.getLogger("entrypoint")


@dataclass
class FailureContext:
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
    before: frozenset[str] = frozenset()  # records present when this process started: never this run's (local)
    # When ``local`` started the run this replica belongs to: a record written before it (on this same host, so no
    # clock skew) is an earlier run's, never this one's cause; 0 where no supervisor on this host says so.
    run_started: float = 0.0
    step: int | None = None  # the training step this process reached (the hooks loops keep it current)
    phase: str | None = None  # what the hooks loop is doing (its hang watchdog keeps it current)
    # A supervisor's replicas' latest starts (``local``): a record about one from before is an attempt the job
    # recovered from. This process's own replica counts as started when it did.
    starts: Mapping[str, float] = field(default_factory=dict)
    private: tuple[str, ...] = ()  # directories of records only this job writes (``local``: its replicas' temp dirs)
    # The job ledger's end of this node's attempt (``lifecycle/recorder.py``): (exit code, class, last line).
    on_end: Callable[[int, str | None, str | None], None] | None = None


def job_records(ctx: FailureContext) -> list[FailureRecord]:
    """The records of the job's current attempt written since this process started, oldest first: none about a
    replica (this one included) from before its latest start, none from before the run (``run_started``)."""
    records = read_records(ctx.job_dir, ctx.started, ctx.before, ctx.private)
    return current([r for r in records if r.time >= ctx.run_started], {ctx.replica: ctx.started, **ctx.starts})


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value (raw, or escaped as repr() and JSON write it) replaced by ``***``, and
    control characters made visible."""
    text = redaction.hide(text, secrets)
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)


def make_record(ctx: FailureContext, failure: Failure, reported_by: str | None = None) -> FailureRecord:
    """This process's failure as a record, redacted and stamped now (not yet written)."""
    return FailureRecord(
        replica=ctx.replica, rank=ctx.rank, host=socket.gethostname(), failure_class=failure.cls.name,
        exit_code=failure.exit_code, message=redact(failure.message, ctx.secrets), pid=os.getpid(), step=ctx.step,
        traceback=redact(failure.traceback, ctx.secrets), reported_by=reported_by, phase=ctx.phase,
    ).stamped()


def write_record(ctx: FailureContext, failure: Failure, reported_by: str | None = None) -> FailureRecord:
    """Record this process's failure (best effort: a failing disk must not hide the failure); the record."""
    record = make_record(ctx, failure, reported_by)
    if ctx.job_dir is not None:
        store_record(ctx.job_dir, record)
    return record


def own_failure(ctx: FailureContext, replica: str, rank: int | None) -> FailureRecord | None:
    """The failure ``replica``'s process ``rank`` (None: any of its ranks) recorded itself since this process
    started (its root cause where it recorded several), if it did: a peer that ended on a failure of its own."""
    mine = [r for r in job_records(ctx) if r.replica == replica and not r.reported_by
            and (r.rank == rank if rank is not None else r.rank is not None)]
    return root_cause(mine)


def record_verdict(ctx: FailureContext, replica: str, rank: int | None, cls: FailureClass,
                   message: str) -> FailureRecord:
    """Record, on a silent peer's behalf, that it stopped responding (this process is the witness); the verdict.

    A peer that ended on a failure of its own is not a lost peer, whatever says it is gone (its heartbeat stopped, its
    liveness port refuses): its own record is returned and nothing is written, so that record stays the root cause.
    Its record is there by then: a process writes it before it ends (its liveness port closes with it) and a survivor
    watches a heartbeat for seconds."""
    if (own := own_failure(ctx, replica, rank)) is not None:
        return own
    witness = ctx.replica if ctx.rank is None else f"{ctx.replica} (rank {ctx.rank})"
    return write_record(replace(ctx, replica=replica, rank=rank, step=None), Failure(cls, message),
                        reported_by=witness)


def attempts_alike(ctx: FailureContext, failure_class: str, phase: str | None) -> int:
    """How many attempts of this process (its replica and rank) failed as ``failure_class`` while ``phase``, this one
    included, when every earlier one in the job dir did; 1 when this is the first or an earlier one differed."""
    mine = [r for r in read_records(ctx.job_dir, 0.0, private=ctx.private)
            if (r.replica, r.rank) == (ctx.replica, ctx.rank) and not r.reported_by]
    if phase is None or any((r.failure_class, r.phase) != (failure_class, phase) for r in mine):
        return 1
    return len(mine) + 1


def finish(ctx: FailureContext, own: FailureRecord, *, stored: bool = True, blame: FailureRecord | None = None,
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
        earlier = root_cause([r for r in job_records(ctx) if r.pid != own.pid or r.reported_by])
        if earlier is not None and not earlier.consequence:
            logs.to_stderr(f"entrypoint: {own.replica} failed with {own.failure_class} ({clip(own.message, 200)}) "
                           "because of an earlier failure")
            cause = earlier
    line = cause.noted(note).last_line()
    logs.error_line(line)
    if ctx.top_level and ctx.termination_log:
        with contextlib.suppress(OSError), open("/dev/termination-log", "w") as f:
            f.write(line + "\n")
    if ctx.top_level and ctx.on_end is not None:
        ctx.on_end(cause.exit_code, cause.failure_class, line)
    return cause.exit_code if ctx.top_level else own.exit_code


def finish_child(ctx: FailureContext, code: int, who: str | None = None, note: str = "") -> int:
    """A supervisor's end: its child (``who``, else this node's launcher) ended with ``code``.

    The child gets a record on its behalf if it left none (killed by a signal, a script's exit code); the
    last line names the root cause among every record written since the supervisor started.
    """
    records = job_records(ctx)
    if not records or (who is not None and all(r.replica != who for r in records)):
        written = write_record(replace(ctx, replica=who, rank=None) if who else ctx, exit_failure(code))
        records = job_records(ctx) or [written]  # written, or not even a record could be
    cause = root_cause(records)
    assert cause is not None
    return finish(ctx, cause, blame=cause, note=note)


def finish_node(ctx: FailureContext, code: int) -> int:
    """The node's end once its launcher ended with ``code``: the node's own failure names the cause (its processes'
    records since it started, else one for the launcher's exit status), unless that is a consequence (a lost
    peer, a hang): then the earliest failure that is not one, recorded since it started. A failure elsewhere that
    the job recovered from (a peer restarted since) never outranks this node's own end (a SIGTERM: 143).
    """
    own = [r for r in job_records(ctx) if r.replica == ctx.replica and not r.reported_by]
    cause = root_cause(own) or write_record(ctx, exit_failure(code))
    return finish(ctx, cause)


def guarded(body: Callable[[], int], ctx: FailureContext) -> int:
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


def _torch_error_file(ctx: FailureContext, failure: Failure) -> None:
    """torch elastic's error file (its agent reads it to name the first failure)."""
    if ctx.error_file is None:
        return
    payload = {"message": {"message": f"{failure.cls.name}: {redact(failure.message, ctx.secrets)}",
                           "extraInfo": {"py_callstack": redact(failure.traceback, ctx.secrets),
                                         "timestamp": str(int(time.time()))}}}
    with contextlib.suppress(OSError):
        Path(ctx.error_file).write_text(json.dumps(payload))
