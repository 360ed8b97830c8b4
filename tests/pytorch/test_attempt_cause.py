"""A training attempt cut off by a lost peer ends on this rank's own failed checkpoint write when there is one
(``steps.Attempt``, ``failures.first_cause``): both ranks of a sharded save meet a full disk, one leaves first, and the
other must end ``disk_full`` as it did, not ``peer_lost`` (CI's test_sharded_disk_full, under load)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from entrypoint import errors
from entrypoint.errors import OutputError, PeerError
from entrypoint.lifecycle.signals import StopRequest

pytest.importorskip("torch")
pytestmark = pytest.mark.pytorch

from entrypoint.pytorch.recovery.steps import Attempt  # noqa: E402


class Writer:
    """The checkpoint writer's wait: the write in flight's failure, raised."""

    def __init__(self, written: BaseException | None) -> None:
        self.written, self.waited = written, 0

    def wait(self) -> None:
        self.waited += 1
        if self.written is not None:
            raise self.written


class Guard:
    """What an attempt asks of the step guard: whether it recovered in place, the stop request, the writer."""

    def __init__(self, written: BaseException | None, recovers: bool = False) -> None:
        self.recovers = recovers
        self.request = StopRequest()
        self.saver = SimpleNamespace(io=Writer(written))

    @property
    def waited(self) -> int:
        return int(self.saver.io.waited)

    def recover(self, _state: Any, _exc: BaseException) -> bool:
        return self.recovers


def ended(guard: Guard, exc: BaseException) -> BaseException | None:
    try:
        with Attempt(cast(Any, guard), cast(Any, None)):
            raise exc
    except BaseException as raised:  # what the attempt let out
        return raised
    return None


def test_a_lost_peer_gives_way_to_this_rank_s_own_failed_write() -> None:
    disk = OutputError(errors.DISK_FULL, "no space left on device at /ckpt/.partial-ckpt-00000020/__1_0.distcp")
    peer = PeerError("a peer is gone")
    guard = Guard(disk)
    assert ended(guard, peer) is disk and guard.waited == 1
    assert disk.__cause__ is peer


def test_a_lost_peer_stays_the_failure_without_a_failed_write_of_its_own() -> None:
    peer = PeerError("a peer is gone")
    assert ended(Guard(None), peer) is peer
    assert ended(Guard(PeerError("the write was cut off by the same loss")), peer) is peer


def test_the_user_s_own_error_is_never_replaced_and_a_recovery_waits_for_nothing() -> None:
    user = ValueError("the user's own error")
    assert ended(Guard(OutputError(errors.DISK_FULL, "full")), user) is user
    guard = Guard(OutputError(errors.DISK_FULL, "full"), recovers=True)
    assert ended(guard, PeerError("a peer is gone")) is None and guard.waited == 0  # recovered in place
