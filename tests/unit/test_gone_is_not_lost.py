"""Gone is not lost (``failures.record_verdict``, ``failures.first_cause``): a peer whose process ended on a failure
it recorded itself gets no ``peer_lost`` verdict from the survivor that found it gone (its heartbeat stopped, its
liveness port refuses), and a rank whose own checkpoint write failed ends on that failure, not on the peer that met
the same one first and left the group. Its liveness port closes with the process, after that record is written."""

from __future__ import annotations

import errno
import time
from pathlib import Path

from entrypoint import errors, failures
from entrypoint.errors import OutputError, PeerError
from entrypoint.failures.records import read_records
from entrypoint.lifecycle.watch import peers


def context(job_dir: Path, replica: str, rank: int | None) -> failures.FailureContext:
    return failures.FailureContext(replica=replica, rank=rank, job_dir=str(job_dir), started=time.time() - 5)


def test_a_peer_that_recorded_its_own_failure_gets_no_verdict(tmp_path: Path) -> None:
    failed = context(tmp_path, "workerpool1-0", 1)
    own = failures.write_record(failed, failures.Failure(errors.DISK_FULL, "no space left on device at /ckpt/x"))
    survivor = context(tmp_path, "workerpool0-0", 0)
    named = failures.record_verdict(survivor, "workerpool1-0", 1, errors.PEER_LOST, "stopped responding")
    assert named == own and not named.reported_by  # its own record, returned: it failed, it was not lost
    assert [r.failure_class for r in read_records(str(tmp_path), 0.0)] == ["disk_full"]  # no verdict written


def test_a_peer_that_recorded_nothing_is_lost(tmp_path: Path) -> None:
    survivor = context(tmp_path, "workerpool0-0", 0)
    failures.write_record(context(tmp_path, "workerpool1-0", 2), failures.Failure(errors.USER_CODE, "another rank's"))
    failures.record_verdict(context(tmp_path, "workerpool1-0", None), "workerpool1-0", 1, errors.PEER_LOST,
                            "its supervisor's verdict")  # a witness's verdict is not the peer's own record
    named = failures.record_verdict(survivor, "workerpool1-0", 1, errors.PEER_LOST, "stopped responding")
    assert named.failure_class == "peer_lost" and named.reported_by == "workerpool0-0 (rank 0)"
    assert (named.replica, named.rank, named.message) == ("workerpool1-0", 1, "stopped responding")


def test_a_failure_recorded_before_this_process_started_is_an_earlier_attempt_s(tmp_path: Path) -> None:
    failures.write_record(context(tmp_path, "workerpool1-0", 1), failures.Failure(errors.DISK_FULL, "long ago"))
    survivor = failures.FailureContext(replica="workerpool0-0", rank=0, job_dir=str(tmp_path),
                                       started=time.time() + 10)  # the restart after it
    named = failures.record_verdict(survivor, "workerpool1-0", 1, errors.PEER_LOST, "stopped responding")
    assert named.reported_by and named.failure_class == "peer_lost"


def test_a_node_that_left_is_lost_unless_one_of_its_processes_recorded_a_failure(tmp_path: Path) -> None:
    witness = context(tmp_path, "workerpool0-0", 0)
    left = failures.record_verdict(witness, "workerpool1-0", None, errors.PEER_LOST, "left the job")
    assert left.reported_by  # a script's node that ended early, or was lost: nothing of its own recorded
    own = failures.write_record(context(tmp_path, "workerpool1-1", 3), failures.Failure(errors.USER_CODE, "x"))
    assert failures.record_verdict(witness, "workerpool1-1", None, errors.PEER_LOST, "left the job") == own


def test_a_rank_ends_on_its_own_failed_write_not_on_the_peer_that_left_first() -> None:
    peer = PeerError("a peer is gone")
    disk = OutputError(errors.DISK_FULL, "no space left on device at /ckpt/.partial-ckpt-00000020/__1_0.distcp")
    assert failures.first_cause(peer, disk) is disk
    assert failures.first_cause(peer, None) is peer  # nothing of its own failed: the lost peer it is
    assert failures.first_cause(peer, PeerError("the write was cut off by the same loss")) is peer
    user = ValueError("the user's own error")
    assert failures.first_cause(user, disk) is user  # a failure that is not a consequence stays the cause
    full = OSError(errno.ENOSPC, "No space left on device", "/ckpt/x")
    assert failures.first_cause(peer, None, full) is full


def test_a_stopped_board_s_liveness_port_stays_open_until_its_process_ends() -> None:
    store: dict[str, str] = {}

    class Store:
        def put(self, key: str, value: str) -> None:
            store[key] = value

        def fetch(self, key: str) -> str | None:
            return store.get(key)

    members = [peers.Member(0, "workerpool0-0", "h"), peers.Member(1, "workerpool1-0", "h")]
    me, leaving = (peers.PeerBoard(Store(), m, members, address="127.0.0.1").start() for m in members)
    try:
        me._beat()  # reaches the peer's port
        leaving.stop()  # the guard's end, before the process records its failure and exits
        assert leaving._listener is not None
        assert peers.knock({1: leaving._listener.getsockname()}) == {1: True}
        assert me.gone() == []  # not gone yet: its record may still be on its way
        leaving._listener.close()  # the process ended: the kernel closes the port
        assert [s.member.rank for s in me.gone()] == [1]
    finally:
        me.stop()
