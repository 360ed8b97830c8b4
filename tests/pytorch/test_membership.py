"""Rank 0's decision on re-forming the group, against a real torch store (the in-process ``HashStore``, the same
set/get/add/check protocol as the job's TCPStore), with the other ranks' steps written in the order they race in.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = pytest.mark.pytorch

from entrypoint.errors import PeerError  # noqa: E402
from entrypoint.pytorch.launch.membership import JobFinished, Membership, fingerprint  # noqa: E402

PRINT = fingerprint(3, [("0.weight", (128, 64)), ("0.bias", (128,))], "code")


def members(store: object) -> list[Membership]:
    group = [Membership(store, "run", rank, 3, timeout=20) for rank in range(3)]
    for member in group:
        member.fingerprint = PRINT
    return group


class Watched:
    """The store, telling (``looked``) when a reader checked for ``key`` and did not find it."""

    def __init__(self, store: Any, key: str) -> None:
        self.store, self.key, self.looked = store, key, threading.Event()

    def check(self, keys: list[str]) -> bool:
        found = bool(self.store.check(keys))
        if self.key in keys and not found:
            self.looked.set()
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_replacement_counted_in_but_not_yet_described_is_awaited_not_refused() -> None:
    """A replacement counts itself in (``joins``) and then writes its fingerprint: two store calls. Rank 0 deciding
    between them once read an empty fingerprint and refused the replacement ("world size None instead of 3"),
    sending every survivor back to the checkpoint; seen on a loaded CI machine."""
    real = torch.distributed.HashStore()
    store = Watched(real, members(real)[0]._key("join", 2, 1))
    chief, survivor, _ = members(store)
    store.set(survivor._key("g1", "here", 1), json.dumps({"step": 8}))  # rank 1 survived
    store.add(chief._key("joins", 2), 1)  # the replacement of rank 2 counted itself in, and was descheduled

    def describe_later() -> None:  # once rank 0 has read between the two writes (the race, made certain)
        assert store.looked.wait(60), "rank 0 never looked for the replacement's fingerprint"
        store.set(chief._key("join", 2, 1), json.dumps(PRINT))

    writer = threading.Thread(target=describe_later)
    writer.start()
    verdict = chief._decide(1, set())
    writer.join()
    assert verdict.go, verdict.why
    assert verdict.joiners == {2: 1}


def test_a_replacement_with_another_model_is_still_refused() -> None:
    store = torch.distributed.HashStore()
    chief, survivor, _ = members(store)
    store.set(survivor._key("g1", "here", 1), json.dumps({"step": 8}))
    store.add(chief._key("joins", 2), 1)
    store.set(chief._key("join", 2, 1), json.dumps(fingerprint(3, [("0.weight", (64, 64))], "code")))
    verdict = chief._decide(1, set())
    assert not verdict.go
    assert "the replacement of 2 was refused: it has model parameters (1 tensors)" in verdict.why


def nodes(store: object, timeout: float = 20) -> list[Membership]:
    """2 nodes x 2 processes whose survivors train on with fewer replicas (HSDP by node)."""
    group = [Membership(store, "run", rank, 4, timeout=timeout) for rank in range(4)]
    for member in group:
        member.fingerprint = fingerprint(4, [("0.weight", (128, 64))], "code")
        member.shrink_by = 2
    return group


def test_hsdp_survivors_go_on_without_a_silent_node_and_take_its_replacement_in_once_all_of_it_announced() -> None:
    store = torch.distributed.HashStore()
    chief, survivor, lost, _ = nodes(store)
    chief.lost = lambda: {2, 3}  # their heartbeats stopped
    store.set(survivor._key("g1", "here", 1), json.dumps({"step": 9}))
    verdict = chief._decide(1, set())
    assert verdict.go and verdict.members == [0, 1] and verdict.joiners == {}, verdict
    chief.members = survivor.members = [0, 1]
    assert chief.fewer and not chief.ready()
    store.add(chief._key("joins", 2), 1)
    store.set(chief._key("join", 2, 1), json.dumps(lost.fingerprint))
    assert not chief.ready(), "a node is taken in whole: rank 3 has not announced itself yet"
    store.add(chief._key("joins", 3), 1)
    store.set(chief._key("join", 3, 1), json.dumps(lost.fingerprint))
    assert chief.ready()
    store.set(survivor._key("g2", "here", 1), json.dumps({"step": 24}))
    verdict = chief._decide(2, set())
    assert verdict.go and verdict.members == [] and verdict.joiners == {2: 1, 3: 1}, verdict  # every rank again


def test_a_node_only_partly_here_is_left_out_whole_and_its_survivor_says_why() -> None:
    store = torch.distributed.HashStore()
    chief, survivor, half, _ = nodes(store)
    chief.lost = lambda: {3}
    for member in (survivor, half):
        store.set(member._key("g1", "here", member.rank), json.dumps({"step": 9}))
    verdict = chief._decide(1, set())
    assert verdict.go and verdict.members == [0, 1], verdict
    chief._publish(verdict)
    with pytest.raises(PeerError, match=r"this node lost a process, so the others trained on without 2 \(rank 2\)"):
        half.reform(9)


def test_a_rank_that_neither_comes_nor_falls_silent_is_awaited_not_left_out() -> None:
    store = torch.distributed.HashStore()
    chief, _, _, _ = nodes(store, timeout=1.5)
    chief.lost = lambda: {2, 3}  # rank 1 is alive but late: its node is not left out for it
    verdict = chief._decide(1, set())
    assert not verdict.go and "workerpool" not in verdict.why and "1 (rank 1)" in verdict.why, verdict


def test_a_replacement_still_starting_when_the_survivors_finished_ends_at_once() -> None:
    """HSDP's survivors can finish the training before a lost node's replacement joins: it must not wait out
    --timeout for a group that is gone (its node's agent would hold the job's exit barrier meanwhile)."""
    store = torch.distributed.HashStore()
    chief, _, late, _ = nodes(store, timeout=30)
    chief.finish()
    with pytest.raises(JobFinished, match="the job's training ended while this replacement was starting"):
        late.joining()
    with pytest.raises(JobFinished):
        late.join(late.fingerprint)


def test_a_replacement_with_another_nproc_per_node_is_refused_at_once_naming_its_node() -> None:
    """2 nodes x 2 processes: the worker node comes back with one process (a GPU fewer), so its only rank is 1 of a
    world of 2, a rank that survived: rank 0 refuses it at once in one line naming it and why, instead of waiting
    for ranks 2 and 3 until --timeout (which would name them, not the cause)."""
    store = torch.distributed.HashStore()
    group = [Membership(store, "run", rank, 4, timeout=5) for rank in range(4)]
    for member in group:
        member.fingerprint = fingerprint(4, [("0.weight", (128, 64))], "code", 2, "workerpool0-0")
    chief, survivor = group[:2]
    store.set(survivor._key("g1", "here", 1), json.dumps({"step": 8}))
    store.add(chief._key("joins", 1), 1)
    store.set(chief._key("join", 1, 1), json.dumps(fingerprint(2, [("0.weight", (128, 64))], "code", 1,
                                                               "workerpool1-0")))
    verdict = chief._decide(1, set())
    assert not verdict.go
    assert verdict.why == ("the replacement of workerpool1-0 was refused: it has --nproc-per-node 1 instead of 2 "
                           "(world size 2 instead of 4)")
