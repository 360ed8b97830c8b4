"""A lost peer known at once: each rank's liveness port (``lifecycle/watch/peers.py``) refuses connections once its
process is gone, so a survivor names it without watching the heartbeats for ``WINDOW`` seconds; a port that takes the
connection (a live or frozen process) or a host that does not answer leaves the decision to the heartbeats."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from entrypoint.lifecycle.watch import peers


class Store:
    """The job's store as the heartbeats use it: a dict."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def put(self, key: str, value: str) -> None:
        self.data[key] = value

    def fetch(self, key: str) -> str | None:
        return self.data.get(key)


def end(board: peers.PeerBoard) -> None:
    """Its process ended: beats stopped, and the kernel closed its liveness port (``stop`` leaves it open)."""
    board.stop()
    assert board._listener is not None
    board._listener.close()


def boards(store: Store, n: int) -> list[peers.PeerBoard]:
    members = [peers.Member(rank, f"workerpool{min(rank, 1)}-0", "h") for rank in range(n)]
    return [peers.PeerBoard(store, m, members, address="127.0.0.1").start() for m in members]


def test_a_peer_whose_process_is_gone_is_named_at_once_without_watching_its_heartbeat(monkeypatch: Any) -> None:
    store = Store()
    me, alive, dead = boards(store, 3)
    try:
        dead.step = 7
        dead._beat()
        me._beat()  # its heartbeat thread reaches every peer's port once
        end(dead)  # its process ended: its liveness port is closed, as the kernel closes a killed process's
        monkeypatch.setattr(peers.time, "sleep", lambda _s: pytest.fail("watched the heartbeats"))
        found = me.silent()
        assert [s.member.rank for s in found] == [2]
        assert found[0].step == 7 and "liveness port refuses" in found[0].why
        assert "workerpool1-0 (rank 2, host h) stopped responding (its process is gone" in peers.describe(found)
    finally:
        me.stop()
        alive.stop()


def test_live_peers_leave_the_verdict_to_the_heartbeats(monkeypatch: Any) -> None:
    store = Store()
    me, alive = boards(store, 2)
    watched: list[float] = []
    monkeypatch.setattr(peers.time, "sleep", watched.append)
    try:
        assert me.gone() == []  # the port takes the connection: not known to be gone
        me.silent(window=0.25)
        assert watched == [0.25]  # so the heartbeats decide, as before
    finally:
        me.stop()
        alive.stop()


def test_a_rank_without_a_liveness_port_is_watched_as_before() -> None:
    store = Store()
    members = [peers.Member(0, "workerpool0-0", "h"), peers.Member(1, "workerpool1-0", "h")]
    me = peers.PeerBoard(store, members[0], members)  # no address: nothing published, nothing knocked on
    assert "trainer/heartbeat/at/0" not in store.data
    assert me.gone() == []


def test_knocks_answer_refused_taken_and_no_answer_all_at_once() -> None:
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
        found = peers.knock({1: listening.getsockname(), 2: closed.getsockname(), 3: ("192.0.2.1", 9)}, timeout=0.3)
    assert found[1] is True and found[2] is False
    assert found[3] is not True  # TEST-NET-1: no answer (or a firewall's refusal, never trusted: next test)


def test_a_refusal_from_a_port_never_reached_says_nothing(monkeypatch: Any) -> None:
    store = Store()
    me, blocked = boards(store, 2)
    end(blocked)  # as a firewall that refuses every connection to the port from the start
    me._beat()
    assert me.gone() == []  # never reached: the heartbeats decide


def test_knocks_never_fill_the_port_s_queue_so_a_live_peer_never_looks_unreachable() -> None:
    store = Store()
    me, alive = boards(store, 2)
    try:
        me._beat()
        for _ in range(100):  # more than the listen queue holds: each beat empties it
            assert me.gone() == []
            alive._beat()
        assert peers.knock({1: alive._listener.getsockname()}) == {1: True}  # type: ignore[union-attr]
    finally:
        me.stop()
        alive.stop()


def test_a_replacement_s_new_port_counts_once_a_loss_was_looked_for_and_the_port_reached() -> None:
    store = Store()
    me, lost = boards(store, 2)
    try:
        me._beat()
        end(lost)  # lost, and restarted by the platform: its replacement listens on a port of its own
        replacement = peers.PeerBoard(store, lost.me, lost.members, address="127.0.0.1").start()
        me._beat()
        end(replacement)  # lost again
        assert me.gone() == []  # its new port was never reached: a refusal there says nothing yet
        replacement = peers.PeerBoard(store, lost.me, lost.members, address="127.0.0.1").start()
        me.silent(window=0.0)  # a loss was looked for: the group is changing, every port is reached again
        me._beat()  # the next beat reaches its port
        end(replacement)
        assert [s.member.rank for s in me.gone()] == [1]
    finally:
        me.stop()
