"""The loop's collectives over Horovod: DistributedOptimizer, rank-0 broadcasts, allgather, allreduce."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import horovod.torch as hvd
import torch
from torch import nn

from entrypoint.cluster import envvars as ev
from entrypoint.lifecycle.watch.peers import KeyValue
from entrypoint.pytorch.launch.collectives import Vote

_SCOPE = "trainer"


class HttpStore:
    """The scope ``trainer`` of Horovod's rendezvous server (GET/PUT /scope/key), with a short timeout."""

    def __init__(self, host: str, port: int) -> None:
        self.base = f"http://{host}:{port}/{_SCOPE}/"

    def put(self, key: str, value: str) -> None:
        """Set ``key``."""
        request = urllib.request.Request(self.base + _quote(key), data=value.encode(), method="PUT")
        urllib.request.urlopen(request, timeout=5).close()

    def fetch(self, key: str) -> str | None:
        """``key``'s value, or None when it was never set."""
        try:
            with urllib.request.urlopen(self.base + _quote(key), timeout=5) as response:
                return bytes(response.read()).decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


def _quote(key: str) -> str:
    return urllib.parse.quote(key, safe="")


class HorovodCollectives:
    """horovod.torch after ``hvd.init()``; ``rendezvous`` is Horovod's rendezvous server (host, port), if known."""

    def __init__(self, rendezvous: tuple[str, int] | None = None) -> None:
        self.name, self.rendezvous, self.rank_variable = "horovod", rendezvous, ev.HOROVOD_RANK
        self.rank = hvd.rank()
        self.world_size = hvd.size()

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's value everywhere. One name on every rank: Horovod pairs ranks' operations by name, and its default
        is the value's type (rank 0's ``Picked`` and another rank's ``None`` would never meet)."""
        return hvd.broadcast_object(value, root_rank=0, name="entrypoint.broadcast_object")

    def gather_object(self, value: Any) -> list[Any]:
        """All ranks' values, in rank order (one name on every rank, as ``broadcast_object``)."""
        return list(hvd.allgather_object(value, name="entrypoint.gather_object"))

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks."""
        result: torch.Tensor = hvd.allreduce(tensor, op=hvd.Sum)
        return result

    def start_vote(self, flags: torch.Tensor) -> Vote:
        """An asynchronous allreduce of a few integers (one in flight at a time, so one name)."""
        handle = hvd.allreduce_async(flags, op=hvd.Sum, name="trainer.step_vote")
        return Vote(lambda: [int(v) for v in hvd.synchronize(handle).tolist()])

    def heartbeat_store(self) -> KeyValue | None:
        """Horovod's rendezvous server (on the chief node) is a key-value store over HTTP."""
        where = self.rendezvous
        return None if where is None or self.world_size == 1 else HttpStore(*where)

    def discard_step(self, optimizer: Any) -> None:
        """Finish the gradient allreduces Horovod started in backward, then drop them."""
        optimizer.synchronize()
        optimizer.zero_grad()

    def leave(self) -> None:
        """Shut Horovod down in this process: a peer's pending collective on it fails (HorovodInternalError)."""
        hvd.shutdown()

    def wake(self) -> None:
        """A replicated model's stop never wakes its peers to commit together (the chief commits alone): leave."""
        hvd.shutdown()

    def prepare(
        self, model: nn.Module, optimizer: Any, device: torch.device, bucket_cap_mb: int
    ) -> tuple[nn.Module, Any]:
        """Rank 0's parameters and optimizer state reach every rank; gradients are averaged by allreduce."""
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        wrapped = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)
        return model, wrapped
