"""Data loading for the hooks loop, built so that a resumed run sees exactly the batches it would have seen.

- The training order is ``DistributedSampler``'s (seeded by ``--seed`` and the epoch, per rank).
- A resumed epoch starts at its saved position by skipping indices, not by loading and dropping batches.
- Every DataLoader has its own generator, re-seeded per epoch: creating an iterator never draws from
  the global RNG (which the checkpoint restores for dropout and the like), so resuming mid-epoch
  continues the very same random streams as an uninterrupted run.
- Loader worker processes ignore SIGTERM and SIGINT and die with their training process: a preemption
  signal sent to the whole process group (tini -g, ``local``, Kubernetes) reaches the training process,
  which commits the agreed step while its loaders keep serving batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from entrypoint.lifecycle.signals import shield_loader_worker


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


class TrainBatches:
    """This rank's training batches, epoch by epoch, from any position inside an epoch (``DistributedSampler``)."""

    def __init__(self, dataset: Dataset[Any], batch_size: int, rank: int, world_size: int, seed: int, workers: int,
                 cuda: bool) -> None:
        self.batch_size, self.seed = batch_size, seed
        self.sampler = EpochSampler(DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                                       seed=seed, drop_last=True))
        self.loader = make_loader(dataset, batch_size, self.sampler, workers, cuda, True)
        self.steps_per_epoch = len(self.sampler.inner) // batch_size

    def epoch(self, epoch: int, start_batch: int) -> Iterator[tuple[int, Any]]:
        """``(batch index, batch)`` of ``epoch`` from batch ``start_batch`` on."""
        self.sampler.start(epoch, start_batch * self.batch_size)
        seed_loader(self.loader, self.seed, epoch)
        return enumerate(self.loader, start=start_batch)


def make_loader(dataset: Dataset[Any], batch_size: int, sampler: Sampler[int] | None, workers: int, cuda: bool,
                train: bool) -> DataLoader[Any]:
    """Training batches drop the ragged end (equal steps on every rank); evaluation keeps it."""
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, pin_memory=cuda,
                      drop_last=train, persistent_workers=workers > 0, generator=torch.Generator(),
                      worker_init_fn=shield_loader_worker if workers > 0 else None)


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
