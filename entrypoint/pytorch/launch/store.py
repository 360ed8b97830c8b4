"""The job's TCPStore, owned by the node's launcher as torchrun's agent owns it, and the exit barrier.

torchrun's agent on node 0 hosts the store every process of the job meets in
(``TORCHELASTIC_USE_AGENT_STORE=True``: ``init_process_group`` connects to it as a client), and keeps
it up while its workers run. The launcher here does the same on both paths: in this process when the
node trains in it, for torch's agent (as its rendezvous) when the node runs several processes. When
the job spans nodes, the store is also the start-up barrier (``barrier.py``): node 0 serves it from
before anyone waits, the others reach it naming the chief while it starts, and node 0 releases them
together; a node restarted in place finds the job in progress there (survivors keep training). When
the node's processes succeeded, ``finish`` is the exit barrier: every node waits until every node is
done, and node 0, whose store the others talk to, leaves last, once every peer said it has left.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

from entrypoint.cluster.topology import Peer
from entrypoint.errors import PeerError
from entrypoint.lifecycle import signals
from entrypoint.lifecycle.waiting import LOG_EVERY, Wait, bounded
from entrypoint.pytorch.launch import barrier

log = logging.getLogger("entrypoint.pytorch")
BACKEND = "trainer-static"  # our rendezvous backend for torch's agent: a static one over this store
_stores: dict[str, NodeStore] = {}  # by run id: the handler torch's agent creates finds its store here


def job_run_id(host: str, port: int, trial: str | None) -> str:
    """The rendezvous id every node and process derives alike (torchrun's ``--rdzv-id``): the job's store keys."""
    return f"trainer-{host}-{port}-{trial or 'job'}"


def abandoned_key(run_id: str) -> str:
    """Set once the survivors gave up recovering in place (``Membership.abandon``): the attempt goes back to its
    newest checkpoint, so a node restarted now must not join it but meet the chief's next store."""
    return f"trainer/{run_id}/live/abandoned"


class NodeStore:
    """This node's handle on the job's store: the server on node 0, a client elsewhere."""

    def __init__(self, host: str, port: int, node_rank: int, num_nodes: int, timeout: float, run_id: str,
                 peers: Sequence[Peer] = (), in_place: bool = False) -> None:
        self.host, self.port, self.node_rank, self.num_nodes = host, port, node_rank, num_nodes
        self.timeout, self.run_id, self.in_place = timeout, run_id, in_place
        self.joined = False  # a node restarted in place, joining a job already past its start-up barrier
        if num_nodes > 1 and len(peers) == num_nodes:
            wait = Wait(timeout)
            while True:
                self.store: Any = barrier.open_store(host, port, node_rank == 0, timeout, peers[0])
                self.joined = barrier.meet(self.store, run_id, node_rank, peers, timeout)
                going = in_place and self.store.check([abandoned_key(run_id)])
                if not self.joined or (in_place and not going):
                    return
                # The job runs on without this node and will not take it in (--recovery restart, or a script; or
                # its survivors gave up recovering in place): its peers are being restarted too. Wait for the
                # chief's store to go, then meet the new one.
                log.info("the job's other replicas are still running the previous attempt; waiting for the chief "
                         "%s to restart (%s)", peers[0], "its survivors go back to the newest checkpoint" if going
                         else "--recovery restart")
                if not self.store.check([self._key(f"node{node_rank}")]):  # unless its predecessor had finished
                    barrier.say_restarted(self.store, run_id, node_rank)  # the chief ends that attempt at once
                barrier.wait_gone(self.store, wait, peers[0])
                del self.store
        if node_rank == 0:
            self.store = barrier.serve_store(host, port, timeout)
            return
        from torch.distributed import TCPStore

        chief = f"the chief's store at {host}:{port}"
        self.store = bounded(lambda: TCPStore(host, port, None, False, timedelta(seconds=timeout),
                                              wait_for_workers=False), Wait(timeout), chief, barrier.SILENT)

    def _key(self, name: str) -> str:
        return f"trainer/{self.run_id}/exit/{name}"

    def leave_together(self) -> None:
        """The exit barrier after this node's processes succeeded; node 0 returns once every peer has left."""
        if self.num_nodes <= 1:
            return
        try:
            self._leave()
        except RuntimeError as exc:  # torch's DistNetworkError & co.: node 0 went away first (a script's os._exit)
            log.warning("node %d: the job's store on node 0 went away before every node finished (%s); leaving "
                        "(this node's processes succeeded)", self.node_rank, " ".join(str(exc).split())[:200])

    def _leave(self) -> None:
        store = self.store
        store.set(self._key(f"node{self.node_rank}"), "done")
        if store.add(self._key("arrived"), 1) >= self.num_nodes:
            store.set(self._key("all"), "1")
        if not self._wait(lambda: store.check([self._key("all")]), "to finish"):
            return
        if self.node_rank != 0:
            store.add(self._key("left"), 1)  # our last word to node 0's store: it may go now
            return
        self._wait(lambda: store.add(self._key("left"), 0) >= self.num_nodes - 1, "to leave")

    def _wait(self, done: Any, what: str) -> bool:
        """Poll ``done()`` until it holds (True) or ``--timeout`` passes (a warning, False): the job succeeded."""
        wait = Wait(self.timeout, context=f"node {self.node_rank}", first_after=LOG_EVERY, logger=log)
        try:
            wait.until(lambda: None if done() else (f"{self._missing()} {what}", ""))
        except PeerError as exc:
            log.warning("node %d: %s; leaving without them (this node's processes succeeded)", self.node_rank, exc)
            return False
        return True

    def _missing(self) -> str:
        absent = [f"node {r}" for r in range(self.num_nodes) if not self.store.check([self._key(f"node{r}")])]
        return ", ".join(absent) or "the other nodes"


@contextlib.contextmanager
def node_store(host: str, port: int, node_rank: int, num_nodes: int, timeout: float, run_id: str,
               peers: Sequence[Peer] = (), in_place: bool = False) -> Iterator[NodeStore]:
    """Host (node 0) or reach the job's store for the duration of the block; torch's agent can find it by run id.

    A stop signal while the node meets its peers (nothing to save yet) ends it at once, recorded (128 + N)."""
    with signals.stop_at_once("meeting the other replicas at the start-up barrier"):
        store = NodeStore(host, port, node_rank, num_nodes, timeout, run_id, peers, in_place)
    _stores[run_id] = store
    try:
        yield store
    finally:
        del _stores[run_id]


def register_backend() -> None:
    """Make ``BACKEND`` a rendezvous backend torch's agent can name (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create_handler)


def _create_handler(params: Any) -> Any:
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo, RendezvousStoreInfo

    class StoreRendezvous(RendezvousHandler):
        """torch's static rendezvous over the node's own store (which outlives the agent's run)."""

        def __init__(self, node: NodeStore) -> None:
            self.node = node

        def get_backend(self) -> str:
            return BACKEND

        @property
        def use_agent_store(self) -> bool:
            return True

        def next_rendezvous(self) -> Any:
            from torch.distributed import PrefixStore

            node = self.node
            return RendezvousInfo(PrefixStore(node.run_id, node.store), node.node_rank, node.num_nodes,
                                  RendezvousStoreInfo(node.host, node.port))

        def is_closed(self) -> bool:
            return False

        def set_closed(self) -> None:
            pass

        def num_nodes_waiting(self) -> int:
            return 0

        def get_run_id(self) -> str:
            return self.node.run_id

        def shutdown(self) -> bool:
            return True

    return StoreRendezvous(_stores[params.run_id])
