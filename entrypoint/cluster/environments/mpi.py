"""MPI and Horovod launches: OMPI_COMM_WORLD_* (Open MPI), PMI_* (MPICH, Intel MPI), HOROVOD_*.

Processes are already one per slot (mpirun, horovodrun, or our own Horovod launcher).
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._parse import ProcessVariables, host_port, process_ranks
from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.topology import ClusterTopology

# Each launcher's variables, most specific first: horovodrun sets HOROVOD_* on top of whatever MPI
# set, and its values are the ones Horovod itself uses. The node rank comes from Horovod's cross rank.
_FAMILIES = tuple(
    ProcessVariables(rank, size, local_rank, local_size, ev.HOROVOD_CROSS_RANK, ev.HOROVOD_CROSS_SIZE)
    for rank, size, local_rank, local_size in (
        (ev.HOROVOD_RANK, ev.HOROVOD_SIZE, ev.HOROVOD_LOCAL_RANK, ev.HOROVOD_LOCAL_SIZE),
        (ev.OMPI_COMM_WORLD_RANK, ev.OMPI_COMM_WORLD_SIZE, ev.OMPI_COMM_WORLD_LOCAL_RANK,
         ev.OMPI_COMM_WORLD_LOCAL_SIZE),
        (ev.PMI_RANK, ev.PMI_SIZE, ev.MPI_LOCALRANKID, ev.MPI_LOCALNRANKS),
    )
)


class MPIEnvironment(ClusterEnvironment):
    """One rank of an MPI / Horovod job."""

    source = "mpi"
    creates_processes_externally = True

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """Any family's rank variable is set."""
        return any(family.rank in environ for family in _FAMILIES)

    def topology(self) -> ClusterTopology:
        """Ranks from the first family present; node rank from HOROVOD_CROSS_RANK or rank // local size."""
        env = self._environ
        names = next(f for f in _FAMILIES if f.rank in env)
        ranks, node_rank, nnodes = process_ranks(env, names, f"{names.rank} is set")
        address = None
        if ev.HOROVOD_GLOO_RENDEZVOUS_ADDR in env:
            address = host_port(env, ev.HOROVOD_GLOO_RENDEZVOUS_ADDR, ev.HOROVOD_GLOO_RENDEZVOUS_PORT,
                                "HOROVOD_GLOO_RENDEZVOUS_ADDR is set")
        return ClusterTopology.for_node(self.source, node_rank, nnodes, address, self.platform_trial(),
                                        platform_ranks=ranks)
