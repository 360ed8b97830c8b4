"""Which node left a script's job: every node's heartbeat in the job's store, read when a collective fails.

The hooks loop names a lost rank by its heartbeats (``recovery/guard.py``). A script has none, and gloo names a lost
peer by an address and an ephemeral port: a worker that leaves early (its script's ``os._exit(0)``, a killed
node) left the chief's last line blaming the chief itself. So while a script runs on a node of several, the node
publishes a heartbeat in the job's store (``lifecycle/watch/peers.py``, a prefix of its own) and its replica's name;
when the script fails with a lost peer, the nodes whose heartbeat stopped are named in a verdict record on their
behalf, which the last line then names as the root cause.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from entrypoint import errors, failures
from entrypoint.lifecycle.watch import peers
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.launch.store import NodeStore

log = logging.getLogger("entrypoint.pytorch")


def _prefix(store: NodeStore) -> str:
    return f"trainer/{store.run_id}/nodes/"


@contextlib.contextmanager
def watched(plan: Plan, store: NodeStore, ctx: failures.FailureContext) -> Iterator[None]:
    """Beat for this node while the block runs; a lost peer raised in it first names the nodes that went silent."""
    if store.num_nodes <= 1 or plan.code is None or plan.code.kind == "hooks":
        yield
        return
    from torch.distributed import TCPStore

    from entrypoint.pytorch.launch.collectives import TorchStore

    kv = TorchStore(TCPStore(store.host, store.port, is_master=False, timeout=timedelta(seconds=5),
                             wait_for_workers=False))
    me = peers.Member(store.node_rank, plan.topology.replica_name, socket.gethostname())
    kv.put(f"{_prefix(store)}{me.rank}/name", json.dumps([me.replica, me.host]))
    board = peers.PeerBoard(kv, me, [me], prefix=f"{_prefix(store)}beat/").start()
    try:
        yield
    except Exception as exc:
        if failures.is_peer_lost(exc):
            _name_the_silent(board, kv, store, plan, ctx)
        raise
    finally:
        board.stop()


def _name_the_silent(board: peers.PeerBoard, kv: Any, store: NodeStore, plan: Plan,
                     ctx: failures.FailureContext) -> None:
    """Record, for each node whose heartbeat stopped, that it left the job (this node is the witness)."""
    names = [peer.name for peer in plan.topology.training_peers()]
    members = []
    for node in range(store.num_nodes):
        replica, host = names[node] if node < len(names) else f"node rank {node}", "unknown"
        with contextlib.suppress(Exception):  # a node that never said its name: named by its place in the cluster
            said = json.loads(kv.fetch(f"{_prefix(store)}{node}/name") or "null")
            if said:
                replica, host = said
        members.append(peers.Member(node, replica, host))
    board.members = members
    for silent in board.silent():
        where = plan.topology.training_peers()
        peer = where[silent.member.rank] if silent.member.rank < len(where) else silent.member.replica
        failures.record_verdict(ctx, silent.member.replica, None, errors.PEER_LOST,
                                f"{peer} left the job while it ran ({silent.why}): its script ended early, or "
                                "its node was lost")
        log.warning("%s (node %d) left the job while it ran (%s)", peer, silent.member.rank, silent.why)
