"""The loop's collectives over Horovod: DistributedOptimizer, rank-0 broadcasts, allgather, allreduce."""

from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch
from torch import nn

from entrypoint.pytorch.collectives import Vote


class HorovodCollectives:
    """horovod.torch after ``hvd.init()``."""

    def __init__(self) -> None:
        self.name = "horovod"
        self.rank = hvd.rank()
        self.world_size = hvd.size()

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's value everywhere."""
        return hvd.broadcast_object(value, root_rank=0)

    def gather_object(self, value: Any) -> list[Any]:
        """All ranks' values, in rank order."""
        return list(hvd.allgather_object(value))

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks."""
        result: torch.Tensor = hvd.allreduce(tensor, op=hvd.Sum)
        return result

    def start_vote(self, flags: torch.Tensor) -> Vote:
        """An asynchronous allreduce of a few integers (one in flight at a time, so one name)."""
        handle = hvd.allreduce_async(flags, op=hvd.Sum, name="trainer.step_vote")
        return Vote(lambda: [int(v) for v in hvd.synchronize(handle).tolist()])

    def discard_step(self, optimizer: Any) -> None:
        """Finish the gradient allreduces Horovod started in backward, then drop them."""
        optimizer.synchronize()
        optimizer.zero_grad()

    def prepare(
        self, model: nn.Module, optimizer: Any, device: torch.device, bucket_cap_mb: int
    ) -> tuple[nn.Module, Any]:
        """Rank 0's parameters and optimizer state reach every rank; gradients are averaged by allreduce."""
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        wrapped = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)
        return model, wrapped
