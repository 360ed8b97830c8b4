"""Whose job dir this is: a lease that a live job renews, that a dead one cannot leave stuck.

Two jobs in one job dir would mix silently: the second resumes from the first's checkpoints, commits into them
and exports over its model. So the chief holds ``<job dir>/job.lease`` (one object: whole or absent, on a disk
and on ``gs://`` through the storage seam) while it runs, renewing it every ``RENEW`` seconds from a thread, and
removes it when it ends. A chief that finds the lease held:

- by the same job (the platform's restart of it: same cluster, same trial; ``local``'s replica restarts too),
  takes it over at once;
- by a process of this host that is gone (its pid no longer runs, or runs another program), takes it at once;
- by a live process of this host, refuses at once;
- by another host, watches it for ``STALE`` seconds: renewed means a live job (refused), not renewed means its
  holder is gone (a crashed job, a lost VM), and the lease is taken over with a warning.

The refusal is one configuration error naming the job dir and the holder (exit 2: a retry would meet it again).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.outputs import storage
from entrypoint.outputs.locations import local_path
from entrypoint.outputs.storage import Location, StorageError

log = logging.getLogger("entrypoint")
LEASE = "job.lease"
RENEW = 5.0  # seconds between renewals (an object store takes about one write of an object per second)
STALE = 3 * RENEW  # a lease not renewed for this long has no live holder
_POLL = 0.5


@dataclass(frozen=True)
class Holder:
    """Who holds a job dir: the job (its cluster and trial, when it has one), the process, how often renewed."""

    token: str
    job: str | None
    host: str
    pid: int
    started: int  # the process's start time in clock ticks since boot (tells a reused pid apart), 0 if unknown
    since: float
    renewals: int = 0

    def __str__(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on host {self.host}, since {when}"

    @classmethod
    def read(cls, path: Location) -> Holder | None:
        """The holder written at ``path``; None when there is none (or it is unreadable: a torn local write)."""
        try:
            data: Any = json.loads(path.read_text())
            return cls(**{k: data[k] for k in ("token", "job", "host", "pid", "started", "since", "renewals")})
        except (OSError, ValueError, TypeError, KeyError, StorageError):
            return None

    def write(self, path: Location) -> None:
        """This holder at ``path``, whole (a rename on a disk, one object on a store)."""
        text = json.dumps(asdict(self), sort_keys=True)
        if isinstance(path, Path):
            temporary = path.with_name(f".{path.name}.{self.token}")
            temporary.write_text(text)
            os.replace(temporary, path)
        else:
            path.write_text(text)


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
    """Whether the holder's process, on this host, no longer runs: its pid gone, a zombie nobody reaped yet, or
    reused by another process."""
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


class JobLease:
    """This job's hold on its job dir (``acquire``, renewed from a thread, ``release``)."""

    def __init__(self, job_dir: str, job: str | None, host: str | None = None) -> None:
        self.job_dir = job_dir
        self.path = storage.path(local_path(job_dir)) / LEASE
        self.me = Holder(uuid.uuid4().hex, job, host or socket.gethostname(), os.getpid(), start_ticks(os.getpid()),
                         time.time())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> JobLease:
        return self.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def acquire(self) -> JobLease:
        """Hold the job dir, or raise ConfigError naming the live job that holds it."""
        current = Holder.read(self.path)
        if current is not None and not self._may_take(current):
            raise self._refusal(current)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.me.write(self.path)
        time.sleep(_POLL)  # two chiefs starting at once: the last write wins, the other one reads it and gives way
        winner = Holder.read(self.path)
        if winner is not None and winner.token != self.me.token:
            raise self._refusal(winner)
        self._thread = threading.Thread(target=self._renew, name="job-dir-lease", daemon=True)
        self._thread.start()
        return self

    def _may_take(self, current: Holder) -> bool:
        if self.me.job is not None and current.job == self.me.job:
            log.info("job dir %s: taking over from the previous attempt of this job (%s)", self.job_dir, current)
            return True
        if current.host == self.me.host:
            if (current.pid, current.started) == (self.me.pid, self.me.started):
                return True  # this very process
            gone = _gone(current)
            if gone:
                log.info("job dir %s: its last holder (%s) is gone; taking it", self.job_dir, current)
            return gone
        log.info("job dir %s is leased to %s: watching up to %g s whether that job still renews its lease",
                 self.job_dir, current, STALE)
        deadline = time.monotonic() + STALE
        while time.monotonic() < deadline:
            time.sleep(_POLL)
            now = Holder.read(self.path)
            if now is None:
                return True  # released meanwhile
            if now != current:
                return False  # renewed (or taken by yet another job): alive
        log.warning("job dir %s: its lease (%s) was not renewed for %g s: its job is gone; taking the job dir over",
                    self.job_dir, current, STALE)
        return True

    def _refusal(self, holder: Holder) -> ConfigError:
        return ConfigError("--job-dir", f"{self.job_dir} is in use by another live job ({holder}, which renews its "
                           f"lease {LEASE}): give this job its own --job-dir, or stop the other one first")

    def _renew(self) -> None:
        while not self._stop.wait(RENEW):
            with contextlib.suppress(OSError, StorageError):  # a store down for a while: renewed when back
                current = Holder.read(self.path)
                if current is not None and current.token != self.me.token:
                    log.warning("job dir %s: another job (%s) took it over (this job's lease went unrenewed for "
                                "%g s); from now on both write there", self.job_dir, current, STALE)
                    return
                self.me = replace(self.me, renewals=self.me.renewals + 1)
                self.me.write(self.path)

    def release(self) -> None:
        """Stop renewing; remove the lease if it is still this job's (the next job takes the dir at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=RENEW)
        with contextlib.suppress(OSError, StorageError):
            current = Holder.read(self.path)
            if current is not None and current.token == self.me.token:
                self.path.unlink()
