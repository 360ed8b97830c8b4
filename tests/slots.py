"""A machine-wide limit on the multi-process tests running at once, across every tier and xdist worker of `make test`:
a pytest plugin (tests/conftest.py loads it; docs/testing.md).

`make test` runs the tiers side by side, each with pytest-xdist workers. Unit tests are short and single-process;
a ``slow`` (or ``containers``) test starts real jobs of several processes, and too many of them at once on two cores
make each one slow enough for its own timeouts (a peer's ``--timeout``, a ``--hang-timeout``) to fire. So such a
test first takes one of ``TEST_SLOTS`` slots, lock files in ``TEST_SLOTS_DIR`` shared by every pytest process of the
run, and gives it back when it ends (a killed process gives it back too: the lock goes with its file descriptor). The
wait happens before pytest-timeout starts the test's clock. Without ``TEST_SLOTS`` (a tier run alone, an IDE)
nothing is limited.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

HEAVY_MARKERS = ("slow", "containers")
POLL = 0.2  # seconds between tries while every slot is taken


def slot_count() -> int:
    try:
        return max(0, int(os.environ.get("TEST_SLOTS", "0")))
    except ValueError:
        return 0


def is_heavy(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) is not None for name in HEAVY_MARKERS)


def _lock(path: Path, block: bool) -> int | None:
    """An open descriptor holding an exclusive lock on ``path``; None when ``block`` is off and it is taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _free_slot(folder: Path, count: int) -> int:
    """Poll until one of the ``count`` slot locks is free; the descriptor holding it."""
    while True:
        for index in range(count):
            if (fd := _lock(folder / f"slot-{index}", block=False)) is not None:
                return fd
        time.sleep(POLL)


@contextlib.contextmanager
def slot(folder: Path, count: int) -> Iterator[float]:
    """Hold one of ``count`` slots (lock files in ``folder``); yields how long the wait took.

    Only the holder of the ``queue`` lock looks for a free slot, and it lets the queue go once it has one. So a
    process that gives a slot back and wants the next one queues behind those already waiting: without the queue it
    took its slot back before any poller woke, and a tier that started late (the jobs tier, one process) waited
    until the others ran out of multi-process tests. (A killed process gives back what it held: the locks go with
    its descriptors.)
    """
    folder.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    queue = _lock(folder / "queue", block=True)
    assert queue is not None
    try:
        held = _free_slot(folder, count)
    finally:
        _unlock(queue)
    try:
        yield time.monotonic() - began
    finally:
        _unlock(held)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: the wait is not part of the test's timeout
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    count = slot_count()
    if count == 0 or not is_heavy(item):
        return (yield)
    folder = Path(os.environ.get("TEST_SLOTS_DIR") or f"/tmp/trainer-test-slots-{os.getuid()}")
    with slot(folder, count) as waited:
        if waited >= 1:
            item.add_report_section("setup", "slots", f"waited {waited:.0f} s for one of {count} test slots")
        return (yield)
