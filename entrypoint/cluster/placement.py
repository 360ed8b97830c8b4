"""Placement: where one process sits in the job, decided in one place for every framework.

``ClusterTopology`` says where this node (replica) sits; ``place(topology, nproc_per_node, local_rank)`` turns
that into the process's node rank, global rank, local rank and world size. Torch's variables (RANK, ...),
Horovod's (HOROVOD_RANK, ...), the failure records, the log labels, the context API and the training loops
all read the ``Placement`` the plan carries (``Plan.for_process``); the loops check once that the framework's
own rank (``dist.get_rank()``, ``hvd.rank()``) agrees with it.

A parameter server or an evaluator takes no part in the training collective: it has no rank (``None``), and
is never the chief. When the platform started the processes itself (torchrun, mpirun: the environment's
``creates_processes_externally``), the platform's own ranks are the placement, taken as given.
"""

from __future__ import annotations

from dataclasses import dataclass

from entrypoint.cluster.topology import ClusterTopology


@dataclass(frozen=True)
class Placement:
    """One process's place: ranks of the training collective (``rank`` None outside it)."""

    node_rank: int | None  # None for a replica outside the training nodes (ps, evaluator)
    rank: int | None  # global process rank; None for a ps or evaluator replica
    local_rank: int  # rank on this node (selects the GPU)
    world_size: int  # training processes in the job
    local_world_size: int  # training processes on this node

    @property
    def trains(self) -> bool:
        """Whether this process is a member of the training collective."""
        return self.rank is not None

    @property
    def is_chief(self) -> bool:
        """True only in the process that writes models, checkpoints and tuning metrics (rank 0)."""
        return self.rank == 0

    @property
    def training_rank(self) -> int:
        """The global rank of a training process (the loops and launchers only ever place those)."""
        if self.rank is None:
            raise AssertionError("a ps or evaluator replica has no training rank")
        return self.rank

    def label(self) -> str:
        """How log lines name this process: ``rank 3/8``, or ``node`` outside the collective."""
        return f"rank {self.rank}/{self.world_size}" if self.rank is not None else "node"


def place(topology: ClusterTopology, nproc_per_node: int, local_rank: int) -> Placement:
    """The ``local_rank``-th of ``nproc_per_node`` processes on this node: node rank x processes + local rank.

    Every node runs the same number of processes (as torchrun and our launchers do). A platform that started
    this process itself gave its ranks, which are returned unchanged.
    """
    given = topology.platform_ranks
    if given is not None:
        if local_rank != given.local_rank:
            raise ValueError(f"the platform placed this process at local rank {given.local_rank}, not {local_rank}")
        return Placement(topology.node_rank, given.rank, given.local_rank, given.world_size, given.local_world_size)
    if not 0 <= local_rank < nproc_per_node:
        raise ValueError(f"local rank {local_rank} is outside 0..{nproc_per_node - 1}")
    world = job_world_size(topology, nproc_per_node)
    node = topology.node_rank
    if node is None:  # a ps or evaluator replica: serves or watches the collective, is not in it
        return Placement(None, None, local_rank, world, nproc_per_node)
    return Placement(node, node * nproc_per_node + local_rank, local_rank, world, nproc_per_node)


def job_world_size(topology: ClusterTopology, nproc_per_node: int) -> int:
    """How many training processes the job has when every node runs ``nproc_per_node``."""
    given = topology.platform_ranks
    return given.world_size if given is not None else max(topology.num_nodes, 1) * nproc_per_node
