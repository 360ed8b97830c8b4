"""Node 0 ends an attempt a restarted peer node cannot join (``pytorch/launch/restarts.py``), against a real torch
store: what a restarted node says, what node 0 watches for and when. The whole path, a node lost twice in a row,
is ``test_lost_twice.py``."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = pytest.mark.pytorch

from entrypoint.cluster.topology import Peer  # noqa: E402
from entrypoint.errors import PeerError  # noqa: E402
from entrypoint.lifecycle.startup.ports import free_ports  # noqa: E402
from entrypoint.pytorch.launch import barrier, restarts  # noqa: E402

PEERS = (Peer("workerpool0[0]", "chief:2222"), Peer("workerpool1[0]", "worker-0:2222"),
         Peer("workerpool1[1]", "worker-1:2222"))
PLAN: Any = SimpleNamespace(topology=SimpleNamespace(training_peers=lambda: PEERS))


def test_a_restarted_node_is_found_by_one_look_and_named() -> None:
    from torch.distributed import HashStore

    store = HashStore()
    assert barrier.restarted(store, "run", 3) == []
    barrier.say_restarted(store, "run", 2)
    assert barrier.restarted(store, "run", 3) == [2]
    assert barrier.restarted(store, "another-run", 3) == []  # another job's (or trial's) keys
    error = restarts.lost_nodes(PLAN, [2])
    assert isinstance(error, PeerError)
    assert str(error).startswith("workerpool1[1] (worker-1:2222) (node 2) was restarted while this attempt ran")


def watching(monkeypatch: pytest.MonkeyPatch, **node: Any) -> tuple[Any, Any, threading.Event, list[list[int]]]:
    """A real TCPStore served here, node 0's view of it, and what ``end_attempt`` was called with (not the real one:
    it ends this process)."""
    from torch.distributed import TCPStore

    port = free_ports(1)[0]
    server = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10), wait_for_workers=False)
    client = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10), wait_for_workers=False)
    view = SimpleNamespace(**{"host": "127.0.0.1", "port": port, "run_id": "run", "node_rank": 0, "num_nodes": 3,
                              "in_place": False, **node})
    ended, calls = threading.Event(), []

    def end(_plan: Any, nodes: list[int], _ctx: Any) -> None:
        calls.append(nodes)
        ended.set()

    monkeypatch.setattr(restarts, "end_attempt", end)
    view.server = server  # kept alive while the test runs
    return view, client, ended, calls


def test_node_0_ends_its_attempt_once_a_peer_node_says_it_was_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    store, client, ended, calls = watching(monkeypatch)
    with restarts.watched(PLAN, store, None):
        assert not ended.wait(3 * restarts.POLL)  # nobody restarted: the attempt runs on
        barrier.say_restarted(client, "run", 1)
        assert ended.wait(10), "node 0 did not end the attempt a restarted node cannot join"
    assert calls[0] == [1]


@pytest.mark.parametrize("node", [{"in_place": True}, {"node_rank": 1}, {"num_nodes": 1}],
                         ids=["survivors-keep-training", "not-node-0", "one-node"])
def test_nothing_is_watched_where_a_restarted_node_joins_or_nobody_decides(monkeypatch: pytest.MonkeyPatch,
                                                                           node: dict[str, Any]) -> None:
    store, client, ended, _ = watching(monkeypatch, **node)
    with restarts.watched(PLAN, store, None):
        barrier.say_restarted(client, "run", 1)
        assert not ended.wait(4 * restarts.POLL)


def test_a_restart_said_after_the_nodes_processes_ended_ends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the block (the node's processes succeeded: the exit barrier), a late restart is no reason to fail."""
    store, client, ended, _ = watching(monkeypatch)
    with restarts.watched(PLAN, store, None):
        pass
    barrier.say_restarted(client, "run", 1)
    assert not ended.wait(4 * restarts.POLL)


@pytest.mark.parametrize("finished", [False, True], ids=["lost-mid-attempt", "lost-after-finishing-its-part"])
def test_a_node_restarted_into_a_running_attempt_says_so_unless_its_predecessor_had_finished(finished: bool) -> None:
    """A restarted node that cannot join (``--recovery restart``) says it was restarted, so node 0 ends the attempt;
    not when its predecessor had already finished its part (it said so at the exit barrier): that attempt may still
    succeed without it."""
    from torch.distributed import TCPStore

    from entrypoint.pytorch.launch.store import NodeStore

    port = free_ports(1)[0]
    chief = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10), wait_for_workers=False)
    chief.set("trainer/run/barrier/go", "1")  # the attempt runs: node 1 joins past its start-up barrier
    if finished:
        chief.set("trainer/run/exit/node1", "done")
    peers = (Peer("workerpool0[0]", f"127.0.0.1:{port}"), Peer("workerpool1[0]", "127.0.0.1:1"))
    with pytest.raises(PeerError, match="waiting for the chief workerpool0"):  # the chief never goes: --timeout
        NodeStore("127.0.0.1", port, 1, 2, 1.5, "run", peers, in_place=False)
    assert barrier.restarted(chief, "run", 2) == ([] if finished else [1])


@pytest.mark.parametrize("abandoned", [False, True], ids=["recovering-in-place", "going-back-to-its-checkpoint"])
def test_a_node_restarted_while_the_survivors_give_up_waits_for_the_chiefs_next_store(abandoned: bool) -> None:
    """Survivors keep training (``in_place``): a restarted node joins the attempt in progress, unless the survivors
    gave up on it (a replacement refused, a heal that cannot be: ``Membership.abandon``); then it waits for the
    chief's store to go and meets the next one, rather than join an attempt whose processes are leaving (its ranks
    then waited --timeout on the next store, where nobody would take them in)."""
    from torch.distributed import TCPStore

    from entrypoint.pytorch.launch.store import NodeStore, abandoned_key

    port = free_ports(1)[0]
    chief = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10), wait_for_workers=False)
    chief.set("trainer/run/barrier/go", "1")
    if abandoned:
        chief.set(abandoned_key("run"), "1")
    peers = (Peer("workerpool0[0]", f"127.0.0.1:{port}"), Peer("workerpool1[0]", "127.0.0.1:1"))
    if not abandoned:
        assert NodeStore("127.0.0.1", port, 1, 2, 1.5, "run", peers, in_place=True).joined
        return
    with pytest.raises(PeerError, match="waiting for the chief workerpool0"):  # the chief never goes: --timeout
        NodeStore("127.0.0.1", port, 1, 2, 1.5, "run", peers, in_place=True)
    assert barrier.restarted(chief, "run", 2) == [1]
