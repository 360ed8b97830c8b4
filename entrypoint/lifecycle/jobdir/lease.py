"""Whose job dir this is: a lease that a live job renews, that a dead one cannot leave stuck.

Two jobs in one job dir would mix silently: the second resumes from the first's checkpoints, commits into them
and exports over its model. So the chief holds ``<job dir>/job.lease`` (one object: whole or absent, on a disk
and on ``gs://`` through the storage seam) while it runs, renewing it every ``RENEW`` seconds from a thread, and
removes it when it ends. Every write of the lease is conditional (``conditional.create_exclusive``,
``conditional.replace_if``: a generation precondition on Cloud Storage, a hard link or a lock on a disk), so of two
chiefs starting, taking over or renewing at once exactly one wins, without waiting to see who wrote last.

A chief that finds the lease held judges its holder by the holder's pid only where that pid means the same
process as its own pids do: the same host name, the same pid namespace and the same boot. Then a holder

- that is this very process, or gone (its pid no longer runs, is a zombie, or runs another program), is taken
  over at once (``local``'s in-place restarts, a crashed job's rerun);
- that is alive is refused at once.

Any other holder (another host; a container of this host with its own pid namespace, whose pids this one cannot
see; the same job's previous attempt on another VM) is alive while it renews: a lease last written ``STALE``
seconds ago or more is taken over at once; a younger one is watched until it is that old, renewed meanwhile
means a live job (refused), not renewed means its holder is gone, and the lease is taken over with a warning.

The refusal is one configuration error naming the job dir and the holder (exit 2: a retry would meet it again).
A holder that finds at a renewal that another job took the lease over (its own renewals did not reach the store
for ``STALE`` seconds, or a second job with the same identity) is *displaced*: ``on_lost`` is called once (the
runner stops the job, ``runner.py``), and ``check`` raises from then on (checkpoint commits are fenced with it).
A lease found emptied or damaged (content that names no holder) was taken by no job: the holder writes it again,
with a warning. A renewal that fails (a store down, a job dir made read-only) is a warning, once, and the job goes
on; a second job on this host is still refused (its holder is alive), one of another host may take the dir over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.outputs import conditional, storage
from entrypoint.outputs.conditional import Versioned
from entrypoint.outputs.locations import local_path
from entrypoint.outputs.storage import Location, StorageError
from entrypoint.periodic import Periodic

log = logging.getLogger("entrypoint")
LEASE = "job.lease"
RENEW = 5.0  # seconds between renewals (an object store takes about one write of an object per second)
STALE = 3 * RENEW  # a lease not renewed for this long has no live holder
_POLL = 0.5  # while watching another host's holder: how often its lease is read
_FIELDS = ("token", "job", "host", "pid", "started", "since", "renewals", "pidns", "boot")


def pid_namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]``), "" where unknown."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def boot_id() -> str:
    """This boot of the machine (Linux's random boot id), "" where unknown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Holder:
    """Who holds a job dir: the job (its cluster and trial, when it has one), the process (its pid meaning what it
    means in its pid namespace, on that boot of that host), how often it renewed."""

    token: str
    job: str | None
    host: str
    pid: int
    started: int  # the process's start time in clock ticks since boot (tells a reused pid apart), 0 if unknown
    since: float
    renewals: int = 0
    pidns: str = ""  # its pid namespace, "" if unknown (a lease of an older version: judged as another host's)
    boot: str = ""  # its host's boot id, "" if unknown

    def __str__(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on host {self.host}, since {when}"

    def text(self) -> bytes:
        """The lease's content."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """The holder in a lease's content; None when it is none (empty: an ``O_EXCL`` create still writing)."""
        try:
            found: Any = json.loads(data)
            return cls(**{k: found[k] for k in _FIELDS if k in found})
        except (ValueError, TypeError, KeyError):
            return None

    @classmethod
    def read(cls, path: Location) -> Holder | None:
        """The holder written at ``path``; None when there is none (or it is unreadable)."""
        try:
            found = conditional.read_versioned(path)
        except (OSError, StorageError, ConfigError):
            return None
        return None if found is None else cls.parse(found.data)

    def write(self, path: Location) -> None:
        """This holder at ``path``, whole, unconditionally (tests stand in for other holders with it)."""
        if isinstance(path, Path):
            temporary = path.with_name(f".{path.name}.{self.token}")
            temporary.write_bytes(self.text())
            os.replace(temporary, path)
        else:
            path.write_bytes(self.text())

    def same_pids(self, other: Holder) -> bool:
        """Whether this holder's pid means the same process as ``other``'s pids do (one host, pid namespace and
        boot, all known)."""
        return (self.host, self.pidns, self.boot) == (other.host, other.pidns, other.boot) and \
            bool(self.pidns) and bool(self.boot)


def _stat(pid: int) -> list[str]:
    """A process's /proc stat fields after its name (state first), [] when unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2:].split()
    except (OSError, ValueError):
        return []


def start_ticks(pid: int) -> int:
    """A process's start time (clock ticks since boot, /proc), 0 when unknown."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


def _gone(holder: Holder) -> bool:
    """Whether the holder's process, in this pid namespace, no longer runs: its pid gone, a zombie nobody reaped
    yet, or reused by another process."""
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    fields = _stat(holder.pid)
    if fields and fields[0] in ("Z", "X"):
        return True
    return bool(holder.started) and start_ticks(holder.pid) != holder.started


def taken_over(job_dir: str, holder: Holder) -> ConfigError:
    """The error of a job whose job dir another job took over while it ran."""
    return ConfigError("--job-dir", f"{job_dir} was taken over by another job ({holder}) while this job ran: this "
                       "job stopped without writing there again; give each job its own --job-dir")


class JobLease:
    """This job's hold on its job dir (``acquire``, renewed from a thread, ``release``).

    ``on_lost(holder)`` is called once, from the renewing thread, when another job took the lease over."""

    def __init__(self, job_dir: str, job: str | None, host: str | None = None,
                 on_lost: Callable[[Holder], None] | None = None) -> None:
        self.job_dir = job_dir
        self.path = storage.path(local_path(job_dir)) / LEASE
        self.me = Holder(uuid.uuid4().hex, job, host or socket.gethostname(), os.getpid(), start_ticks(os.getpid()),
                         time.time(), pidns=pid_namespace(), boot=boot_id())
        self.on_lost = on_lost
        self.lost: Holder | None = None  # who took the job dir over, once one did
        self._version = ""
        self._failing: str | None = None  # why the last renewal failed (said once, and once when renewals work again)
        # release waits for a renewal in flight (else it could rewrite the lease just after), however short the period
        self._renewals = Periodic("job-dir-lease", self._renew, RENEW, join=max(RENEW, 5.0))

    def __enter__(self) -> JobLease:
        return self.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def acquire(self) -> JobLease:
        """Hold the job dir, or raise ConfigError naming the live job that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            version = conditional.create_exclusive(self.path, self.me.text())
            if version is not None:
                break
            found = conditional.read_versioned(self.path)
            if found is None:
                continue  # released meanwhile: create it again
            current = Holder.parse(found.data)
            if current is None and time.time() - found.written < STALE:
                time.sleep(0.05)  # an O_EXCL create still writing its content (a file system without hard links)
                continue
            if current is not None and not self._may_take(current, found):
                raise self._refusal(current)
            version = conditional.replace_if(self.path, self.me.text(), found.version)
            if version is not None:
                break
            # another job took it (or renewed it) between the read and the write: judge the new holder
        self._version = version
        self._renewals.start()
        return self

    def _may_take(self, current: Holder, found: Versioned) -> bool:
        if current.same_pids(self.me):
            if (current.pid, current.started) == (self.me.pid, self.me.started):
                return True  # this very process
            gone = _gone(current)
            if gone:
                log.info("job dir %s: its last holder (%s) is gone; taking it", self.job_dir, current)
            return gone
        where = "another host" if current.host != self.me.host else "another pid namespace of this host"
        age = time.time() - found.written
        if age < STALE:
            wait = STALE - max(age, 0.0)
            log.info("job dir %s is leased to %s (%s), renewed %.0f s ago: watching up to %.0f s whether that job "
                     "still renews its lease", self.job_dir, current, where, max(age, 0.0), wait)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))
                now = conditional.read_versioned(self.path)
                if now is None:
                    return True  # released meanwhile
                if now.version != found.version:
                    return False  # renewed (or taken by yet another job): alive
        same = " (an earlier attempt of this job)" if self.me.job is not None and current.job == self.me.job else ""
        log.warning("job dir %s: its lease (%s%s) was not renewed for %g s: its job is gone; taking the job dir over",
                    self.job_dir, current, same, STALE)
        return True

    def _refusal(self, holder: Holder) -> ConfigError:
        same = (" with this job's own identity (the same cluster and trial: one job started twice?)"
                if self.me.job is not None and holder.job == self.me.job else "")
        return ConfigError("--job-dir", f"{self.job_dir} is in use by another live job{same} ({holder}, which renews "
                           f"its lease {LEASE}): give this job its own --job-dir, or stop the other one first")

    def _renew(self) -> bool:
        """One renewal, from the thread; False once this job was displaced."""
        try:
            if not self._renew_once():
                return False
        except (OSError, StorageError) as exc:  # a store down, a job dir made read-only: renewed when back
            if self._failing is None:
                log.warning("job dir %s: its lease %s could not be renewed (%s: %s); training goes on, but "
                            "another host's job may take the job dir over once the lease is %g s old",
                            self.job_dir, LEASE, type(exc).__name__, exc, STALE)
            self._failing = str(exc)
            return True
        if self._failing is not None:
            log.info("job dir %s: its lease %s is renewed again", self.job_dir, LEASE)
            self._failing = None
        return True

    def _renew_once(self) -> bool:
        """One renewal; False once this job was displaced (``on_lost`` called)."""
        renewed = replace(self.me, renewals=self.me.renewals + 1)
        version = conditional.replace_if(self.path, renewed.text(), self._version)
        if version is not None:
            self.me, self._version = renewed, version
            return True
        found = conditional.read_versioned(self.path)
        current = None if found is None else Holder.parse(found.data)
        if found is not None and current is not None and current.token == self.me.token:
            self._version = found.version  # ours still (its metadata changed): renewed next time
            return True
        if found is not None and current is None:  # emptied or damaged: no job's holder, so no other job took it
            version = conditional.replace_if(self.path, self.me.text(), found.version)
            if version is not None:
                log.warning("job dir %s: its lease %s was emptied or damaged (%d bytes that name no job): written "
                            "again for this job", self.job_dir, LEASE, len(found.data))
                self._version = version
            return True  # or someone wrote it meanwhile: judged at the next renewal
        if found is None:  # removed under us (by hand): this job holds it again, unless another did first
            version = conditional.create_exclusive(self.path, self.me.text())
            if version is not None:
                self._version = version
                return True
            current = Holder.read(self.path)
        if current is None:
            return True  # an unreadable lease still: judged at the next renewal
        self._displaced(current)
        return False

    def _displaced(self, holder: Holder) -> None:
        self.lost = holder
        log.warning("job dir %s: another job (%s) took it over (this job's lease went unrenewed for %g s, or a second "
                    "job with this job's identity took it)", self.job_dir, self.lost, STALE)
        if self.on_lost is not None:
            self.on_lost(self.lost)

    def check(self) -> None:
        """Raise the error of a displaced job if another job holds the job dir now (read from the lease itself, not
        only what the last renewal saw)."""
        if self.lost is None and self._version and not _unreachable(self.path):
            current = Holder.read(self.path)
            if current is not None and current.token != self.me.token:
                self.lost = current
        if self.lost is not None:
            raise taken_over(self.job_dir, self.lost)

    def release(self) -> None:
        """Stop renewing; remove the lease if it is still this job's (the next job takes the dir at once)."""
        self._renewals.stop()
        if self.lost is None and self._version and not _unreachable(self.path):
            with contextlib.suppress(OSError, StorageError):
                conditional.remove_if(self.path, self._version)


def _unreachable(path: Location) -> bool:
    """The lease's store already failed this process (a job ending because its bucket went away): asking it again
    would only add the client's retries, a minute or more, to the job's end; the lease then goes stale."""
    return isinstance(path, storage.RemotePath) and path.unreachable()


def held_by_another_job(job_dir: str, job: str | None, token: str | None) -> Holder | None:
    """The holder of ``job_dir`` when it is not this job's (another token than the chief's ``token``, where this
    process knows it; else another job identity than ``job``); None when the dir is this job's or nobody's."""
    path = storage.path(local_path(job_dir)) / LEASE
    if _unreachable(path):
        return None  # unknown; the failure that found the store down is recorded off it anyway
    current = Holder.read(path)
    if current is None:
        return None
    if token:
        return None if current.token == token else current
    return current if job is not None and current.job is not None and current.job != job else None


def in_use(job_dir: str) -> ConfigError | None:
    """The refusal a chief starting now would meet on ``job_dir`` (a live job holds it), judged as ``acquire`` judges
    (a holder of another host watched for its renewal), None when it would take it; nothing is written."""
    probe = JobLease(job_dir, None)
    try:
        found = conditional.read_versioned(probe.path)
        current = None if found is None else Holder.parse(found.data)
        if found is None or current is None or probe._may_take(current, found):
            return None
    except (OSError, StorageError, ConfigError):
        return None  # the chief's own acquire decides
    return probe._refusal(current)
