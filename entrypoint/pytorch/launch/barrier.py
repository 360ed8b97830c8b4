"""PyTorch's start-up barrier, in the job's store: the chief's TCPStore at its cluster address, up from the start.

The store the process group meets in is hosted on node 0 from before anyone waits, so there is one
listener on the chief's port for the whole life of the chief, and a node restarted in place (a
replacement, for survivors that keep training) finds a job in progress there instead of a barrier
that is long gone. Every other node reaches the store (resolving the chief's name and retrying while
the chief starts), says it arrived, and waits for node 0's ``go``; both sides wait through
``waiting.Wait`` (whom they wait for, every 20 s; one error naming them at ``--timeout``), as the socket
barrier does for TensorFlow and Horovod. A store client's handshake is bounded by the same deadline: a port
that accepts connections but never answers (a frozen chief, another program on it) cannot hold a node longer.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from entrypoint.cluster.topology import Peer
from entrypoint.errors import ConfigError
from entrypoint.lifecycle.startup.rendezvous import reach_chief
from entrypoint.lifecycle.waiting import Pending, Wait

log = logging.getLogger("entrypoint")
_SLICE = 3.0  # seconds an attempt waits for the store's handshake before saying so (and waiting on)
SILENT = "its port accepts connections but the job's store there never answered"


def open_store(host: str, port: int, hosts: bool, timeout: float, chief: Peer) -> Any:
    """Node 0: the job's store, served on ``port``; elsewhere a client of it (naming the chief while it waits)."""
    from torch.distributed import TCPStore

    if hosts:
        return serve_store(host, port, timeout)
    found: list[Any] = []
    pending: list[Pending[Any]] = []

    def attempt(wait: Wait) -> str:
        if not pending:
            socket.create_connection((host, port), timeout=min(3.0, max(wait.left, 0.1))).close()
            pending.append(Pending(lambda: TCPStore(host, port, None, False, timedelta(seconds=max(wait.left, 1.0)),
                                                    wait_for_workers=False), "store-handshake"))
        try:
            done, store = pending[0].result(min(_SLICE, wait.left))
        except Exception as exc:  # torch's DistNetworkError & co.: the chief's store went away meanwhile; retry
            pending.clear()
            return f"the job's store there failed ({type(exc).__name__})"
        if not done:
            return SILENT
        found.append(store)
        return ""

    reach_chief(host, port, timeout, chief, attempt)
    return found[0]


def serve_store(host: str, port: int, timeout: float) -> Any:
    """The job's store served on ``port`` of this node (node 0); a port another process holds is named."""
    from torch.distributed import TCPStore

    check_port_free(port)
    try:
        return TCPStore(host, port, None, True, timedelta(seconds=timeout), wait_for_workers=False,
                        multi_tenant=True)
    except RuntimeError:
        check_port_free(port)  # taken meanwhile: say so; else torch's own error stands
        raise


def check_port_free(port: int) -> None:
    """ConfigError when another process listens on ``port`` of this host (the chief's store cannot serve there).

    Asked of the kernel (a bind, as the store binds), not read from an error message.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("", port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port}", "already in use on this host by another process: the chief hosts the "
                              "job's store there (free the port, or give the chief another one)") from None
    finally:
        probe.close()


def meet(store: Any, run: str, node: int, peers: Sequence[Peer], timeout: float) -> bool:
    """Every node arrives; node 0 releases them together. True for a node that joins a job already running."""
    key = f"trainer/{run}/barrier/"
    if node != 0 and store.check([key + "go"]):
        log.info("joining a job in progress as %s (the others passed the start-up barrier already)", peers[node])
        return True
    wait = Wait(timeout)
    if node != 0:
        store.set(key + f"arrived/{node}", peers[node].name)
        released = (f"the other peers ({len(peers)} in all)", f"connected to the chief {peers[0]}, which releases "
                    "everyone together")
        wait.until(lambda: None if store.check([key + "go"]) else released)
        return False

    def arriving() -> tuple[str, str] | None:
        absent = [p for i, p in enumerate(peers) if i and not store.check([key + f"arrived/{i}"])]
        return (f"{len(absent)} of {len(peers) - 1} peers", ", ".join(map(str, absent))) if absent else None

    wait.until(arriving)
    store.set(key + "go", "1")
    log.info("all %d replicas are here (%s)", len(peers), ", ".join(p.name for p in peers))
    return False


def say_restarted(store: Any, run: str, node: int) -> None:
    """A node restarted while the job's attempt runs, that cannot join it (``--recovery restart``, a script), says so:
    the attempt's processes of this node are gone, so node 0 ends the attempt at once (``restarts.py``) rather than
    wait ``--timeout`` for them (they may never have met the others: a node lost again while it started)."""
    store.set(f"trainer/{run}/barrier/restarted/{node}", "1")
    store.add(f"trainer/{run}/barrier/restarted", 1)  # last: whoever sees the count finds the node's key


def restarted(store: Any, run: str, num_nodes: int) -> list[int]:
    """The nodes that said they were restarted while this attempt ran (``say_restarted``); one look at the store
    while none did."""
    if not store.add(f"trainer/{run}/barrier/restarted", 0):
        return []
    return [node for node in range(1, num_nodes) if store.check([f"trainer/{run}/barrier/restarted/{node}"])]


def wait_gone(store: Any, wait: Wait, chief: Peer) -> None:
    """Poll the chief's store until it goes away (its process ended); PeerError at the wait's deadline."""

    def running() -> tuple[str, str] | None:
        try:
            store.check(["trainer/alive"])
        except Exception:  # torch's DistNetworkError & co.: the chief's process is gone
            return None
        return f"the chief {chief} to restart", "it still runs the previous attempt"

    wait.until(running, poll=0.2)
