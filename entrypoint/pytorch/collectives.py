"""The few collectives the loop needs, behind one small interface (torch.distributed or Horovod)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from entrypoint.peers import KeyValue


class Vote:
    """A small all-reduce in flight; ``result()`` waits for it and returns the element-wise sums over ranks."""

    def __init__(self, wait: Callable[[], list[int]]) -> None:
        self._wait = wait

    def result(self) -> list[int]:
        """The sum of every rank's flags, element by element."""
        return self._wait()


class Collectives(Protocol):
    """Rank facts and the collectives the hooks loop uses."""

    name: str
    rank: int
    world_size: int

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""

    def gather_object(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks."""

    def start_vote(self, flags: torch.Tensor) -> Vote:
        """Start summing ``flags`` (int64, on the training device) over ranks without waiting."""

    def discard_step(self, optimizer: Any) -> None:
        """Drop the gradients of a step that will not be applied (after backward, instead of ``step``)."""

    def prepare(
        self, model: nn.Module, optimizer: Any, device: torch.device, bucket_cap_mb: int
    ) -> tuple[nn.Module, Any]:
        """Wrap model and optimizer for data-parallel training; rank 0's state reaches every rank."""

    def heartbeat_store(self) -> KeyValue | None:
        """A client of the job's key-value store of its own (for heartbeats), None for a single process."""


class TorchDistributed:
    """torch.distributed (DDP over nccl or gloo); a single process when no group was initialised."""

    def __init__(self, backend: str) -> None:
        self.active = dist.is_available() and dist.is_initialized()
        self.name = backend
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.rank = dist.get_rank() if self.active else 0
        self.world_size = dist.get_world_size() if self.active else 1

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's value everywhere."""
        if not self.active:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_object(self, value: Any) -> list[Any]:
        """All ranks' values."""
        if not self.active:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks."""
        if self.active:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def start_vote(self, flags: torch.Tensor) -> Vote:
        """An asynchronous all-reduce of a few integers (no host sync until ``result``)."""
        if not self.active:
            return Vote(lambda: [int(v) for v in flags.tolist()])
        work = dist.all_reduce(flags, op=dist.ReduceOp.SUM, async_op=True)

        def wait() -> list[int]:
            work.wait()
            return [int(v) for v in flags.tolist()]

        return Vote(wait)

    def discard_step(self, optimizer: Any) -> None:
        """DDP's gradients are already reduced: dropping them is enough."""
        optimizer.zero_grad()

    def prepare(
        self, model: nn.Module, optimizer: Any, device: torch.device, bucket_cap_mb: int
    ) -> tuple[nn.Module, Any]:
        """DDP broadcasts rank 0's parameters at construction and all-reduces gradients in buckets."""
        if not self.active:
            return model, optimizer
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb), optimizer

    def heartbeat_store(self) -> KeyValue | None:
        """A client of the process group's TCPStore of its own, with a short timeout (the chief hosts it)."""
        if not self.active:
            return None
        store = dist.distributed_c10d._get_default_store()
        while hasattr(store, "underlying_store"):
            store = store.underlying_store
        if not isinstance(store, dist.TCPStore):
            return None
        return TorchStore(dist.TCPStore(store.host, store.port, is_master=False, timeout=timedelta(seconds=5),
                                        wait_for_workers=False))


class TorchStore:
    """A c10d store as the heartbeats' key-value store."""

    def __init__(self, store: dist.Store) -> None:
        self.store = store

    def put(self, key: str, value: str) -> None:
        """Set ``key``."""
        self.store.set(key, value)

    def fetch(self, key: str) -> str | None:
        """``key``'s value, or None when it was never set."""
        if not self.store.check([key]):
            return None
        return bytes(self.store.get(key)).decode()
