"""MPI and Horovod launches: OMPI_COMM_WORLD_* (Open MPI), PMI_* (MPICH, Intel MPI), HOROVOD_*.

Processes are already one per slot (mpirun, horovodrun, or our own Horovod launcher).
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint import envvars as ev
from entrypoint.environments._parse import get_int, host_port, require_int
from entrypoint.environments.base import ClusterEnvironment
from entrypoint.errors import ConfigError
from entrypoint.topology import ClusterTopology, ProcessInfo

# (rank, size, local rank, local size) per launcher, most specific first: horovodrun sets
# HOROVOD_* on top of whatever MPI set, and its values are the ones Horovod itself uses.
_FAMILIES = (
    (ev.HOROVOD_RANK, ev.HOROVOD_SIZE, ev.HOROVOD_LOCAL_RANK, ev.HOROVOD_LOCAL_SIZE),
    (ev.OMPI_COMM_WORLD_RANK, ev.OMPI_COMM_WORLD_SIZE, ev.OMPI_COMM_WORLD_LOCAL_RANK,
     ev.OMPI_COMM_WORLD_LOCAL_SIZE),
    (ev.PMI_RANK, ev.PMI_SIZE, ev.MPI_LOCALRANKID, ev.MPI_LOCALNRANKS),
)


class MPIEnvironment(ClusterEnvironment):
    """One rank of an MPI / Horovod job."""

    source = "mpi"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """Any family's rank variable is set."""
        return any(family[0] in environ for family in _FAMILIES)

    def topology(self) -> ClusterTopology:
        """Ranks from the first family present; node rank from HOROVOD_CROSS_RANK or rank // local size."""
        env = self._environ
        rank_var, size_var, lrank_var, lsize_var = next(f for f in _FAMILIES if f[0] in env)
        because = f"{rank_var} is set"
        rank = require_int(env, rank_var, because)
        size = require_int(env, size_var, because, minimum=1)
        local_rank = get_int(env, lrank_var) or 0
        local_size = get_int(env, lsize_var, minimum=1) or 1
        if rank >= size:
            raise ConfigError(rank_var, f"{rank} is out of range for {size_var} {size}")
        if local_rank >= local_size:
            raise ConfigError(lrank_var, f"{local_rank} is out of range for {lsize_var} {local_size}")
        node_rank = get_int(env, ev.HOROVOD_CROSS_RANK)
        if node_rank is None:
            node_rank = rank // local_size
        nnodes = get_int(env, ev.HOROVOD_CROSS_SIZE, minimum=1) or -(-size // local_size)
        if node_rank >= nnodes:
            raise ConfigError(ev.HOROVOD_CROSS_RANK, f"{node_rank} is out of range for {nnodes} nodes")
        address = None
        if ev.HOROVOD_GLOO_RENDEZVOUS_ADDR in env:
            address = host_port(env, ev.HOROVOD_GLOO_RENDEZVOUS_ADDR, ev.HOROVOD_GLOO_RENDEZVOUS_PORT,
                                "HOROVOD_GLOO_RENDEZVOUS_ADDR is set")
        return ClusterTopology.for_node("mpi", node_rank, nnodes, address, self.platform_trial(),
                                        process=ProcessInfo(rank, size, local_rank, local_size))
