"""ClusterTopology: the one immutable description of where this process sits in the job."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["vertex", "aiplatform", "tf_config", "torch", "torchrun", "kubeflow", "mpi", "local"]
Role = Literal["chief", "worker", "ps", "evaluator"]
TRAINING_ROLES: tuple[Role, ...] = ("chief", "worker")


@dataclass(frozen=True)
class ProcessInfo:
    """Per-process ranks for environments whose processes are already spawned (torchrun, MPI)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


@dataclass(frozen=True)
class ClusterTopology:
    """Where this replica sits: role, index, node rank, every pool's addresses, chief address, trial.

    ``chief``/``workers``/``servers``/``evaluators`` are the address pools when the format names
    them (Vertex, AI Platform, TF_CONFIG); torch-style formats only know the chief's address and
    the node count. ``servers`` is Vertex workerpool2 / the ``ps`` pool: parameter servers for
    TensorFlow, a Reduction Server for NCCL-based frameworks (see ``plan``).
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
    process: ProcessInfo | None = None
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
    ) -> ClusterTopology:
        """Derive node rank, node count and chief address from address pools.

        With a chief pool the chief is node 0 and worker i is node i+1; without one (a TF_CONFIG
        of workers only) worker 0 plays chief, as TensorFlow's MultiWorkerMirroredStrategy does.
        """
        offset = 1 if chief else 0
        if role == "chief":
            node_rank: int | None = 0
        elif role == "worker":
            node_rank = index + offset
        else:
            node_rank = None
        leader = chief[0] if chief else (workers[0] if workers else None)
        return cls(
            source=source,
            role=role,
            index=index,
            node_rank=node_rank,
            num_nodes=len(chief) + len(workers),
            chief_address=leader,
            trial=trial,
            chief=chief,
            workers=workers,
            servers=servers,
            evaluators=evaluators,
        )

    @classmethod
    def for_node(
        cls,
        source: Source,
        node_rank: int,
        num_nodes: int,
        chief_address: str | None,
        trial: str | None,
        *,
        process: ProcessInfo | None = None,
        nproc_per_node: int | None = None,
    ) -> ClusterTopology:
        """A topology known by node rank only (torch, torchrun, Kubeflow, MPI): node 0 is the chief."""
        return cls(
            source=source,
            role="chief" if node_rank == 0 else "worker",
            index=0 if node_rank == 0 else node_rank - 1,
            node_rank=node_rank,
            num_nodes=num_nodes,
            chief_address=chief_address,
            trial=trial,
            process=process,
            nproc_per_node=nproc_per_node,
        )

    # ---- derived facts -------------------------------------------------------------------
    @property
    def is_chief_node(self) -> bool:
        """True on the node that hosts rank 0 (writes outputs, hosts the rendezvous)."""
        return self.node_rank == 0

    @property
    def is_chief(self) -> bool:
        """True only in the process that writes models, checkpoints and tuning metrics."""
        if self.process is not None:
            return self.process.rank == 0
        return self.is_chief_node

    @property
    def per_process(self) -> bool:
        """True when processes are already one per GPU (torchrun, mpirun): never spawn again."""
        return self.process is not None

    @property
    def distributed(self) -> bool:
        """True when more than one replica takes part in the job."""
        return self.num_nodes > 1 or bool(self.servers) or bool(self.evaluators) or (
            self.process is not None and self.process.world_size > 1
        )

    def chief_host_port(self, default_port: int = 29500) -> tuple[str, int]:
        """The chief's host and port; falls back to loopback for a single node."""
        if not self.chief_address:
            return "127.0.0.1", default_port
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
        """Node-level rendezvous variables for torch (MASTER_ADDR/PORT, NODE_RANK, NNODES)."""
        if self.node_rank is None:
            return {}
        host, port = self.chief_host_port()
        return {
            "MASTER_ADDR": host,
            "MASTER_PORT": str(port),
            "NODE_RANK": str(self.node_rank),
            "NNODES": str(self.num_nodes),
        }

    def describe(self) -> dict[str, Any]:
        """JSON-ready view for ``python -m entrypoint describe``."""
        out: dict[str, Any] = {
            "source": self.source,
            "role": self.role,
            "index": self.index,
            "node_rank": self.node_rank,
            "num_nodes": self.num_nodes,
            "chief_address": self.chief_address,
            "trial": self.trial,
            "is_chief": self.is_chief,
            "per_process": self.per_process,
            "pools": {
                "chief": list(self.chief),
                "worker": list(self.workers),
                "ps": list(self.servers),
                "evaluator": list(self.evaluators),
            },
        }
        if self.process is not None:
            out["process"] = {
                "rank": self.process.rank,
                "world_size": self.process.world_size,
                "local_rank": self.process.local_rank,
                "local_world_size": self.process.local_world_size,
            }
        return out
