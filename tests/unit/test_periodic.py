"""The periodic background thread every owner of one uses (entrypoint/periodic.py)."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest

from entrypoint.periodic import Periodic
from tests.conftest import ROOT

WAIT = 10.0  # a bound no healthy run approaches


def counting(times: int, done: threading.Event, result: object = None) -> tuple[list[str], object]:
    seen: list[str] = []

    def tick() -> object:
        seen.append(threading.current_thread().name)
        if len(seen) >= times:
            done.set()
        return result

    return seen, tick


def test_it_ticks_in_its_named_daemon_thread_until_stopped_and_stop_joins() -> None:
    done = threading.Event()
    seen, tick = counting(3, done)
    p = Periodic("beats", tick, 0.01).start()
    assert done.wait(WAIT)
    assert p._thread is not None and p._thread.daemon
    p.stop()
    assert not p.alive  # joined
    count = len(seen)
    time.sleep(0.05)
    assert len(seen) == count and set(seen) == {"beats"}
    p.stop()  # idempotent
    p.start()  # no second life after a stop
    assert not p.alive


def test_start_twice_is_one_thread_and_stop_before_start_never_starts() -> None:
    names = {t.name for t in threading.enumerate()}
    p = Periodic("once", lambda: None, None).start()
    p.start()
    assert [t.name for t in threading.enumerate() if t.name not in names] == ["once"]
    p.stop()
    q = Periodic("never", lambda: None, 0.01)
    q.stop()
    q.start()
    assert not q.started and not q.alive


def test_a_tick_returning_false_ends_the_thread() -> None:
    done = threading.Event()
    seen, tick = counting(1, done, result=False)
    p = Periodic("once", tick, 0.0).start()
    assert done.wait(WAIT)
    assert p._thread is not None
    p._thread.join(WAIT)
    assert seen == ["once"] and not p.alive


def test_an_exception_ends_the_thread_through_excepthook_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    hooked: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: hooked.append(args.exc_value))
    calls: list[int] = []

    def tick() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    p = Periodic("fails", tick, 0.0).start()
    assert p._thread is not None
    p._thread.join(WAIT)
    assert calls == [1] and [type(e) for e in hooked] == [RuntimeError]


@pytest.mark.parametrize("go_on", [True, False])
def test_on_error_decides_whether_it_goes_on(go_on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    hooked: list[object] = []
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    errors: list[Exception] = []
    done = threading.Event()

    def tick() -> None:
        if len(errors) >= 3:
            done.set()
        raise OSError("store gone")

    p = Periodic("beats", tick, 0.0, on_error=lambda exc: errors.append(exc) or go_on).start()
    assert p._thread is not None
    if go_on:
        assert done.wait(WAIT)
        p.stop()
    p._thread.join(WAIT)
    assert not p.alive and hooked == []
    assert len(errors) >= 3 if go_on else len(errors) == 1


def test_the_interval_is_asked_before_each_wait_and_none_waits_for_wake() -> None:
    asked: list[int] = []
    ticked = threading.Event()

    def interval() -> float | None:
        asked.append(1)
        return None  # until woken

    p = Periodic("poster", ticked.set, interval).start()
    assert not ticked.wait(0.2)  # no wake, no tick
    p.wake()
    assert ticked.wait(WAIT)
    p.stop()
    assert len(asked) >= 1 and not p.alive


def test_initial_is_the_first_wait() -> None:
    ticked = threading.Event()
    p = Periodic("probe", ticked.set, 3600.0, initial=0.0).start()
    assert ticked.wait(WAIT)  # at once, not after an hour
    p.stop()


def test_stop_waits_for_a_tick_in_flight_up_to_its_bound() -> None:
    inside, release = threading.Event(), threading.Event()

    def tick() -> None:
        inside.set()
        release.wait(WAIT)

    p = Periodic("slow", tick, 0.0, join=0.0).start()
    assert inside.wait(WAIT)
    p.stop()  # join 0: returns while the tick still runs
    assert p.alive
    release.set()
    p.stop(WAIT)  # joined now
    assert not p.alive


def test_a_tick_may_stop_its_own_thread() -> None:
    holder: list[Periodic] = []
    p = Periodic("self", lambda: holder[0].stop(), 0.0)
    holder.append(p)
    p.start()
    assert p._thread is not None
    p._thread.join(WAIT)
    assert not p.alive and p.stopping


def hand_rolled_loops(tree: ast.AST) -> list[int]:
    """The lines of ``while`` loops that wait on an event or condition in their test (``while not e.wait(n)``)."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.While)
            and any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "wait"
                    for call in ast.walk(node.test))]


@pytest.mark.parametrize("path", sorted((ROOT / "entrypoint").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_hand_rolls_a_periodic_thread(path: Path) -> None:
    if path.name == "periodic.py":
        return
    assert not hand_rolled_loops(ast.parse(path.read_text())), f"{path}: a periodic thread is a periodic.Periodic"


def test_the_rule_sees_what_it_looks_for() -> None:
    source = "while not stop.wait(1.0):\n    beat()\nwhile x:\n    pass\n"
    assert hand_rolled_loops(ast.parse(source)) == [1]
