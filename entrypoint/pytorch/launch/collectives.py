"""The few collectives the loop needs, behind one small interface (torch.distributed or Horovod)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from entrypoint.cluster import envvars as ev
from entrypoint.lifecycle.watch.peers import KeyValue
from entrypoint.pytorch.launch.replicas import NodeReplicas

log = logging.getLogger("entrypoint.pytorch")


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
    rank_variable: str  # the variable that places this process at its rank (named when the framework disagrees)

    @property
    def rank(self) -> int:
        """This process's rank."""

    @property
    def world_size(self) -> int:
        """How many processes train."""

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

    def leave(self) -> None:
        """Leave the group for good (a stopping process): a peer blocked in a collective on it fails at once."""

    def wake(self) -> None:
        """Break this process's connections to its peers (a peer blocked in a collective on it fails at once), but
        keep the group formed: a new group can still be formed over the job's store (a sharded model's stop)."""


class TorchDistributed:
    """torch.distributed (DDP over nccl or gloo); a single process while no group is formed.

    ``rank`` and ``world_size`` are the plan's until a group is formed (``form_group``), the group's after;
    ``drop_group`` abandons a group a lost peer broke (survivors keep training, ``survivors.py``).
    """

    def __init__(self, backend: str, rank: int = 0, world_size: int = 1, timeout: float = 300.0) -> None:
        self.name, self.rank_variable = backend, ev.RANK
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self._rank, self._world_size, self.timeout = rank, world_size, timeout
        self._links: dict[int, str] = {}  # the connections the current group opened (to shut down if it breaks)
        self._store_port: int | None = None
        self.replicas: NodeReplicas | None = None  # HSDP whose replicas survive a lost node (``replicas.py``)
        self._replica_links: dict[int, str] = {}  # the connections of the current generation's replica groups

    def by_node(self, local_rank: int, local_size: int) -> NodeReplicas:
        """Shard within this node's own group and average across replicas on groups re-formed with the job's."""
        if self.replicas is None:
            self.replicas = NodeReplicas(self.name, self._rank, local_rank, local_size, self.timeout)
        return self.replicas

    def average_replicas(self, grads: list[torch.Tensor]) -> None:
        """Average this rank's gradient shards across the replicas (``NodeReplicas.average``). The connections of a
        generation's replica groups are shut down with its group's when a peer is lost, and at once by a rank whose
        average failed: a peer further along the ring, blocked on it, fails then too instead of at ``--timeout``."""
        assert self.replicas is not None, "average_replicas without by_node"
        if self.replicas.replica_group is None:
            before = _sockets()
            self.replicas.replicas()
            opened = {fd: link for fd, link in _sockets().items() if before.get(fd) != link}
            self._links.update(opened)
            self._replica_links = opened
        self.replicas.average(grads, broken=lambda: _shut_down(self._replica_links, self._store_port))

    @property
    def active(self) -> bool:
        """Whether a process group is formed."""
        return dist.is_available() and dist.is_initialized()

    @property
    def rank(self) -> int:
        """This process's rank."""
        return dist.get_rank() if self.active else self._rank

    @property
    def world_size(self) -> int:
        """How many processes train."""
        return dist.get_world_size() if self.active else self._world_size

    def form_group(self, store: dist.Store, members: list[int] | None = None) -> None:
        """Form the process group over ``store`` (one generation's prefix of the job's store); ``members``: the
        placement ranks it holds (None: every rank), compacted in their order (HSDP's survivors with fewer replicas)."""
        cuda = self.device.type == "cuda"
        before = _sockets()
        rank, world = (members.index(self._rank), len(members)) if members else (self._rank, self._world_size)
        dist.init_process_group(self.name, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=self.timeout), device_id=self.device if cuda else None)
        self._links = {fd: link for fd, link in _sockets().items() if before.get(fd) != link}
        self._store_port = _store_port(store)
        if self.replicas is not None:
            self.replicas.attach()  # the node's group, kept through the loss, is registered again

    def drop_group(self) -> None:
        """Abandon the process group (a peer is lost) so that every peer notices at once, then destroy it.

        gloo closes its connections only when the group is freed, and DDP's hooks keep it alive: a survivor
        that leaves would make every peer waiting on it wait out the group's timeout. So the connections
        this group opened (never the store's, never a listener) are shut down here, which every peer
        blocked on them sees at once ("connection closed by peer"); NCCL's communicators are aborted.
        """
        if not self.active:
            return
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        try:
            if self.replicas is not None:
                self.replicas.detach()  # the node's group lives on: out of the abort's and destruction's reach
            if self.name == "nccl" and abort is not None:
                abort()
            _shut_down(self._links, self._store_port)
            dist.destroy_process_group()
        except Exception as exc:  # a broken group may not even close cleanly: it is gone either way
            log.warning("the broken process group did not close cleanly (%s)", type(exc).__name__)

    def leave(self) -> None:
        """Leave the group for good (a stopping process): its connections shut down (every connection of this process
        but the store's, for a group ``init_process_group`` formed), so a peer blocked on it sees it at once."""
        if not self.active:
            return
        store_port = _store_port(dist.distributed_c10d._get_default_store())
        _shut_down(self._links or _sockets(), store_port)
        with contextlib.suppress(Exception):  # a group whose connections are gone may not close cleanly
            dist.destroy_process_group()

    def wake(self) -> None:
        """Shut down every connection of this process but the store's (the training group's, a layout's own groups,
        the saves' group): a peer blocked in a collective on it fails at once. The groups stay registered, so a new
        one forms over the job's store (``dist.new_group``) by every rank that was woken; none of the old works."""
        if self.active:
            _shut_down(_sockets(), _store_port(dist.distributed_c10d._get_default_store()))

    def send_object(self, value: Any, dst: int) -> None:
        """Send ``value`` to rank ``dst`` (pickled)."""
        dist.send_object_list([value], dst=dst)

    def recv_object(self, src: int) -> Any:
        """Receive a value ``send_object`` sent from rank ``src``."""
        box: list[Any] = [None]
        dist.recv_object_list(box, src=src)
        return box[0]

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

    def claim(self, key: str, value: str) -> str:
        """Set ``key`` to ``value`` unless it is set (atomically: the first to claim it wins); its value now."""
        return bytes(self.store.compare_set(key, "", value)).decode()


def _sockets() -> dict[int, str]:
    """This process's socket file descriptors and what they are (``socket:[inode]``)."""
    found: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/self/fd/{name}")
                if link.startswith("socket:"):
                    found[int(name)] = link
    return found


def _store_port(store: Any) -> int | None:
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return int(store.port) if hasattr(store, "port") else None


def _shut_down(links: dict[int, str], store_port: int | None) -> None:
    """Shut down the connected sockets of ``links`` that still are what they were (not listeners, not the store)."""
    for fd, link in links.items():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") != link:
                continue
            sock = socket.socket(fileno=os.dup(fd))
            try:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    continue
                ports = {sock.getsockname()[1], sock.getpeername()[1]}
                if store_port is not None and store_port in ports:
                    continue
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()

