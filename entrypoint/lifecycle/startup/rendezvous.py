"""Meet every peer before any framework's own rendezvous: one start-up barrier that talks, for every framework.

The chief listens on its own cluster port; every other replica resolves the chief's host name and
connects (retrying: the chief may start later, a new pod's DNS record can lag), says who it is, and
waits for ``GO``. Both sides wait through ``waiting.Wait``: they say whom they wait for and how long they
still wait, and give up at ``--timeout`` with one error naming the missing peers. Then the chief closes the
port and the framework (torch's store, Horovod's rendezvous server, TensorFlow's server) takes it;
everyone it waits for is already there.

ParameterServerStrategy's workers and ps are servers: they never wait for anybody (a server the
platform restarts mid-job must serve again at once, while the chief trains). The chief of a hooks
job waits until each one listens on its cluster port instead (``listening.py``); a script starts
its own servers (or not), and TensorFlow's strategy waits for them, as on the platform.
"""

from __future__ import annotations

import logging
import select
import socket
from collections.abc import Callable, Sequence

from entrypoint.cluster.topology import Peer
from entrypoint.errors import HostUnresolvableError, PeerError
from entrypoint.lifecycle.startup.listening import wait_until_listening
from entrypoint.lifecycle.waiting import LOG_EVERY, Wait
from entrypoint.planning.plan import Plan

log = logging.getLogger("entrypoint")
_HELLO = "TRAINER-BARRIER/1"


def meet_peers(plan: Plan) -> None:
    """Block until every training peer of this job is up (no-op for one replica or platform-placed processes)."""
    topo = plan.topology
    if topo.processes_started_externally or topo.role == "evaluator" or plan.own_barrier:
        return
    peers = topo.training_peers(include_servers=plan.peers_serve)
    address = topo.chief_host_port()
    if len(peers) <= 1 or address is None:
        return
    me = topo.node_rank if topo.node_rank is not None else topo.num_nodes + topo.index
    if plan.peers_serve:  # servers serve at once (a restarted one too); the chief waits until each one listens
        if me == 0 and plan.code is not None and plan.code.kind == "hooks":  # a script starts its own servers
            wait_until_listening(peers[1:], plan.options.timeout, "workers and parameter servers")
        return
    key = f"{len(peers)}@{topo.chief_address}"
    if me == 0:
        _serve(address[1], peers, key, plan.options.timeout)
    else:
        _join(address, peers, me, key, plan.options.timeout)


def _missing(peers: Sequence[Peer], joined: set[int]) -> str:
    return ", ".join(str(p) for i, p in enumerate(peers) if i and i not in joined)


def _serve(port: int, peers: Sequence[Peer], key: str, timeout: float) -> None:
    """The chief: accept every peer's hello, then release them all at once."""
    wait = Wait(timeout)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    joined: dict[int, socket.socket] = {}
    try:
        server.bind(("", port))
        server.listen(len(peers) * 2)
        while len(joined) < len(peers) - 1:
            whom = f"{len(peers) - 1 - len(joined)} of {len(peers) - 1} peers"
            if wait.expired:
                raise wait.error(whom, _missing(peers, set(joined)))
            wait.say(whom, _missing(peers, set(joined)))
            _drop_gone(joined)
            ready, _, _ = select.select([server], [], [], min(1.0, max(wait.left, 0.01)))
            if ready:
                _accept(server, key, len(peers), joined)
        for conn in joined.values():
            conn.sendall(b"GO\n")
        log.info("all %d replicas are here (%s)", len(peers), ", ".join(p.name for p in peers))
    finally:
        for conn in joined.values():
            _close_after_peer(conn)
        server.close()


def _accept(server: socket.socket, key: str, size: int, joined: dict[int, socket.socket]) -> None:
    conn, _ = server.accept()
    conn.settimeout(5.0)
    try:  # anything may knock (a peer of an earlier round speaking torch's store protocol): bytes, not text
        words = conn.makefile("rb").readline(256).decode("ascii", errors="replace").split()
    except OSError:
        words = []
    if len(words) != 3 or words[0] != _HELLO or words[1] != key or not words[2].isdigit() \
            or not 0 < int(words[2]) < size:
        conn.close()  # not one of ours (or another job on a reused port)
        return
    index = int(words[2])
    if index in joined:
        joined[index].close()  # the peer restarted: keep its new connection
    joined[index] = conn


def _drop_gone(joined: dict[int, socket.socket]) -> None:
    """Forget peers whose connection closed while waiting (they will come back, or time out)."""
    if not joined:
        return
    readable, _, _ = select.select(list(joined.values()), [], [], 0)
    for index, conn in list(joined.items()):
        if conn in readable and not conn.recv(1, socket.MSG_PEEK):
            conn.close()
            del joined[index]


def _close_after_peer(conn: socket.socket) -> None:
    """Wait briefly for the peer to close first, so the chief's port is left with no TIME_WAIT of ours."""
    try:
        conn.settimeout(2.0)
        conn.recv(1)
    except OSError:
        pass
    conn.close()


def _join(address: tuple[str, int], peers: Sequence[Peer], me: int, key: str, timeout: float) -> None:
    """A worker: resolve and reach the chief (retrying), say hello, wait for GO; say why it waits when that changes."""
    host, port = address
    reach_chief(host, port, timeout, peers[0],
                lambda wait: _hello_and_wait(host, port, f"{_HELLO} {key} {me}\n", wait, peers))


def reach_chief(host: str, port: int, timeout: float, chief: Peer, attempt: Callable[[Wait], str]) -> None:
    """Call ``attempt(wait)`` until it returns "" (done), retrying while the chief's name does not resolve or
    its port refuses; say whom it waits for and why (``Wait``); fail at ``--timeout`` (HostUnresolvableError if
    the name never resolved, else PeerError). ``attempt`` returns what went wrong, within the wait's deadline."""
    wait, whom, resolved = Wait(timeout), f"the chief {chief}", False
    while True:
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            resolved = True
            problem = attempt(wait)
        except socket.gaierror:
            problem = "its host name does not resolve yet"
        except OSError as exc:
            problem = exc.strerror or type(exc).__name__
        if problem == "":
            return
        if wait.expired:
            raise wait.error(whom, problem, PeerError if resolved else HostUnresolvableError)
        wait.say(whom, problem)
        wait.sleep(1.0)


def _hello_and_wait(host: str, port: int, hello: str, wait: Wait, peers: Sequence[Peer]) -> str:
    """Connect, say hello, and wait for GO: "" once released, else what went wrong."""
    with socket.create_connection((host, port), timeout=min(3.0, max(wait.left, 0.1))) as sock:
        sock.sendall(hello.encode())
        received = b""
        while not wait.expired:
            ready, _, _ = select.select([sock], [], [], max(min(LOG_EVERY, wait.left), 0.01))
            if not ready:
                wait.say(f"the other peers ({len(peers)} in all)", f"connected to the chief {peers[0]}, which "
                         "releases everyone together")
                continue
            chunk = sock.recv(64)
            if not chunk:
                return "the chief closed the connection (restarting?)"
            received += chunk
            if b"\n" in received:
                return "" if received.split(b"\n", 1)[0].strip() == b"GO" else "the chief answered something else"
    return "connected, but the chief did not release the peers in time"
