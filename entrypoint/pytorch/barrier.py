"""PyTorch's start-up barrier, in the job's store: the chief's TCPStore at its cluster address, up from the start.

The store the process group meets in is hosted on node 0 from before anyone waits, so there is one
listener on the chief's port for the whole life of the chief, and a node restarted in place (a
replacement, for survivors that keep training) finds a job in progress there instead of a barrier
that is long gone. Every other node reaches the store (resolving the chief's name and retrying while
the chief starts), says it arrived, and waits for node 0's ``go``; both sides say every 20 s whom they
wait for, and give up at ``--timeout`` naming them, as the socket barrier does for TensorFlow and Horovod.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from entrypoint.cluster.topology import Peer
from entrypoint.errors import PeerError
from entrypoint.lifecycle.rendezvous import reach_chief

log = logging.getLogger("entrypoint")
LOG_EVERY = 20.0
_POLL = 0.05


def open_store(host: str, port: int, hosts: bool, timeout: float, chief: Peer) -> Any:
    """Node 0: the job's store, served on ``port``; elsewhere a client of it (naming the chief while it waits)."""
    from torch.distributed import TCPStore

    if hosts:
        return TCPStore(host, port, None, True, timedelta(seconds=timeout), wait_for_workers=False,
                        multi_tenant=True)
    found: list[Any] = []

    def attempt(deadline: float) -> str:
        socket.create_connection((host, port), timeout=min(3.0, max(deadline - time.monotonic(), 0.1))).close()
        found.append(TCPStore(host, port, None, False, timedelta(seconds=timeout), wait_for_workers=False))
        return ""

    reach_chief(host, port, timeout, chief, attempt)
    return found[0]


def meet(store: Any, run: str, node: int, peers: Sequence[Peer], timeout: float) -> bool:
    """Every node arrives; node 0 releases them together. True for a node that joins a job already running."""
    key = f"trainer/{run}/barrier/"
    if node != 0 and store.check([key + "go"]):
        log.info("joining a job in progress as %s (the others passed the start-up barrier already)", peers[node])
        return True
    deadline = time.monotonic() + timeout
    if node != 0:
        store.set(key + f"arrived/{node}", peers[node].name)
        _wait(lambda: [] if store.check([key + "go"]) else [peers[0]], deadline, timeout,
              "connected to the chief; waiting for the other peers ({n} in all)".replace("{n}", str(len(peers))))
        return False
    _wait(lambda: [p for i, p in enumerate(peers) if i and not store.check([key + f"arrived/{i}"])], deadline,
          timeout, "", len(peers) - 1)
    store.set(key + "go", "1")
    log.info("all %d replicas are here (%s)", len(peers), ", ".join(p.name for p in peers))
    return False


def wait_gone(store: Any, deadline: float, timeout: float, chief: Peer) -> None:
    """Poll the chief's store until it goes away (its process ended); PeerError at the deadline."""
    while time.monotonic() < deadline:
        try:
            store.check(["trainer/alive"])
        except Exception:  # torch's DistNetworkError & co.: the chief's process is gone
            return
        time.sleep(0.2)
    raise PeerError(f"the chief {chief} kept running the previous attempt for {timeout:g} s (--timeout) without "
                    f"restarting")


def _wait(missing: Any, deadline: float, timeout: float, waiting: str, expected: int = 1) -> None:
    """Poll ``missing()`` (the peers still awaited) until it is empty; log whom it waits for; fail at the deadline."""
    next_log = 0.0
    while absent := missing():
        now = time.monotonic()
        names = ", ".join(str(p) for p in absent)
        if now >= deadline:
            raise PeerError(f"peers never came within {timeout:g} s (--timeout): {names}" if not waiting else
                            f"the chief did not release the peers within {timeout:g} s (--timeout)")
        if now >= next_log:
            if waiting:
                log.info("%s; %.0f s left of --timeout %g", waiting, deadline - now, timeout)
            else:
                log.info("waiting for %d of %d peers: %s; %.0f s left of --timeout %g", len(absent), expected, names,
                         deadline - now, timeout)
            next_log = now + LOG_EVERY
        time.sleep(_POLL)
