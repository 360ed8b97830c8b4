"""The hooks loop's DataLoader workers start clean whatever the training process's other threads hold at that moment
(``loop/data.py``): they come from a fork server, not a fork of the training process (on Python 3.11 a fork while
one of gloo's threads creates its thread state left an evaluation's worker blocked for ever before its first line).
A lock another thread holds stands for any such state: a forked worker inherits it held and never reads a batch."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.pytorch
HELD = threading.Lock()  # held by another thread of the training process while its loader starts


class Locked(torch.utils.data.Dataset):  # type: ignore[misc]
    """Every read takes ``HELD``, as a library's read takes its own lock."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Any:
        with HELD:
            return torch.tensor(index)


class Unpicklable(Locked):
    """A dataset that cannot be sent to another process (a lambda in it)."""

    def __init__(self) -> None:
        self.transform = lambda x: x


def first_batch(iterator: Any, within: float) -> Any:
    """The iterator's first batch, read in a thread; None when it does not come ``within`` seconds."""
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(next(iterator)), daemon=True)
    reader.start()
    reader.join(within)
    return got[0] if got else None


def test_workers_started_while_another_thread_holds_a_lock_read_their_batches() -> None:
    from entrypoint.pytorch.loop.data import make_loader, start

    loader = make_loader(Locked(), 4, None, 2, False, False)
    holder_has_it, release = threading.Event(), threading.Event()

    def holder() -> None:
        with HELD:
            holder_has_it.set()
            release.wait()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    holder_has_it.wait()
    try:
        batches = start(loader)  # the workers start while the lock is held
    finally:
        release.set()
        thread.join()
    try:
        batch = first_batch(batches, within=60)
        assert batch is not None, "a loader worker never delivered its first batch"
        assert batch.tolist() == [0, 1, 2, 3]
    finally:
        for worker in getattr(batches, "_workers", []):
            worker.kill()  # a blocked worker would outlive the test
        del batches, loader


def test_a_dataset_that_cannot_be_pickled_has_its_workers_forked_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    from entrypoint.pytorch.loop.data import make_loader, start

    loader = make_loader(Unpicklable(), 4, None, 2, False, False)
    with caplog.at_level(logging.WARNING, logger="entrypoint.pytorch"), pytest.warns(UserWarning, match="pickle"):
        batches = [b.tolist() for b in start(loader)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert "DataLoader workers forked from the training process: the dataset cannot be sent to the fork server " \
           "(AttributeError: Can't pickle local object" in caplog.text
    del loader
