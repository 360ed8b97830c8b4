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

from entrypoint.pytorch.launch.membership import Membership, fingerprint  # noqa: E402

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
    verdict = chief._decide(1)
    writer.join()
    assert verdict.go, verdict.why
    assert verdict.joiners == {2: 1}


def test_a_replacement_with_another_model_is_still_refused() -> None:
    store = torch.distributed.HashStore()
    chief, survivor, _ = members(store)
    store.set(survivor._key("g1", "here", 1), json.dumps({"step": 8}))
    store.add(chief._key("joins", 2), 1)
    store.set(chief._key("join", 2, 1), json.dumps(fingerprint(3, [("0.weight", (64, 64))], "code")))
    verdict = chief._decide(1)
    assert not verdict.go
    assert "the replacement of 2 was refused: it has model parameters (1 tensors)" in verdict.why
