"""Supervise a set of local processes: prefixed output, first failure stops the rest, signals forwarded.

Used by ``local`` (one process per emulated replica) and by the Horovod launcher (one per GPU). Each
child runs in its own process group and dies with its supervisor (``signals.child_preexec``); a stop
reaches every group, and whatever still runs after the grace period is killed.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from entrypoint.options import DEFAULT_GRACE_PERIOD
from entrypoint.signals import Forwarder, child_preexec, exit_code_of, terminate


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

    @property
    def exit_code(self) -> int | None:
        """Its exit status as the shell reports it (None while running)."""
        returncode = self.proc.poll() if self.proc is not None else None
        return None if returncode is None else exit_code_of(returncode)


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


def _start(replica: Replica, lock: threading.Lock) -> None:
    replica.proc = subprocess.Popen(replica.argv, env=replica.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=child_preexec)
    assert replica.proc.stdout is not None
    replica.pump = threading.Thread(target=_pump, args=(replica.name, replica.proc.stdout, lock), daemon=True)
    replica.pump.start()


def run_replicas(replicas: list[Replica], label: str = "local",
                 grace: float = DEFAULT_GRACE_PERIOD) -> tuple[int, Replica | None]:
    """Start every replica and wait; a signal or the first failure stops the others.

    Returns the exit code and the replica that failed first (None when all succeeded or a signal came).
    """
    lock = threading.Lock()
    procs = []
    with Forwarder() as forwarder:
        try:
            for r in replicas:
                _start(r, lock)
                assert r.proc is not None
                procs.append(r.proc)
            code, first = _wait(replicas, procs, forwarder, label, grace)
        except BaseException:
            terminate(procs, signal.SIGKILL, 0)
            raise
    for r in replicas:
        if r.pump is not None:
            r.pump.join(timeout=5)
    return code, first


def _wait(replicas: Sequence[Replica], procs: list[subprocess.Popen[bytes]], forwarder: Forwarder, label: str,
          grace: float) -> tuple[int, Replica | None]:
    while True:
        if forwarder.received:
            sig = forwarder.received[0]
            print(f"[{label}] received {signal.Signals(sig).name}: forwarding it to every process (grace {grace:g} s)",
                  flush=True)
            terminate(procs, sig, grace)
            return 128 + sig, None
        failed = [r for r in replicas if r.exit_code not in (None, 0)]
        if failed:
            first = failed[0]
            print(f"[{label}] {first.name} exited with {first.exit_code}: stopping the others", flush=True)
            code = int(first.exit_code or 1)
            terminate([p for p in procs if p.poll() is None], signal.SIGTERM, grace)
            return code, first
        if all(r.exit_code is not None for r in replicas):
            return 0, None
        time.sleep(0.1)
