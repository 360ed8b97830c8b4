"""The few collectives the loop needs, behind one small interface (torch.distributed or Horovod)."""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


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

    def prepare(
        self, model: nn.Module, optimizer: Any, device: torch.device, bucket_cap_mb: int
    ) -> tuple[nn.Module, Any]:
        """Wrap model and optimizer for data-parallel training; rank 0's state reaches every rank."""


class TorchDistributed:
    """torch.distributed (DDP over nccl or gloo); a single process when no group was initialised."""

    def __init__(self, backend: str) -> None:
        self.active = dist.is_available() and dist.is_initialized()
        self.name = backend
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

    def prepare(
        self, model: nn.Module, optimizer: Any, device: torch.device, bucket_cap_mb: int
    ) -> tuple[nn.Module, Any]:
        """DDP broadcasts rank 0's parameters at construction and all-reduces gradients in buckets."""
        if not self.active:
            return model, optimizer
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb), optimizer
