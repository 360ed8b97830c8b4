"""A machine-wide limit on the multi-process tests running at once, across every tier and xdist worker of `make test`:
a pytest plugin (tests/conftest.py loads it; docs/testing.md).

`make test` runs the tiers side by side, each with pytest-xdist workers. Unit tests are short and single-process;
a ``slow`` (or ``containers``) test starts real jobs of several processes, and too many of them at once on two cores
make each one slow enough for its own timeouts (a peer's ``--timeout``, a ``--hang-timeout``) to fire. So such a
test first takes one of ``TEST_SLOTS`` slots, lock files in ``TEST_SLOTS_DIR`` shared by every pytest process of the
run, and gives it back when it ends (a killed process gives it back too: the lock goes with its file descriptor). The
wait happens before pytest-timeout starts the test's clock. Without ``TEST_SLOTS`` (a tier run alone, an IDE)
nothing is limited.

``TEST_SLOTS_EXTRA`` more slots open only while the machine has idle CPU (at least ``IDLE_CORES`` of a core idle over
the last ``WINDOW`` seconds, every process counted, one extra test started per ``COOLDOWN``): the base slots are
sized for the start of `make test`, when every tier runs; once the others have ended, the PyTorch tier's tests, which
mostly wait on their jobs, used one core of two.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.tiers import cpu_jiffies

HEAVY_MARKERS = ("slow", "containers")
POLL = 0.2  # seconds between tries while every slot is taken
IDLE_CORES = 0.5  # an extra slot opens when at least this much of a core was idle over the last WINDOW
WINDOW = 3.0  # seconds
COOLDOWN = 6.0  # seconds between two extra slots handed out (a test's processes take about that long to get going)


def _count(variable: str) -> int:
    try:
        return max(0, int(os.environ.get(variable, "0")))
    except ValueError:
        return 0


def slot_count() -> int:
    return _count("TEST_SLOTS")


def extra_count() -> int:
    return _count("TEST_SLOTS_EXTRA")


def idle_cores(before: tuple[int, int], after: tuple[int, int]) -> float:
    """How many cores were idle on average between two ``cpu_jiffies`` samples ((busy, total), /proc/stat)."""
    total = after[1] - before[1]
    return 0.0 if total <= 0 else (total - (after[0] - before[0])) / total * (os.cpu_count() or 1)


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


def _first_free(folder: Path, names: list[str]) -> int | None:
    for name in names:
        if (fd := _lock(folder / name, block=False)) is not None:
            return fd
    return None


def _free_slot(folder: Path, count: int, extra: int = 0) -> int:
    """Poll until one of the ``count`` slot locks is free, or one of the ``extra`` ones while the machine has idle
    CPU; the descriptor holding it."""
    base = [f"slot-{index}" for index in range(count)]
    extras = [f"extra-{index}" for index in range(extra)]
    granted = folder / "extra-granted"  # its mtime: when the last extra slot was handed out
    sample, sampled = cpu_jiffies(), time.monotonic()
    while True:
        if (fd := _first_free(folder, base)) is not None:
            return fd
        if extras and time.monotonic() - sampled >= WINDOW:
            now = cpu_jiffies()
            idle, sample, sampled = idle_cores(sample, now), now, time.monotonic()
            last = granted.stat().st_mtime if granted.exists() else 0.0
            ready = idle >= IDLE_CORES and time.time() - last >= COOLDOWN
            if ready and (fd := _first_free(folder, extras)) is not None:
                granted.touch()
                return fd
        time.sleep(POLL)


@contextlib.contextmanager
def slot(folder: Path, count: int, extra: int = 0) -> Iterator[float]:
    """Hold one of ``count`` slots (or of ``extra`` ones while the machine idles; lock files in ``folder``); yields
    how long the wait took.

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
        held = _free_slot(folder, count, extra)
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
    with slot(folder, count, extra_count()) as waited:
        if waited >= 1:
            item.add_report_section("setup", "slots", f"waited {waited:.0f} s for one of {count} test slots")
        return (yield)
