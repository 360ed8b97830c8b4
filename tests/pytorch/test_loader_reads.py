"""The hooks loop's loaders count every sample their dataset reads, in their worker processes too (shared memory):
the hang watchdog takes a read that makes progress for a live one (``lifecycle/watch/watchdog.py``,
``loop/data.py``)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.pytorch


class Batched:
    """A dataset with a batched read of its own (``__getitems__``: one remote request per batch, say)."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> Any:
        raise AssertionError("read one by one although it reads batches")

    def __getitems__(self, indices: list[int]) -> Any:
        return [{"x": i} for i in indices]


@pytest.mark.parametrize("workers", [0, 1])
def test_every_sample_read_is_counted_in_whichever_process_reads_it(workers: int) -> None:
    import torch
    from torch.utils.data import TensorDataset

    from entrypoint.lifecycle.watch.watchdog import reads
    from entrypoint.pytorch.loop.data import make_loader

    before = reads().value
    loader = make_loader(TensorDataset(torch.arange(12.0)), 4, None, workers, False, False)
    sizes = [len(b[0]) for b in loader]
    read = reads().value - before
    del loader  # its persistent worker ends here, whatever the assertions say
    assert sizes == [4, 4, 4] and read == 12


def test_a_datasets_own_batched_read_is_kept_and_counted_as_a_whole() -> None:
    from entrypoint.lifecycle.watch.watchdog import reads
    from entrypoint.pytorch.loop.data import make_loader

    before = reads().value
    batches = list(make_loader(Batched(), 5, None, 0, False, False))  # type: ignore[arg-type]
    assert [b["x"].tolist() for b in batches] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert reads().value - before == 10
