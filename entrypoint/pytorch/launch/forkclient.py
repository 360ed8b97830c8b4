"""A rank as torch's agent starts it when its node has a fork server (``forkserver.py``): a tiny client.

Run by its path (``python .../forkclient.py SOCKET SERVER_PID AGENT_PID -m entrypoint.worker``), so it imports the
standard library only, nothing of ours and no torch; it dies with the agent (PR_SET_PDEATHSIG), as an exec'd rank
does, silently. It hands the server its command, environment, working directory and
standard streams (SCM_RIGHTS), relays every signal it receives to the child the server forked for it, and ends as
that child ended: its exit status, or killed by the same signal (torch's agent, ``local`` and our exit classes read
it as they read an exec'd worker). Killed itself (SIGKILL), the server sees its socket close and kills the child.
Any failure before the child starts (no server, a server that refuses: a thread alive in it, CUDA in it, an
environment it was not started with) starts the rank as its own process instead (exec), said once per node.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import struct
import sys
import time
import types
from collections.abc import Iterator

_PR_SET_PDEATHSIG = 1
CONNECT_WAIT = 120.0  # seconds to wait for a live server's socket (it binds it before anything heavy)
STATUS_WAIT = 900.0  # seconds to wait for a live server to answer (it imports torch first)
# Signals not relayed: the kernel's own (stop, continue, child, window, urgent data, broken pipe) and the client's
# own faults.
UNRELAYED = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT, signal.SIGTSTP, signal.SIGTTIN,
                       signal.SIGTTOU, signal.SIGWINCH, signal.SIGURG, signal.SIGPIPE, signal.SIGSEGV, signal.SIGBUS,
                       signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS})


class Fallback(Exception):
    """The server cannot start this rank: start it by exec (the message says why)."""


class Relay:
    """Every relayed signal received goes to the child; those before it exists wait for it."""

    def __init__(self) -> None:
        self.child: int | None = None
        self.pending: list[int] = []
        for sig in signal.valid_signals():
            if sig not in UNRELAYED:
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, self._received)

    def _received(self, sig: int, _frame: types.FrameType | None) -> None:
        if self.child is None:
            self.pending.append(sig)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, sig)

    def started(self, child: int) -> None:
        self.child = child
        for sig in self.pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, sig)

    def restore(self) -> None:
        for sig in signal.valid_signals():
            if sig not in UNRELAYED:
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, signal.SIG_DFL)


def main(argv: list[str]) -> None:
    path, server, agent, command = argv[1], int(argv[2]), int(argv[3]), argv[4:]
    _die_with(agent)
    relay = Relay()
    try:
        sock = _connect(path, server)
        lines = _request(sock, command, server)
        answer = json.loads(next(lines))
        if "exec" in answer:
            raise Fallback(answer["exec"])
        relay.started(int(answer["pid"]))
    except (Fallback, OSError, ValueError, KeyError, StopIteration) as exc:
        _fallback(path, command, relay, str(exc) or type(exc).__name__)
    try:
        status = int(json.loads(next(lines))["status"])
    except (OSError, ValueError, KeyError, StopIteration):
        _say(f"trainer: the node's fork server ended while this rank ran (client {os.getpid()}): the rank ended "
             "with it")
        status = signal.SIGKILL  # what the server's end did to the child (PR_SET_PDEATHSIG)
    _end_as(status, relay)


def _die_with(parent: int) -> None:
    """SIGKILL when ``parent`` (the agent) dies; at once if it is gone already (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: the server is the agent's child, reaped by the agent)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _connect(path: str, server: int) -> socket.socket:
    deadline = time.monotonic() + CONNECT_WAIT
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if not _alive(server):
                raise Fallback("the fork server is not running") from None
            if time.monotonic() > deadline:
                raise Fallback(f"the fork server did not listen within {CONNECT_WAIT:.0f} s") from None
            time.sleep(0.02)


def _request(sock: socket.socket, command: list[str], server: int) -> Iterator[bytes]:
    request = json.dumps({"command": command, "argv0": sys.orig_argv[0], "cwd": os.getcwd(),
                          "env": dict(os.environ)}).encode()
    socket.send_fds(sock, [struct.pack("!I", len(request))], [0, 1, 2])
    sock.sendall(request)
    return _lines(sock, server)


def _lines(sock: socket.socket, server: int) -> Iterator[bytes]:
    """The server's answers, one JSON line each; ends when the server closes the socket (or dies)."""
    buffer = b""
    sock.settimeout(1.0)
    waited = 0.0
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            waited = 0.0
            yield line
        try:
            data = sock.recv(4096)
        except TimeoutError:
            waited += 1.0
            if not _alive(server) or waited > STATUS_WAIT:
                return
            continue
        if not data:
            return
        buffer += data


def _fallback(path: str, command: list[str], relay: Relay, why: str) -> None:
    """Start the rank as its own process, as without a server (the reason said once per node)."""
    with contextlib.suppress(OSError):
        os.close(os.open(path + ".fallback", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        _say(f"trainer: fork server unavailable ({why}): this node's ranks start as processes of their own (exec)")
    relay.restore()
    if relay.pending:
        _end_as(relay.pending[0], relay)  # stopped before it started: as an exec'd rank would have been
    os.execv(sys.executable, [sys.orig_argv[0], *command])


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def _end_as(status: int, relay: Relay) -> None:
    """Exit as a process whose wait status is ``status`` (a bare signal number is a death by that signal)."""
    relay.restore()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if not os.WIFSIGNALED(status):
        os._exit(os.waitstatus_to_exitcode(status))
    sig = os.WTERMSIG(status)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the child dumped its own core where it could
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    time.sleep(1.0)
    os._exit(128 + sig)


if __name__ == "__main__":
    main(sys.argv)
