"""The platform's advance notice (``lifecycle/watch/notice.py``) against a fake metadata server on 127.0.0.1: nothing
without a server, nothing from an answer without ``Metadata-Flavor: Google``, each notice once; and the grace-period
check."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from entrypoint.cluster.environments.settings import METADATA_HOST, metadata_host
from entrypoint.lifecycle.watch import notice
from entrypoint.lifecycle.watch.notice import MAINTENANCE, PREEMPTED, Notice, NoticeWatcher
from tests.metadata import FakeMetadata

GENEROUS = 60.0  # seconds to wait for an event on a loaded machine (the events come in well under a second)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


def next_notice(watcher: NoticeWatcher) -> Notice:
    deadline = time.monotonic() + GENEROUS
    while time.monotonic() < deadline:
        if (found := watcher.take()) is not None:
            return found
        time.sleep(0.02)
    raise AssertionError("no notice")


def test_the_host_is_gce_metadata_host_else_gces_own_name() -> None:
    assert metadata_host({"GCE_METADATA_HOST": " 127.0.0.1:8080 "}) == "127.0.0.1:8080"
    assert metadata_host({}) == metadata_host({"GCE_METADATA_HOST": ""}) == METADATA_HOST == "metadata.google.internal"


def test_no_metadata_server_means_no_watcher_and_no_notice() -> None:
    for host in (None, f"127.0.0.1:{closed_port()}"):
        watcher = NoticeWatcher(host).start()
        assert watcher.probed.wait(GENEROUS)
        assert not watcher.watching and watcher.take() is None


def test_an_answer_without_the_metadata_flavor_header_is_ignored() -> None:
    with FakeMetadata(flavor=False) as server:
        server.values[PREEMPTED] = "TRUE"
        watcher = NoticeWatcher(server.host).start()
        assert watcher.probed.wait(GENEROUS)
        assert not watcher.watching and watcher.take() is None
        assert server.requests == 1 and server.refused == 0  # one probe, which carried the header


def test_a_reclaim_is_one_notice_heard_while_waiting() -> None:
    with FakeMetadata() as server:
        watcher = NoticeWatcher(server.host).start()
        try:
            assert watcher.probed.wait(GENEROUS) and watcher.watching
            assert server.waiting(GENEROUS)  # the hanging GETs are waiting: FALSE and NONE gave nothing
            assert watcher.take() is None
            server.values[PREEMPTED] = "TRUE"
            found = next_notice(watcher)
            assert found == Notice("preempted", PREEMPTED) and str(found) == "preempted (instance/preempted)"
            assert server.waiting(GENEROUS)  # it listens again, having heard TRUE
            assert watcher.take() is None  # once per notice
            assert server.refused == 0  # every request carried Metadata-Flavor: Google
        finally:
            watcher.stop()


def test_a_maintenance_event_is_a_notice_named_by_its_value_and_a_later_one_is_another() -> None:
    with FakeMetadata() as server:
        server.values[MAINTENANCE] = "TERMINATE_ON_HOST_MAINTENANCE"  # already announced when the job starts
        watcher = NoticeWatcher(server.host).start()
        try:
            assert next_notice(watcher) == Notice("TERMINATE_ON_HOST_MAINTENANCE", MAINTENANCE)
            asked = server.requests
            server.values[MAINTENANCE] = "NONE"
            deadline = time.monotonic() + GENEROUS
            while server.requests == asked and time.monotonic() < deadline:  # heard NONE: it asks again
                time.sleep(0.02)
            server.values[MAINTENANCE] = "TERMINATE_ON_HOST_MAINTENANCE"
            assert next_notice(watcher) == Notice("TERMINATE_ON_HOST_MAINTENANCE", MAINTENANCE)
        finally:
            watcher.stop()


def test_values_that_announce_nothing() -> None:
    assert notice.notice_of(PREEMPTED, "FALSE") is None and notice.notice_of(MAINTENANCE, "NONE\n") is None
    assert notice.notice_of(PREEMPTED, "TRUE\n") == Notice("preempted", PREEMPTED)


def test_a_save_longer_than_the_grace_period_is_named(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt-00000012"
    ckpt.mkdir()
    (ckpt / "COMMITTED").write_text(json.dumps({"step": 12, "reached_at": 100.0, "committed_at": 142.5}))
    assert notice.save_seconds(ckpt) == 42.5
    assert notice.save_seconds(tmp_path / "missing") is None
    warning = notice.grace_warning(ckpt.name, 42.5, 25.0)
    assert warning is not None and warning.startswith("the last checkpoint (ckpt-00000012) took 42.5 s to save, "
                                                      "longer than --grace-period 25 s")
    assert notice.grace_warning(ckpt.name, 2.0, 25.0) is None
