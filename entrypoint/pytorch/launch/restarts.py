"""Node 0 ends its attempt at once when a peer node says it was restarted meanwhile (nodes that restart together).

With ``--recovery restart`` (or a script), a node the platform restarts while the job's attempt runs cannot join that
attempt: it waits for the chief to restart, then meets everyone anew (``store.py``). The chief's attempt usually ends
by itself, its ranks failing on the lost peer. Not when the node was lost again while it started, after the start-up
barrier and before its processes met the others (a node preempted twice in a row): the chief's ranks would wait
``--timeout`` in their rendezvous for processes that no longer exist, while the node's replacement waits for the
chief. So while node 0's processes run, it watches the job's store for a peer node saying it was restarted
(``barrier.say_restarted``): then the attempt is over, and node 0 ends it at once, naming that node, its processes
killed (none of them can finish it), its failure recorded (a lost peer, 129, retryable: the platform restarts the
chief, and everyone meets anew). Nodes restarted in place into survivors' groups (``--recovery in-place``) never say
it: they join the running attempt.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import timedelta

from entrypoint import failures
from entrypoint.errors import PeerError
from entrypoint.lifecycle import recorder, shutdown, signals
from entrypoint.periodic import Periodic
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.launch import barrier
from entrypoint.pytorch.launch.store import NodeStore

log = logging.getLogger("entrypoint.pytorch")
POLL = 0.25  # seconds between two looks at the store


@contextlib.contextmanager
def watched(plan: Plan, store: NodeStore, ctx: failures.FailureContext) -> Iterator[None]:
    """On node 0 of a job whose nodes restart together: while the block runs, a peer node's restart ends the
    attempt (this process included); elsewhere nothing."""
    if store.node_rank != 0 or store.num_nodes <= 1 or store.in_place:
        yield
        return
    from torch.distributed import TCPStore

    client = TCPStore(store.host, store.port, is_master=False, timeout=timedelta(seconds=5), wait_for_workers=False)

    def look() -> bool:
        back = barrier.restarted(client, store.run_id, store.num_nodes)
        if back and not watch.stopping:
            end_attempt(plan, back, ctx)
        return True

    # an error of the store's (torch's DistNetworkError & co.): it is going away with this node; nothing to watch
    watch = Periodic("node-restarts", look, POLL, on_error=lambda _exc: False).start()
    try:
        yield
    finally:
        watch.stop()


def lost_nodes(plan: Plan, nodes: list[int]) -> PeerError:
    """The error that ends an attempt whose ``nodes`` were restarted meanwhile, naming them."""
    peers = plan.topology.training_peers()
    named = ", ".join(f"{peers[n]} (node {n})" if n < len(peers) else f"node {n}" for n in nodes)
    return PeerError(f"{named} was restarted while this attempt ran: its processes of this attempt are gone, and a "
                     "restarted node joins only a new attempt (--recovery restart, or a script); this attempt ends "
                     "now instead of waiting --timeout for them, and the job restarts with the node")


def end_attempt(plan: Plan, nodes: list[int], ctx: failures.FailureContext) -> None:
    """End this node's attempt now: its processes killed (none can finish it), its failure recorded and named."""
    error = lost_nodes(plan, nodes)
    log.warning("%s", error)
    signals.kill_descendants()
    recorder.ending_abruptly()  # a training in this process (one process a node) keeps what it trained in the ledger
    own = failures.write_record(ctx, failures.classify(error))
    shutdown.now(failures.finish(ctx, own))
