"""A node's fork server: its ranks forked from one process that imported torch once, not one import per rank.

The node's agent (``node.py``) starts it first, a fresh interpreter (``python -m``, never a fork of the agent),
with the environment its ranks inherit; it binds its Unix socket, imports what a rank imports before its first step
(torch, ``torch._dynamo``, the worker's modules: ~2.7 s of CPU a rank no longer pays) while the agent imports
torch's launcher and meets its peers, then waits, single-threaded, for its clients (``forkclient.py``: the process
torch's agent starts for each rank). For each it forks a child that takes the client's standard streams,
environment, command line and working directory, in a session of its own as torch's agent starts a rank, and runs
``python -m entrypoint.worker`` as an exec'd rank would; the child's wait status goes back to its client.

Safe forks only: a thread alive in the server, CUDA's driver loaded or an environment that differs from the one
the server imported torch with (but for the variables torch's agent sets per rank) refuses the rank, which then
starts by exec. The server dies with the agent, each child with the server (PR_SET_PDEATHSIG), and a child whose
client is gone (SIGKILLed) is killed. ``TRAINER_FORK_SERVER=0`` turns it off (docs/ENVIRONMENT.md).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from entrypoint.cluster import envvars as ev
from entrypoint.lifecycle.signals import die_with_parent

log = logging.getLogger("entrypoint.pytorch")
CLIENT = Path(__file__).with_name("forkclient.py")
# What a rank imports before its first step; torch._dynamo is torch's optimizers' first step's own import.
PRELOAD = ("torch", "torch._dynamo", "torch.distributed.elastic.multiprocessing.errors", "entrypoint.lifecycle.runner",
           "entrypoint.pytorch.loop.worker", "entrypoint.pytorch.loop.trainer", "entrypoint.pytorch.loop.data")
# What torch's launcher sets for each rank (LocalElasticAgent, its error file, the signals its agent handles), and
# the node's attempt in the job ledger (set by a worker node once it sees the chief's ledger, which may be after its
# server started): the only variables a rank's environment may differ in from the server's (none is read at an import).
PER_RANK = frozenset({ev.TRAINER_ATTEMPT,
    ev.LOCAL_RANK, ev.RANK, ev.GROUP_RANK, ev.ROLE_RANK, ev.ROLE_NAME, ev.LOCAL_WORLD_SIZE, ev.WORLD_SIZE,
    ev.GROUP_WORLD_SIZE, ev.ROLE_WORLD_SIZE, ev.MASTER_ADDR, ev.MASTER_PORT, ev.TORCHELASTIC_RESTART_COUNT,
    ev.TORCHELASTIC_MAX_RESTARTS, ev.TORCHELASTIC_RUN_ID, ev.TORCHELASTIC_USE_AGENT_STORE,
    ev.TORCH_NCCL_ASYNC_ERROR_HANDLING, ev.TORCHELASTIC_ERROR_FILE, ev.OMP_NUM_THREADS,
    ev.TORCHELASTIC_SIGNALS_TO_HANDLE})


@dataclass
class Server:
    """The agent's handle: the server process and the command torch's agent starts for each rank."""

    proc: subprocess.Popen[bytes]
    socket_path: str

    def command(self, module: str) -> tuple[str, ...]:
        """The arguments after ``python`` that start a rank running ``python -m module`` through this server."""
        return (str(CLIENT), self.socket_path, str(self.proc.pid), str(os.getpid()), "-m", module)


@contextlib.contextmanager
def started(env: dict[str, str]) -> Iterator[Server | None]:
    """A fork server with the ranks' environment ``env``, killed when done; None where one cannot start (said)."""
    directory = tempfile.mkdtemp(prefix="trainer-forkserver-")
    path = os.path.join(directory, "socket")
    server = None
    try:
        try:
            # a session of its own: a stop sent to the node's process group (tini -g, ``local``, Kubernetes) is for
            # the agent, which stops each rank through its client; the server dies with the agent
            proc = subprocess.Popen([sys.executable, "-m", __name__, path, str(os.getpid())], env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            server = Server(proc, path)
        except OSError as exc:
            log.warning("fork server not started (%s): this node's ranks start as processes of their own", exc)
        yield server
    finally:
        if server is not None:
            with contextlib.suppress(OSError):
                server.proc.kill()
            server.proc.wait()
        with contextlib.suppress(OSError):
            for name in os.listdir(directory):
                os.unlink(os.path.join(directory, name))
            os.rmdir(directory)


# --- The server process ------------------------------------------------------------------------------------------


@dataclass
class Request:
    """A client's rank: its command (``-m MODULE ARGS...``), argv[0], working directory, environment and streams."""

    command: list[str]
    argv0: str
    cwd: str
    env: dict[str, str]
    fds: list[int]


def main(argv: list[str]) -> int:
    """The server's life: bind, preload, serve; in a forked child, run the rank and end as it ends."""
    path, agent = argv[1], int(argv[2])
    die_with_parent(signal.SIGKILL, expected_parent=agent)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    imported_with = dict(os.environ)
    try:
        for module in PRELOAD:
            importlib.import_module(module)
            if _threads() > 1:  # OpenMP's pool, started at torch's import where OMP_NUM_THREADS is not 1: no fork
                break
    except Exception as exc:  # any failure: the clients start their ranks by exec)
        _say(f"fork server: importing {module} failed ({type(exc).__name__}): ranks start by exec")
        return 1
    gc.freeze()  # what the imports made stays out of the collector's way: pages the children keep sharing
    server = os.getpid()
    request = _serve(listener, imported_with)
    _become(request, server)
    runpy.run_module(request.command[1], run_name="__main__", alter_sys=True)
    return 0


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def _serve(listener: socket.socket, imported_with: dict[str, str]) -> Request:
    """Serve clients until this process is a forked child: the child returns with its request."""
    clients: dict[socket.socket, int | None] = {}  # a client's socket -> its child, once forked
    children: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener, *clients], [], [], 0.05)
        _reap(children, clients)
        for sock in readable:
            if sock is listener:
                clients[listener.accept()[0]] = None
            elif clients[sock] is None:
                request = _receive(sock)
                refusal = _refusal(request, imported_with) if request else "an incomplete request"
                if refusal or request is None:
                    _answer(sock, {"exec": refusal})
                    _drop(sock, clients, request)
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in clients:
                        other.close()
                    return request
                for fd in request.fds:
                    os.close(fd)
                clients[sock], children[pid] = pid, sock
                _answer(sock, {"pid": pid})
            elif not _recv_quietly(sock):  # the client is gone (SIGKILLed): its child goes too
                with contextlib.suppress(ProcessLookupError):
                    os.kill(clients[sock] or 0, signal.SIGKILL)
                _drop(sock, clients, None)


def _recv_quietly(sock: socket.socket) -> bytes:
    try:
        return sock.recv(1)
    except OSError:
        return b""


def _drop(sock: socket.socket, clients: dict[socket.socket, int | None], request: Request | None) -> None:
    for fd in request.fds if request else ():
        os.close(fd)
    clients.pop(sock, None)
    sock.close()


def _reap(children: dict[int, socket.socket], clients: dict[socket.socket, int | None]) -> None:
    """Each child that ended: its wait status to its client, whose socket is then closed."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock = children.pop(pid, None)
        if sock is not None and sock in clients:
            _answer(sock, {"status": status})
            _drop(sock, clients, None)


def _answer(sock: socket.socket, message: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(json.dumps(message).encode() + b"\n")


def _receive(sock: socket.socket) -> Request | None:
    """A client's request: a length and its three streams, then the request (None when it does not come whole)."""
    try:
        header, fds, _flags, _addr = socket.recv_fds(sock, 4, 3)
        if len(header) != 4 or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            return None
        size, = struct.unpack("!I", header)
        body = b""
        sock.settimeout(10.0)
        while len(body) < size and (data := sock.recv(size - len(body))):
            body += data
        sock.settimeout(None)
        fields = json.loads(body)
        return Request(list(fields["command"]), str(fields["argv0"]), str(fields["cwd"]), dict(fields["env"]), fds)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _refusal(request: Request, imported_with: dict[str, str]) -> str | None:
    """Why this rank must not be forked from here, or None."""
    if len(request.command) < 2 or request.command[0] != "-m":
        return "not a module's command line"
    if threading.active_count() != 1 or _threads() != 1:
        return (f"{_threads()} threads run in the fork server after importing torch (OpenMP's pool where "
                "OMP_NUM_THREADS is not 1)")
    if _cuda_loaded():
        return "CUDA's driver is loaded in the fork server"
    differ = sorted(name for name in set(imported_with) | set(request.env)
                    if name not in PER_RANK and imported_with.get(name) != request.env.get(name))
    if differ:
        return "the rank's environment differs from the fork server's in " + ", ".join(differ)  # names only
    return None


def _threads() -> int:
    """This process's threads, native ones included."""
    return len(os.listdir("/proc/self/task"))


def _cuda_loaded() -> bool:
    """Whether CUDA's driver is in this process (its library mapped or a GPU's device open): no fork after it."""
    with contextlib.suppress(OSError):
        if "libcuda.so" in Path("/proc/self/maps").read_text():
            return True
        return any(os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia") for fd in _open_fds())
    return False


def _open_fds() -> list[str]:
    return [fd for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")]


def _become(request: Request, server: int) -> None:
    """Make this forked child the process an exec of ``python -m MODULE`` by torch's agent would have started."""
    die_with_parent(signal.SIGKILL, expected_parent=server)  # the server's end is this rank's (and the agent's its)
    os.setsid()  # torch's agent starts each rank in a session of its own
    for target, fd in enumerate(request.fds):
        os.dup2(fd, target)
    for fd in request.fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    sys.path[0] = request.cwd  # ``python -m``'s first entry: its working directory
    sys.argv = [request.command[1], *request.command[2:]]  # runpy puts the module's file first, as -m does
    sys.orig_argv = [request.argv0, *request.command]
    _fresh_state()


def _fresh_state() -> None:
    """What the server's imports left that a fresh interpreter would have made anew for itself."""
    import multiprocessing.process

    multiprocessing.process.current_process().authkey = os.urandom(32)  # each process's own, as at its start
    # where its spawned children start (set at multiprocessing's import)
    multiprocessing.process.ORIGINAL_DIR = os.path.abspath(os.getcwd())  # type: ignore[attr-defined]
    if "torch" in sys.modules:  # torch seeds its CPU generator at its start from the OS (CUDA's: at their first use)
        sys.modules["torch"].default_generator.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # numpy's global generator is seeded at import from the OS
    logging._startTime = time.time()  # type: ignore[attr-defined]  # records' relativeCreated: from this start
    with contextlib.suppress(Exception):  # line-buffered on a terminal, as Python sets it up at its start
        sys.stdout.reconfigure(line_buffering=os.isatty(1))  # type: ignore[union-attr]


if __name__ == "__main__":
    from entrypoint.lifecycle.shutdown import end

    end(main(sys.argv))
