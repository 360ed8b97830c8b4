"""Who is lost: every rank's heartbeat in the job's key-value store, read by the survivors when a peer fails.

gloo names a lost peer by an IP address and an ephemeral port, which says nothing when every replica
runs on one machine (``local``) and little on a cluster; a frozen peer (SIGSTOP, a stuck driver) says
nothing at all until a timeout. So each training process publishes a heartbeat (a counter and its step)
every second from a thread of its own, in the store the job already has (torch's TCPStore on the
chief, Horovod's rendezvous server). When a collective fails or the hang watchdog fires, the survivor
reads every heartbeat twice, a few seconds apart: the ranks whose counter did not move are the lost or
frozen ones, named as their replica. An unreachable store means the chief (which hosts it) is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from entrypoint.periodic import Periodic

log = logging.getLogger("entrypoint")
INTERVAL = 1.0  # seconds between heartbeats
WINDOW = 3.0  # how long a survivor watches for heartbeats that no longer move
_PREFIX = "trainer/heartbeat/"


class KeyValue(Protocol):
    """The job's store, as the heartbeats use it."""

    def put(self, key: str, value: str) -> None:
        """Set ``key``."""

    def fetch(self, key: str) -> str | None:
        """``key``'s value, None when it was never set (never blocks waiting for it)."""


@dataclass(frozen=True)
class Member:
    """A training process as users know it."""

    rank: int
    replica: str
    host: str

    def __str__(self) -> str:
        return f"{self.replica} (rank {self.rank}, host {self.host})"


@dataclass(frozen=True)
class Silent:
    """A rank whose heartbeat stopped (or whose store is gone), and the last step it reported."""

    member: Member
    step: int | None
    why: str


class PeerBoard:
    """Publishes this rank's heartbeat; names the ranks whose heartbeats stopped."""

    def __init__(self, kv: KeyValue, me: Member, members: list[Member], prefix: str = _PREFIX) -> None:
        self.kv, self.me, self.members, self.prefix = kv, me, members, prefix
        self.step = 0
        self._count = 0
        self._lock = threading.Lock()
        # a store gone is for the verdict to say: the next beat tries again
        self._beats = Periodic("heartbeat", self._beat, INTERVAL, join=0.0, on_error=lambda _exc: True)

    def start(self) -> PeerBoard:
        """Beat every INTERVAL seconds in a daemon thread."""
        self._beats.start()
        return self

    def stop(self) -> None:
        """Stop beating (the process is leaving; a beat in flight is not waited for)."""
        self._beats.stop()

    def _beat(self) -> None:
        self._count += 1
        with self._lock:
            self.kv.put(f"{self.prefix}{self.me.rank}", f"{self._count} {self.step}")

    def _read(self) -> dict[int, tuple[int, int] | None]:
        """Every other rank's (counter, step); None for a rank never heard of. Raises when the store is gone."""
        seen: dict[int, tuple[int, int] | None] = {}
        for member in self.members:
            if member.rank == self.me.rank:
                continue
            with self._lock:
                value = self.kv.fetch(f"{self.prefix}{member.rank}")
            counter, _, step = (value or "").partition(" ")
            seen[member.rank] = (int(counter), int(step)) if counter.isdigit() and step.isdigit() else None
        return seen

    def silent(self, window: float = WINDOW) -> list[Silent]:
        """The ranks whose heartbeat did not move within ``window`` seconds (the chief, if the store is gone)."""
        chief = self.members[0]
        try:
            before = self._read()
            time.sleep(window)
            after = self._read()
        except Exception as exc:  # the store lives with the chief: it is gone or frozen
            if self.me.rank == chief.rank:
                return []
            return [Silent(chief, None, f"its store is unreachable ({type(exc).__name__})")]
        found = []
        for member in self.members:
            if member.rank == self.me.rank:
                continue
            old, new = before.get(member.rank), after.get(member.rank)
            if new is None or old == new:
                step = new[1] if new is not None else None
                found.append(Silent(member, step, f"no heartbeat for {window:g} s"))
        return found


def describe(silent: list[Silent]) -> str:
    """``workerpool1-0 (rank 1, host h) stopped responding (no heartbeat for 3 s; its last one was at step 40)``.

    Heartbeats go out every INTERVAL seconds, so the step is the last one the peer *reported*: it may have
    gone a few fast steps further before it was lost."""
    parts = []
    for s in silent:
        last = f"; its last one was at step {s.step}" if s.step is not None else ""
        parts.append(f"{s.member} stopped responding ({s.why}{last})")
    return "; ".join(parts)
