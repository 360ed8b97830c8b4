"""Data loading for the hooks loop, built so that a resumed run sees exactly the batches it would have seen.

- The training order is ``DistributedSampler``'s (seeded by ``--seed`` and the epoch, per rank).
- A resumed epoch starts at its saved position by skipping indices, not by loading and dropping batches.
- Every DataLoader has its own generator, re-seeded per epoch: creating an iterator never draws from
  the global RNG (which the checkpoint restores for dropout and the like), so resuming mid-epoch
  continues the very same random streams as an uninterrupted run.
- Loader worker processes ignore SIGTERM and SIGINT and die with their training process: a preemption
  signal sent to the whole process group (tini -g, ``local``, Kubernetes) reaches the training process,
  which commits the agreed step while its loaders keep serving batches.
- Every sample a dataset reads is counted (``watchdog.reads``, shared with the workers): a slow read that makes
  progress is not a hang.
- Loader workers are started by a fork server (``loader_server.py``), never forked from the training process: that
  process has threads (gloo's, the checkpoint's writer) and on Python 3.11 a fork while one of them creates its
  thread state (gloo's threads take the GIL to free a finished collective) leaves the child blocked for ever on the
  interpreter's lock before any of its code runs (CPython gh-112275; an evaluation's loader, started as a checkpoint
  was written, never delivered its first batch). The dataset is pickled to the workers, as under ``spawn`` (macOS)
  and Python 3.14's default; one that cannot be pickled is forked, with a warning saying why.
"""

from __future__ import annotations

import logging
import multiprocessing
import traceback
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from entrypoint.lifecycle.signals import shield_loader_worker
from entrypoint.lifecycle.watch.watchdog import reads

log = logging.getLogger("entrypoint.pytorch")
SERVER_MODULE = "entrypoint.pytorch.loop.loader_server"  # what the fork server imports first (stop signals ignored)


class EpochSampler(Sampler[int]):
    """This rank's share of an epoch's order, from the ``offset``-th sample the whole job consumed in it.

    The epoch's order is ``DistributedSampler``'s (a permutation of the dataset seeded by ``seed + epoch``). The job
    consumes it from the front, ``world_size`` samples at a time (rank r takes every world_size-th from r), so
    after n samples the consumed ones are exactly the first n of the order, whatever the world size was. A
    resumed epoch continues from the saved ``offset`` over the ranks it has now: no sample of the epoch is
    skipped or seen twice when the world size changes, and with the same world size the indices are exactly
    those of an uninterrupted run. Like ``drop_last``, the ragged end (fewer than ``world_size`` samples) is left
    out.
    """

    def __init__(self, size: int, rank: int, world_size: int, seed: int) -> None:
        self.size, self.rank, self.world_size, self.seed = size, rank, world_size, seed
        self.epoch, self.offset = 0, 0

    def start(self, epoch: int, offset: int) -> None:
        """Begin ``epoch`` after the first ``offset`` samples of its order (consumed by the whole job)."""
        self.epoch, self.offset = epoch, offset

    def per_rank(self, offset: int | None = None) -> int:
        """How many samples each rank takes from ``offset`` (default: the current start) to the epoch's end."""
        left = self.size - (self.offset if offset is None else offset)
        return max(left, 0) // self.world_size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        return iter(order[self.offset + self.rank:self.offset + self.per_rank() * self.world_size:self.world_size])

    def __len__(self) -> int:
        return self.per_rank()


class TrainBatches:
    """This rank's training batches, epoch by epoch, from any position of the job inside an epoch."""

    def __init__(self, dataset: Dataset[Any], batch_size: int, rank: int, world_size: int, seed: int, workers: int,
                 cuda: bool) -> None:
        self.batch_size, self.seed, self.world_size = batch_size, seed, world_size
        self.sampler = EpochSampler(len(dataset), rank, world_size, seed)  # type: ignore[arg-type]
        self.loader = make_loader(dataset, batch_size, self.sampler, workers, cuda, True)
        self.steps_per_epoch = self.steps_left(0)

    @property
    def samples_per_step(self) -> int:
        """Samples the whole job consumes per step."""
        return self.batch_size * self.world_size

    def steps_left(self, offset: int) -> int:
        """Steps from ``offset`` (samples the job consumed in the epoch) to the epoch's end."""
        return self.sampler.per_rank(offset) // self.batch_size

    def epoch(self, epoch: int, offset: int) -> Iterator[Any]:
        """The batches of ``epoch`` after the first ``offset`` samples the job consumed in it."""
        self.sampler.start(epoch, offset)
        seed_loader(self.loader, self.seed, epoch)
        return start(self.loader)


class Counted(Dataset[Any]):
    """A map-style dataset whose reads are counted (``watchdog.reads``), in whichever process reads them."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset, self.read = dataset, reads()

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> Any:
        item = self.dataset[index]
        self.read.value += 1
        return item

    def __getitems__(self, indices: list[Any]) -> Any:
        """A batch: the dataset's own batched read when it has one (counted as a whole), else sample by sample."""
        own = getattr(self.dataset, "__getitems__", None)
        if not callable(own):
            return [self[i] for i in indices]
        items = own(indices)
        self.read.value += len(indices)
        return items


def make_loader(dataset: Dataset[Any], batch_size: int, sampler: Sampler[int] | None, workers: int, cuda: bool,
                train: bool) -> DataLoader[Any]:
    """Training batches drop the ragged end (equal steps on every rank); evaluation keeps it. Its workers come from
    the fork server (``start`` forks them where the dataset cannot be pickled)."""
    return DataLoader(Counted(dataset), batch_size=batch_size, sampler=sampler, num_workers=workers, pin_memory=cuda,
                      drop_last=train, persistent_workers=workers > 0, generator=torch.Generator(),
                      worker_init_fn=shield_loader_worker if workers > 0 else None,
                      multiprocessing_context=fork_server(dataset) if workers > 0 else None)


def fork_server(dataset: Dataset[Any]) -> Any:
    """The fork server's context, which first imports torch, ``loader_server`` and the dataset's own module (its
    workers start with them imported); None where there is none (not on Linux or macOS)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    context = multiprocessing.get_context("forkserver")
    modules = [SERVER_MODULE, __name__]
    for cls in (type(dataset), *type(dataset).__mro__[1:]):
        if cls.__module__ not in ("__main__", "builtins", "typing") and cls.__module__ not in modules:
            modules.append(cls.__module__)
    context.set_forkserver_preload(modules)  # read when the server starts (the first worker's start)
    return context


def start(loader: DataLoader[Any]) -> Iterator[Any]:
    """``iter(loader)``; a dataset the fork server cannot be sent (it does not pickle: a lambda, an open file) has its
    workers forked from this process instead, with a warning saying why."""
    try:
        return iter(loader)
    except Exception as exc:
        if loader.multiprocessing_context is None or not _in_pickling(exc):
            raise
        log.warning("DataLoader workers forked from the training process: the dataset cannot be sent to the fork "
                    "server (%s: %s); a fork beside running threads can block a worker for ever on Python 3.11",
                    type(exc).__name__, " ".join(str(exc).split())[:200])
        loader.multiprocessing_context = "fork"
        return iter(loader)


def _in_pickling(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a worker's arguments were pickled for the fork server."""
    frames = traceback.extract_tb(exc.__traceback__)
    return any(frame.filename.endswith(("multiprocessing/reduction.py", "multiprocessing/popen_forkserver.py"))
               for frame in frames)


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
