"""HSDP whose replicas survive a lost node: FSDP shards within a node's own group, replicas meet on groups we re-form.

torch 2.13's FSDP2 over a 2-D (replicate, shard) mesh all-reduces across replicas on the mesh's replicate groups,
which ``fully_shard`` captures once: a lost node breaks them for good, and they cannot be swapped in a live model.
So, as torchft's fault-tolerant HSDP does, the model is sharded over a 1-D mesh of the node's own processes (a group
that never loses a member without the node), and the loop averages the gradients across the replicas itself, after
backward and before the optimizer's step, on one group per local rank (local rank i of every node) that is formed
again with each generation of the job's group (``survivors.py``).

- **The node's group** is made once per process, over a prefix of the job's store for the generation it was made
  in (the first one, or the one a returning node joins), and is kept out of ``destroy_process_group`` when the
  job's group is dropped after a loss (torch shuts every registered group down there): it is taken out of
  torch's registry first and put back once the next generation is formed.
- **The replica groups** (one per local rank) are formed lazily, by every rank at its first gradient average of a
  generation (every rank gets there, in step), and dropped with the job's group.
- **Fewer replicas**: while the survivors train without a lost node (``membership.py``) the job's group holds the
  live nodes' ranks, compacted; the replica groups are formed over it and the average divides by the live replicas;
  the node's group is mapped to its ranks in each generation when it is put back.
- **A step is applied on a whole node or on none of it**: a rank whose all-reduce with the other replicas failed
  (its peer died mid-step) tells its node on the node's group, so that no rank of a node applies a step another rank
  of it could not; the survivors then resume from one consistent replica (``survivors.heal``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from entrypoint.errors import PeerError

log = logging.getLogger("entrypoint.pytorch")
_REGISTRY = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag", "pg_coalesce_state")


class NodeReplicas:
    """This process's node group (the FSDP mesh's) and replica group (the gradient average's), across generations."""

    def __init__(self, backend: str, rank: int, local_rank: int, local_size: int, timeout: float) -> None:
        self.backend, self.rank, self.local_rank, self.local_size = backend, rank, local_rank, local_size
        self.timeout = timedelta(seconds=timeout)
        self.node_group: Any = None
        self.replica_group: Any = None
        self._kept: dict[str, Any] = {}

    @property
    def node(self) -> int:
        """This node's index (its ranks are ``node * local_size ...``)."""
        return self.rank // self.local_size

    def node_ranks(self) -> list[int]:
        """The ranks of this node, in local-rank order."""
        return [self.node * self.local_size + i for i in range(self.local_size)]

    def form_node(self) -> Any:
        """The node's group (made once: by every process of the node, within the job's current group)."""
        if self.node_group is None:
            store = dist.PrefixStore(f"node{self.node}/", c10d._get_default_store())
            made = c10d._new_process_group_helper(
                self.local_size, self.local_rank, self.node_ranks(), self.backend, store,
                group_name=c10d.GroupName(f"trainer-node{self.node}"), timeout=self.timeout)
            self.node_group = made[0] if isinstance(made, tuple) else made
            c10d._world.pg_group_ranks[self.node_group] = {r: i for i, r in enumerate(self.node_ranks())}
        return self.node_group

    def replicas(self) -> Any:
        """This local rank's group across the replicas (formed by every rank at the generation's first use)."""
        if self.replica_group is None:
            world = dist.get_world_size()
            for index in range(self.local_size):  # every rank makes every group, in the same order
                group = dist.new_group([r for r in range(world) if r % self.local_size == index],
                                       timeout=self.timeout)
                if index == self.local_rank:
                    self.replica_group = group
        return self.replica_group

    def replica_count(self) -> int:
        """How many replicas the gradients are averaged over (the nodes of the current group)."""
        return dist.get_world_size() // self.local_size

    def average(self, grads: list[torch.Tensor], broken: Callable[[], None] = lambda: None) -> None:
        """Average ``grads`` (this rank's local shards) over the replicas, in place; on a node that agrees it did.

        Raises PeerError on every rank of this node when any of its ranks could not (a replica was lost); a rank
        whose all-reduce failed calls ``broken`` first (its replica group's connections shut down)."""
        failed: BaseException | None = None
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            try:
                dist.all_reduce(flat, group=self.replicas())
            except Exception as exc:  # a peer of this rank's replica group is gone: its node must know
                failed = exc
                with contextlib.suppress(Exception):
                    broken()
            else:
                flat /= self.replica_count()
                offset = 0
                for g in grads:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
        flag = torch.tensor([int(failed is not None)], dtype=torch.int64, device=grads[0].device if grads else None)
        dist.all_reduce(flag, group=self.form_node())  # the node's group outlives any other node
        if failed is not None:
            raise failed
        if int(flag.item()):
            raise PeerError("a process of this node lost its replica peer in the gradient average: the step is "
                            "not applied on this node")

    def detach(self) -> None:
        """Take the node's group out of torch's registry before the job's group is destroyed (which would shut
        every registered group down); the replica group goes with the job's."""
        self.replica_group = None
        group = self.node_group
        if group is None:
            return
        world = c10d._world
        self._kept = {name: getattr(world, name).pop(group) for name in _REGISTRY if group in getattr(world, name)}
        tag = str(self._kept.get("pg_to_tag", ""))
        with contextlib.suppress(KeyError, ValueError):
            world.tags_to_pg[tag].remove(group)

    def attach(self) -> None:
        """Put the node's group back into torch's registry (a new generation of the job's group is formed)."""
        group, kept = self.node_group, self._kept
        if group is None or not kept:
            return
        world = c10d._world
        for name, value in kept.items():
            getattr(world, name)[group] = value
        if "pg_to_tag" in kept:
            world.tags_to_pg.setdefault(kept["pg_to_tag"], []).append(group)
        c10d._register_process_group(kept["pg_names"], group)
        self._kept = {}
        # its ranks in the new generation: whole nodes in rank order, so this node's come at this rank's less its own
        first = dist.get_rank() - self.local_rank
        world.pg_group_ranks[group] = {first + i: i for i in range(self.local_size)}
