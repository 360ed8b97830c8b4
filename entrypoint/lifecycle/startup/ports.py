"""Free TCP ports for the processes a launcher starts, and the host's record of the ports handed out recently.

A port is free when picked and taken seconds later by the process it is for (a chief's store binds it once its
framework is imported). Ports come from below the kernel's ephemeral range, which bind(0) and connect() draw from:
one from that range can meanwhile go to any socket bound to port 0 (gloo binds one per peer) or to an outgoing
connection. And two launchers on one host (several ``local`` jobs, a test suite's parallel jobs) could pick the
same free port within each other's wait and both fail, one with EADDRINUSE: every pick is recorded in a file of
this host's temp directory (one per user), and a port any of the user's processes picked in the last
``RECENT_SECONDS`` is not handed out again.
The record is best effort: where it cannot be read or written, ports are picked without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

PORT_FLOOR = 10000
RECENT_SECONDS = 600.0  # a replica restarted in place binds its port again: the record keeps a port that long
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range is 32768-60999


def record_path() -> Path:
    """The host's record of handed-out ports (one per user: ``/tmp`` is shared)."""
    return Path(tempfile.gettempdir()) / f"trainer-ports-{os.getuid()}"


@contextlib.contextmanager
def _record() -> Iterator[dict[int, float] | None]:
    """The recent picks (port -> when), locked against every other picker on this host; what the block adds to the
    dict is written back. None when the record cannot be opened, locked or read (the block's own errors pass)."""
    try:
        fd = os.open(record_path(), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            f = os.fdopen(os.dup(fd), "r+", encoding="ascii", errors="replace")
        except OSError:
            f = None
        if f is None:
            yield None
            return
        with f:
            recent = _read(f)
            yield recent
            if recent is not None:
                with contextlib.suppress(OSError):
                    f.seek(0)
                    f.truncate()
                    f.write("".join(f"{port} {when:.1f}\n" for port, when in recent.items()))
                    f.flush()
    finally:
        os.close(fd)


def _read(f: IO[str]) -> dict[int, float] | None:
    """The picks of the last ``RECENT_SECONDS``; a torn line is skipped. None when the file cannot be read."""
    try:
        lines = f.read().splitlines()
    except OSError:
        return None
    now, recent = time.time(), {}
    for line in lines:
        port, _, when = line.partition(" ")
        with contextlib.suppress(ValueError):
            if now - float(when) < RECENT_SECONDS:
                recent[int(port)] = float(when)
    return recent


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1, picked at random below the ephemeral range and not handed out
    on this host in the last ``RECENT_SECONDS``, else anywhere (held open together so they differ)."""
    with _record() as recent:
        taken = recent or {}
        top = _ephemeral_start()
        pool = [p for p in range(PORT_FLOOR, top) if p not in taken] if top > PORT_FLOOR else []
        candidates = random.sample(pool, min(len(pool), 50 * count))
        socks: list[socket.socket] = []
        try:
            for port in [*candidates, *[0] * count]:
                if len(socks) == count:
                    break
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    s.close()
                    continue
                socks.append(s)
            ports = [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()
        if recent is not None:
            recent.update(dict.fromkeys(ports, time.time()))
        return ports
