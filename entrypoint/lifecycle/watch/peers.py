"""Who is lost: every rank's heartbeat in the job's key-value store, read by the survivors when a peer fails.

gloo names a lost peer by an IP address and an ephemeral port, which says nothing when every replica
runs on one machine (``local``) and little on a cluster; a frozen peer (SIGSTOP, a stuck driver) says
nothing at all until a timeout. So each training process publishes a heartbeat (a counter and its step)
every second from a thread of its own, in the store the job already has (torch's TCPStore on the
chief, Horovod's rendezvous server). When a collective fails or the hang watchdog fires, the survivor
reads every heartbeat twice, a few seconds apart: the ranks whose counter did not move are the lost or
frozen ones, named as their replica. An unreachable store means the chief (which hosts it) is gone.

A process that died is known at once, without that wait: each rank also listens on a port of its own (its
*liveness port*, published beside its heartbeat) and never accepts on it but to empty its queue. While the
process lives, the kernel completes a connection to it (a frozen process's too); once it is gone, its host
refuses one at once. So a survivor first knocks on every peer's port: the ranks that refuse are lost now (a
process killed, crashed or ended on a host that is up: ``local``'s kill, an OOM kill, a container restarted on its
VM). Only when none refuses (a host gone with its VM, whose address no longer answers; a frozen process) does it
watch the heartbeats for ``WINDOW`` seconds. A refusal counts only from a port this rank once reached (its heartbeat
thread knocks once on each peer's port as it is published): a port a firewall blocks from the start never makes a
live peer look lost. Gone is not lost: a process that ended on a failure of its own recorded it before its port
closed with it, and that record, not a verdict, names it (``failures.record_verdict`` decides, for heartbeats too).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from entrypoint.periodic import Periodic

log = logging.getLogger("entrypoint")
INTERVAL = 1.0  # seconds between heartbeats
WINDOW = 3.0  # how long a survivor watches for heartbeats that no longer move
KNOCK = 0.5  # seconds a knock on a peer's liveness port may take (longer: its host does not answer, watch the beats)
_PREFIX = "trainer/heartbeat/"
_UNTIL_EXIT: list[socket.socket] = []  # the liveness ports of the boards stopped: open until the process ends


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


def address_towards(host: str) -> str | None:
    """This host's address on the route to ``host`` (the chief's: every peer reaches it there); None if unknown."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # a datagram socket's connect sends nothing: it only picks the route
            return str(probe.getsockname()[0])
    except OSError:
        return None


def knock(ports: dict[int, tuple[str, int]], timeout: float = KNOCK) -> dict[int, bool | None]:
    """Whether a process listens at each rank's ``(host, port)``, all knocked on at once: False when its host refuses
    the connection (the process is gone), True when it is taken (alive, or frozen), None when nothing answered within
    ``timeout`` (a host gone or slow)."""
    found: dict[int, bool | None] = {rank: None for rank in ports}
    pending: dict[socket.socket, int] = {}
    with selectors.DefaultSelector() as selector:
        for rank, (host, port) in ports.items():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex((host, port))
            if code not in (0, errno.EINPROGRESS):
                found[rank] = False if code == errno.ECONNREFUSED else None
                sock.close()
                continue
            pending[sock] = rank
            selector.register(sock, selectors.EVENT_WRITE, sock)
        deadline = time.monotonic() + timeout
        try:
            while pending and (left := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    sock = key.data
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    found[pending.pop(sock)] = True if code == 0 else False if code == errno.ECONNREFUSED else None
                    selector.unregister(sock)
                    sock.close()
        finally:
            for sock in pending:
                sock.close()
    return found


class PeerBoard:
    """Publishes this rank's heartbeat (and, given ``address``, its liveness port); names the ranks whose heartbeats
    stopped, or whose liveness port refuses."""

    def __init__(self, kv: KeyValue, me: Member, members: list[Member], prefix: str = _PREFIX,
                 address: str | None = None) -> None:
        self.kv, self.me, self.members, self.prefix = kv, me, members, prefix
        self.step = 0
        self._count = 0
        self._lock = threading.Lock()
        self._listener = self._listen(address) if address else None
        self._reached: set[tuple[int, str]] = set()  # (rank, "host port") of the liveness ports once reached
        # a store gone is for the verdict to say: the next beat tries again
        self._beats = Periodic("heartbeat", self._beat, INTERVAL, join=0.0, on_error=lambda _exc: True)

    @staticmethod
    def _listen(address: str) -> socket.socket | None:
        """This rank's liveness port (None where it cannot listen: the peers watch its heartbeat alone)."""
        try:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((address, 0))
            listener.listen(64)
            listener.setblocking(False)
        except OSError:
            return None
        return listener

    def start(self) -> PeerBoard:
        """Say where this rank's liveness port is, and beat every INTERVAL seconds in a daemon thread."""
        if self._listener is not None:
            host, port = self._listener.getsockname()[:2]
            with contextlib.suppress(Exception), self._lock:  # no port said: the peers watch the heartbeat alone
                self.kv.put(f"{self.prefix}at/{self.me.rank}", f"{host} {port}")
        self._beats.start()
        return self

    def stop(self) -> None:
        """Stop beating (the process is leaving; a beat in flight is not waited for). The liveness port stays open
        until the process ends, when the kernel closes it: a refusal means the process is gone, with the failure
        record it wrote on its way out (a peer that failed on its own is not lost: ``failures.record_verdict``)."""
        self._beats.stop()
        if self._listener is not None:
            _UNTIL_EXIT.append(self._listener)  # the garbage collector would close it with the board

    def _beat(self) -> None:
        self._count += 1
        self._drain()
        with self._lock:
            self.kv.put(f"{self.prefix}{self.me.rank}", f"{self._count} {self.step}")
        if self._listener is not None and len(self._reached) < len(self.members) - 1:
            self._reach()

    def renew(self) -> None:
        """The group is changing (a replacement takes a lost rank's place, with a port of its own): the next beats
        reach every peer's port again, and only a port reached since counts its refusal."""
        self._reached.clear()

    def _ports(self, ranks: list[int]) -> dict[int, tuple[str, int]]:
        """The liveness ports the ranks published."""
        ports: dict[int, tuple[str, int]] = {}
        for rank in ranks:
            with self._lock:
                at = self.kv.fetch(f"{self.prefix}at/{rank}")
            host, _, port = (at or "").partition(" ")
            if port.isdigit():
                ports[rank] = (host, int(port))
        return ports

    def _reach(self) -> None:
        """Knock once on each peer's newly published port: the ports this rank can reach (a refusal counts there)."""
        known = {rank for rank, _ in self._reached}
        ports = self._ports([m.rank for m in self.members if m.rank != self.me.rank and m.rank not in known])
        for rank, taken in knock(ports, timeout=0.2).items():
            if taken:
                self._reached.add((rank, "{} {}".format(*ports[rank])))

    def _drain(self) -> None:
        """The knocks on the liveness port, closed (its queue never fills up, which would look like a host gone)."""
        while self._listener is not None:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # none left (or closed)
                return
            conn.close()

    def gone(self) -> list[Silent]:
        """The ranks whose liveness port (once reached) refuses a connection now: their process is gone (no wait)."""
        ports = {rank: at for rank, at in self._ports([m.rank for m in self.members if m.rank != self.me.rank]).items()
                 if (rank, "{} {}".format(*at)) in self._reached}  # a port never reached: a refusal says nothing
        answers = knock(ports)
        return [Silent(m, self._last_step(m.rank), "its process is gone: its liveness port refuses connections")
                for m in self.members if answers.get(m.rank, True) is False]

    def _last_step(self, rank: int) -> int | None:
        with self._lock:
            value = self.kv.fetch(f"{self.prefix}{rank}")
        _, _, step = (value or "").partition(" ")
        return int(step) if step.isdigit() else None

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
        """The ranks whose process is gone (their liveness port refuses: at once), else those whose heartbeat did not
        move within ``window`` seconds (the chief, if the store is gone). A loss was looked for, so the group is
        changing: from the next beat on every peer's port is reached again (a lost rank's replacement has a new one)."""
        try:
            return self._silent(window)
        finally:
            self.renew()

    def _silent(self, window: float) -> list[Silent]:
        chief = self.members[0]
        try:
            if found := self.gone():
                return found
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
