"""ClusterTopology: the one immutable description of where this node (replica) sits in the job.

It holds node facts only; where one process of the node sits (its ranks) is ``placement.place``'s answer.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from entrypoint.cluster import envvars as ev

Source = Literal["vertex", "aiplatform", "tf_config", "torch", "torchrun", "kubeflow", "jax_runtime", "mpi", "local"]
Role = Literal["chief", "worker", "ps", "evaluator"]


@dataclass(frozen=True)
class PlatformRanks:
    """The ranks a platform gave a process it started itself (torchrun's RANK..., mpirun's OMPI_COMM_WORLD_*)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


@dataclass(frozen=True)
class Peer:
    """A member of the job as users know it (``workerpool1[0]``, ``node rank 2``) and its address, if known."""

    name: str
    address: str | None

    def __str__(self) -> str:
        return f"{self.name} ({self.address})" if self.address else self.name


@dataclass(frozen=True)
class ClusterTopology:
    """Where this replica sits: role, index, node rank, every pool's addresses, chief address, trial.

    ``chief``/``workers``/``servers``/``evaluators`` are the address pools when the format names
    them (Vertex, AI Platform, TF_CONFIG), and ``pool_names`` the names the format gave them
    (``workerpool1``, ``master``); torch-style formats only know the chief's address and the node
    count. ``servers`` is Vertex workerpool2 / the ``ps`` pool: parameter servers for TensorFlow, a
    Reduction Server for NCCL-based frameworks (see ``plan``). ``platform_ranks`` is set only when the
    platform started this process itself (the environment's ``creates_processes_externally``): the ranks it
    gave, which ``placement.place`` takes as given.
    """

    source: Source
    role: Role
    index: int
    node_rank: int | None
    num_nodes: int
    chief_address: str | None
    trial: str | None = None
    chief: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()
    servers: tuple[str, ...] = ()
    evaluators: tuple[str, ...] = ()
    pool_names: tuple[tuple[str, str], ...] = ()  # (role, the format's name for its pool)
    platform_ranks: PlatformRanks | None = None
    nproc_per_node: int | None = None  # what the platform asked for (PET_NPROC_PER_NODE), if anything

    @classmethod
    def from_pools(
        cls,
        source: Source,
        role: Role,
        index: int,
        *,
        chief: tuple[str, ...],
        workers: tuple[str, ...],
        servers: tuple[str, ...] = (),
        evaluators: tuple[str, ...] = (),
        trial: str | None = None,
        pool_names: tuple[tuple[str, str], ...] = (),
    ) -> ClusterTopology:
        """Derive node rank, node count and chief address from address pools.

        With a chief pool the chief is node 0 and worker i is node i+1; without one (a TF_CONFIG
        of workers only) worker 0 plays chief, as TensorFlow's MultiWorkerMirroredStrategy does.
        """
        offset = 1 if chief else 0
        node_rank = 0 if role == "chief" else index + offset if role == "worker" else None
        leader = chief[0] if chief else (workers[0] if workers else None)
        return cls(source=source, role=role, index=index, node_rank=node_rank, num_nodes=len(chief) + len(workers),
                   chief_address=leader, trial=trial, chief=chief, workers=workers, servers=servers,
                   evaluators=evaluators, pool_names=pool_names)

    @classmethod
    def for_node(
        cls,
        source: Source,
        node_rank: int,
        num_nodes: int,
        chief_address: str | None,
        trial: str | None,
        *,
        platform_ranks: PlatformRanks | None = None,
        nproc_per_node: int | None = None,
    ) -> ClusterTopology:
        """A topology known by node rank only (torch, torchrun, Kubeflow, MPI): node 0 is the chief."""
        return cls(source=source, role="chief" if node_rank == 0 else "worker", index=max(node_rank - 1, 0),
                   node_rank=node_rank, num_nodes=num_nodes, chief_address=chief_address, trial=trial,
                   platform_ranks=platform_ranks, nproc_per_node=nproc_per_node)

    @property
    def is_chief_node(self) -> bool:
        """True on the node that hosts rank 0 (writes outputs, hosts the rendezvous)."""
        return self.node_rank == 0

    @property
    def processes_started_externally(self) -> bool:
        """True when the platform started one process per GPU itself (torchrun, mpirun): never spawn again."""
        return self.platform_ranks is not None

    @property
    def distributed(self) -> bool:
        """True when more than one replica takes part in the job."""
        return (self.num_nodes > 1 or bool(self.servers) or bool(self.evaluators)
                or (self.platform_ranks is not None and self.platform_ranks.world_size > 1))

    # ---- names ------------------------------------------------------------------------------
    def pool_name(self, role: str) -> str:
        """The format's own name for a role's pool (``workerpool1``, ``master``), else the role."""
        return dict(self.pool_names).get(role, role)

    @property
    def replica_name(self) -> str:
        """This replica as the platform names it: ``workerpool1-0``, ``chief-0``, ``node-2``."""
        if self.pool_names or self.source == "tf_config":
            return f"{self.pool_name(self.role)}-{self.index}"
        return f"node-{self.node_rank or 0}"

    def training_peers(self, include_servers: bool = False) -> tuple[Peer, ...]:
        """Every training node (and the servers, if asked), in node order, named as the platform names them."""
        if not (self.chief or self.workers):
            return tuple(Peer(f"node rank {r}", self.chief_address if r == 0 else None)
                         for r in range(self.num_nodes))
        pools = [("chief", self.chief), ("worker", self.workers)]
        if include_servers:
            pools.append(("ps", self.servers))
        return tuple(Peer(f"{self.pool_name(role)}[{i}]", address)
                     for role, members in pools for i, address in enumerate(members))

    def chief_host_port(self) -> tuple[str, int] | None:
        """The chief's host and port, when the format gives an address."""
        if not self.chief_address:
            return None
        host, _, port = self.chief_address.rpartition(":")
        return host, int(port)

    # ---- what each framework expects ------------------------------------------------------
    def tf_config(self, include_servers: bool = True) -> dict[str, Any] | None:
        """The TF_CONFIG TensorFlow 2 expects: ``chief`` (never ``master``), evaluator outside ``cluster``."""
        if not (self.chief or self.workers):
            return None
        cluster: dict[str, list[str]] = {}
        if self.chief:
            cluster["chief"] = list(self.chief)
        if self.workers:
            cluster["worker"] = list(self.workers)
        if include_servers and self.servers:
            cluster["ps"] = list(self.servers)
        task: dict[str, Any] = {"type": self.role, "index": self.index}
        if self.trial is not None:
            task["trial"] = self.trial
        return {"cluster": cluster, "task": task, "environment": "cloud"}

    def tf_config_json(self, include_servers: bool = True) -> str | None:
        """TF_CONFIG serialised the way TensorFlow reads it."""
        config = self.tf_config(include_servers)
        return None if config is None else json.dumps(config, sort_keys=True)

    def torch_env(self) -> dict[str, str]:
        """Node-level rendezvous variables for torch (MASTER_ADDR/PORT when known, NODE_RANK, NNODES)."""
        if self.node_rank is None:
            return {}
        env = {ev.NODE_RANK: str(self.node_rank), ev.NNODES: str(self.num_nodes)}
        address = self.chief_host_port()
        if address is not None:
            env.update({ev.MASTER_ADDR: address[0], ev.MASTER_PORT: str(address[1])})
        return env

    # ---- views ------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """JSON-ready view for ``python -m entrypoint describe``."""
        out: dict[str, Any] = {
            "source": self.source, "role": self.role, "index": self.index, "node_rank": self.node_rank,
            "num_nodes": self.num_nodes, "chief_address": self.chief_address, "trial": self.trial,
            "replica": self.replica_name, "is_chief_node": self.is_chief_node,
            "processes_started_externally": self.processes_started_externally,
            "pools": {"chief": list(self.chief), "worker": list(self.workers), "ps": list(self.servers),
                      "evaluator": list(self.evaluators)},
        }
        if self.platform_ranks is not None:
            out["platform_ranks"] = asdict(self.platform_ranks)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Everything, for the plan file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterTopology:
        """Inverse of ``to_dict``."""
        fields = dict(data)
        for name in ("chief", "workers", "servers", "evaluators"):
            fields[name] = tuple(fields.get(name) or ())
        fields["pool_names"] = tuple(tuple(p) for p in fields.get("pool_names") or ())
        ranks = fields.get("platform_ranks")
        fields["platform_ranks"] = PlatformRanks(**ranks) if ranks else None
        return cls(**fields)
