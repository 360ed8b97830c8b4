"""Peers that serve (ParameterServerStrategy's workers and ps): wait until each listens, then watch it stays up.

Such peers never wait for anybody: they start serving at once, also when the platform restarts one
mid-job, and the chief waits until every one of them accepts a TCP connection on its cluster port
(saying whom it waits for) before TensorFlow connects. While the chief trains, ``ServerWatch`` holds
one idle connection to each server. A server whose process dies closes it at once; the watch dials
again at once: refused means the server is gone, accepted means the server only dropped an idle
connection (gRPC does after its handshake timeout). A restarted server binds its port only after
importing its framework (seconds), so a loss is seen even when the platform restarts it quickly.
The chief reads the verdict when training fails: a lost server is why (``PeerError``, retryable),
whatever TensorFlow's coordinator made of it (an ``OutOfRangeError`` from a cancelled iterator).
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from entrypoint.cluster.topology import Peer
from entrypoint.errors import PeerError, TrainerError
from entrypoint.lifecycle.waiting import Wait
from entrypoint.periodic import Periodic

log = logging.getLogger("entrypoint")
POLL = 0.5  # seconds between the watch's looks at its connections


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def dial(address: str, timeout: float = 2.0) -> socket.socket | None:
    """A connection to ``address``, None when nothing listens there (refused, unresolvable, unreachable)."""
    try:
        return socket.create_connection(_split(address), timeout=timeout)
    except (OSError, ValueError):
        return None


def wait_until_listening(peers: Sequence[Peer], timeout: float, what: str = "servers") -> None:
    """Block until every peer accepts a connection, saying whom it waits for (``Wait``); PeerError naming the
    missing ones after ``timeout`` seconds. Peers without an address are not waited for."""
    waiting = [p for p in peers if p.address]
    if not waiting:
        return
    wait, total = Wait(timeout), len(waiting)
    while True:
        for peer in list(waiting):
            conn = dial(str(peer.address), timeout=min(2.0, max(wait.left, 0.1)))
            if conn is not None:
                conn.close()
                waiting.remove(peer)
        if not waiting:
            log.info("all %d %s listen (%s)", total, what, ", ".join(p.name for p in peers if p.address))
            return
        whom, missing = f"{len(waiting)} of {total} {what} to listen", ", ".join(str(p) for p in waiting)
        if wait.expired:
            raise wait.error(whom, missing)
        wait.say(whom, missing)
        wait.sleep(1.0)


@dataclass(frozen=True)
class Lost:
    """A server seen gone: when (wall clock) and how."""

    peer: Peer
    at: float
    why: str

    def __str__(self) -> str:
        return f"{self.peer} ({self.why} at {time.strftime('%H:%M:%S', time.localtime(self.at))})"


class ServerWatch:
    """Holds an idle connection to each server from a daemon thread; records every server seen gone."""

    def __init__(self, peers: Sequence[Peer], poll: float = POLL) -> None:
        self.peers = [p for p in peers if p.address]
        self.poll = poll
        self._conns: dict[int, socket.socket | None] = {}
        self._lost: list[Lost] = []
        self._lock = threading.Lock()
        self._looks = Periodic("server-watch", self.check, poll)

    def __enter__(self) -> ServerWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ServerWatch:
        """Connect to every server now (one not listening is already lost), then watch from a thread."""
        for i, peer in enumerate(self.peers):
            self._conns[i] = dial(str(peer.address))
            if self._conns[i] is None:
                self._record(peer, "not listening when training started")
        if self.peers:
            self._looks.start()
        return self

    def stop(self) -> None:
        """Stop watching and close the connections."""
        self._looks.stop()
        with self._lock:
            for conn in self._conns.values():
                if conn is not None:
                    conn.close()
            self._conns.clear()

    def lost(self) -> list[Lost]:
        """Every server seen gone since the watch started, after one more look (a failure may come first)."""
        self.check()
        with self._lock:
            return list(self._lost)

    def blame(self, exc: Exception) -> None:
        """Raise PeerError (from ``exc``) naming the servers seen gone, if any: the reason training failed,
        whatever the framework made of it. Errors the entrypoint classified itself are left as they are."""
        if isinstance(exc, TrainerError):
            return
        lost = self.lost()
        if lost:
            raise PeerError(f"lost {'; '.join(str(x) for x in lost)} during training "
                            f"(the framework then failed with {type(exc).__name__})") from exc

    def check(self) -> None:
        """One look at every connection: a closed one is dialled again; refused means the server is gone."""
        with self._lock:
            if self._looks.stopping and not self._conns:
                return
            live = {i: c for i, c in self._conns.items() if c is not None}
            readable: list[socket.socket] = []
            if live:
                try:
                    readable, _, _ = select.select(list(live.values()), [], [], 0)
                except (OSError, ValueError):
                    readable = list(live.values())
            for i, peer in enumerate(self.peers):
                conn = self._conns.get(i)
                if conn is not None and conn in readable and not _still_open(conn):
                    conn.close()
                    conn = self._conns[i] = dial(str(peer.address))
                    if conn is None:
                        self._record(peer, "its connection closed and its port refused a new one")
                elif conn is None:
                    conn = self._conns[i] = dial(str(peer.address))
                    if conn is not None:  # back (restarted): watch the new process
                        log.info("%s listens again", peer)

    def _record(self, peer: Peer, why: str) -> None:
        lost = Lost(peer, time.time(), why)
        self._lost.append(lost)
        log.warning("lost %s", lost)


def _still_open(conn: socket.socket) -> bool:
    """A readable idle connection is closed (EOF or reset) unless the server sent bytes (then it lives)."""
    try:
        return bool(conn.recv(1024, socket.MSG_DONTWAIT))
    except BlockingIOError:
        return True
    except OSError:
        return False
