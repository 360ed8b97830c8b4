"""Supervise a set of local processes: prefixed output, first failure stops the rest, signals forwarded.

Used by ``local`` (one process per emulated replica) and by the Horovod launcher (one per GPU). Each
process runs in its own process group, so a signal reaches its children too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

GRACE_SECONDS = 15.0


@dataclass
class Replica:
    """One supervised process: its name parts, environment, command and (once started) process."""

    pool: str
    index: int
    env: dict[str, str]
    argv: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """The replica name used as log prefix, e.g. ``workerpool1-0``."""
        return f"{self.pool}-{self.index}"


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _pump(prefix: str, stream: IO[bytes], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            sys.stdout.write(f"[{prefix}] {line}\n")
            sys.stdout.flush()


def _signal_group(replica: Replica, sig: int) -> None:
    if replica.proc is not None and replica.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(replica.proc.pid, sig)


def stop_all(replicas: Sequence[Replica], sig: int = signal.SIGTERM, grace: float = GRACE_SECONDS) -> None:
    """Send ``sig`` to every replica's process group; SIGKILL whatever is left after ``grace`` seconds."""
    for r in replicas:
        _signal_group(r, sig)
    deadline = time.monotonic() + grace
    for r in replicas:
        if r.proc is not None:
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(r, signal.SIGKILL)
                r.proc.wait()


def run_replicas(replicas: list[Replica], label: str = "local") -> int:
    """Start every replica, wait; the first failure stops the others and gives the exit code."""
    lock = threading.Lock()
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for r in replicas:
            r.proc = subprocess.Popen(
                r.argv, env=r.env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
            assert r.proc.stdout is not None
            r.pump = threading.Thread(target=_pump, args=(r.name, r.proc.stdout, lock), daemon=True)
            r.pump.start()
        code = 0
        while True:
            if received:
                sig = received[0]
                print(f"[{label}] received {signal.Signals(sig).name}: stopping every process", flush=True)
                stop_all(replicas, sig)
                code = 128 + sig
                break
            running = [r for r in replicas if r.proc is not None and r.proc.poll() is None]
            failed = [r for r in replicas if r.proc is not None and r.proc.returncode not in (None, 0)]
            if failed:
                first = failed[0]
                assert first.proc is not None
                rc = first.proc.returncode
                code = rc if rc > 0 else 128 - rc  # killed by a signal: 128 + signal number
                print(f"[{label}] {first.name} exited with {code}: stopping the others", flush=True)
                stop_all(running)
                break
            if not running:
                break
            time.sleep(0.1)
        for r in replicas:
            if r.pump is not None:
                r.pump.join(timeout=5)
        return code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


