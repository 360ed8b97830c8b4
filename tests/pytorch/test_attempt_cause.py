"""A training attempt cut off by a lost peer ends on this rank's own failed checkpoint write when there is one
(``steps.Attempt``, ``failures.first_cause``): both ranks of a sharded save meet a full disk, one leaves first, and the
other must end ``disk_full`` as it did, not ``peer_lost`` (CI's test_sharded_disk_full, under load)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from entrypoint import errors
from entrypoint.errors import OutputError, PeerError

pytest.importorskip("torch")
pytestmark = pytest.mark.pytorch

from entrypoint.pytorch.recovery.steps import Attempt  # noqa: E402


class Guard:
    """What an attempt asks of the step guard: whether it recovered in place, and the write in flight's end."""

    def __init__(self, written: BaseException | None, recovers: bool = False) -> None:
        self.written, self.recovers, self.waited = written, recovers, 0

    def recover(self, _state: Any, _exc: BaseException) -> bool:
        return self.recovers

    def writes_done(self) -> BaseException | None:
        self.waited += 1
        return self.written


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
