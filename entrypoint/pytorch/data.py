"""Data loading for the hooks loop, built so that a resumed run sees exactly the batches it would have seen.

- The training order is ``DistributedSampler``'s (seeded by ``--seed`` and the epoch, per rank).
- A resumed epoch starts at its saved position by skipping indices, not by loading and dropping batches.
- Every DataLoader has its own generator, re-seeded per epoch: creating an iterator never draws from
  the global RNG (which the checkpoint restores for dropout and the like), so resuming mid-epoch
  continues the very same random streams as an uninterrupted run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler


class EpochSampler(Sampler[int]):
    """``DistributedSampler`` with an epoch and a starting position inside it."""

    def __init__(self, inner: DistributedSampler[Any]) -> None:
        self.inner = inner
        self.skip = 0

    def start(self, epoch: int, skip_samples: int) -> None:
        """Begin ``epoch`` at this rank's ``skip_samples``-th sample."""
        self.inner.set_epoch(epoch)
        self.skip = skip_samples

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.inner), self.skip, None)

    def __len__(self) -> int:
        return len(self.inner) - self.skip


def make_loader(dataset: Dataset[Any], batch_size: int, sampler: Sampler[int] | None, workers: int, cuda: bool,
                train: bool) -> DataLoader[Any]:
    """Training batches drop the ragged end (equal steps on every rank); evaluation keeps it."""
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, pin_memory=cuda,
                      drop_last=train, persistent_workers=workers > 0, generator=torch.Generator())


def seed_loader(loader: DataLoader[Any], seed: int, epoch: int) -> None:
    """Re-seed the loader's own generator for ``epoch`` (worker seeds derive from it)."""
    assert loader.generator is not None
    loader.generator.manual_seed(seed * 1_000_003 + epoch)


def to_device(batch: Any, device: torch.device) -> Any:
    """Move a batch (tensor, tuple, list or dict of them) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
