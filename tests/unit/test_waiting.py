"""The one waiting primitive: its lines, its deadline, its error, and a blocking call it bounds (no framework)."""

from __future__ import annotations

import threading
import time

import pytest

from entrypoint.errors import HostUnresolvableError, PeerError
from entrypoint.lifecycle import waiting
from entrypoint.lifecycle.waiting import Wait, bounded


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_a_wait_says_whom_it_waits_for_when_that_changes_and_fails_naming_them(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="entrypoint")
    states = iter([("2 of 2 peers", "w1, w2"), ("2 of 2 peers", "w1, w2"), ("1 of 2 peers", "w2")])
    wait = Wait(0.3)
    with pytest.raises(PeerError) as raised:
        wait.until(lambda: next(states, ("1 of 2 peers", "w2")), poll=0.01)
    assert str(raised.value) == "gave up after 0.3 s (--timeout) waiting for 1 of 2 peers: w2"
    lines = messages(caplog)
    assert lines[0].startswith("waiting for 2 of 2 peers: w1, w2; ") and lines[0].endswith(" s left of --timeout 0.3")
    assert lines[1].startswith("waiting for 1 of 2 peers: w2; ") and len(lines) == 2  # said again only on change


def test_a_wait_ends_as_soon_as_nothing_is_pending() -> None:
    done = threading.Event()
    threading.Timer(0.2, done.set).start()
    started = time.monotonic()
    Wait(60).until(lambda: None if done.is_set() else ("the flag", ""), poll=0.01)
    assert time.monotonic() - started < 30  # not the 60 s --timeout


def test_the_same_line_comes_again_every_log_every_seconds(caplog: pytest.LogCaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level("INFO", logger="entrypoint")
    monkeypatch.setattr(waiting, "LOG_EVERY", 0.05)
    wait = Wait(10, context="node 0", first_after=0.05)
    wait.say("node 1 to finish")
    assert messages(caplog) == []  # held back at first
    time.sleep(0.06)
    wait.say("node 1 to finish")
    time.sleep(0.06)
    wait.say("node 1 to finish")
    assert [m.split(";")[0] for m in messages(caplog)] == ["node 0: waiting for node 1 to finish"] * 2


def test_the_error_type_and_the_flag_can_be_named() -> None:
    wait = Wait(5, "--hang-timeout", margin=1)
    assert wait.left > 5
    error = wait.error("the chief c (h:1)", "its host name does not resolve yet", HostUnresolvableError)
    assert isinstance(error, HostUnresolvableError)
    assert str(error) == ("gave up after 5 s (--hang-timeout) waiting for the chief c (h:1): its host name does not "
                          "resolve yet")


def test_bounded_gives_up_on_a_call_that_never_returns_and_passes_results_and_errors_on() -> None:
    assert bounded(lambda: 7, Wait(5), "x", "y") == 7
    with pytest.raises(ZeroDivisionError):
        bounded(lambda: 1 // 0, Wait(5), "x", "y")
    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(PeerError, match=r"^gave up after 0.3 s \(--timeout\) waiting for the chief c: it never "
                                        r"answered$"):
        bounded(never.wait, Wait(0.3), "the chief c", "it never answered")
    assert time.monotonic() - started < 30  # the call never returns: the deadline ended it
    never.set()
