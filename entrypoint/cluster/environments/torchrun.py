"""torchrun / torch elastic: per-process RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK.

These processes are already one per GPU (spawned by torchrun or a Kubeflow operator): the
entrypoint must never spawn again.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._parse import ProcessVariables, host_port, process_ranks
from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.topology import ClusterTopology

_MARKERS = (ev.LOCAL_RANK, ev.GROUP_RANK, ev.TORCHELASTIC_RUN_ID)
_VARIABLES = ProcessVariables(ev.RANK, ev.WORLD_SIZE, ev.LOCAL_RANK, ev.LOCAL_WORLD_SIZE, ev.GROUP_RANK,
                              ev.GROUP_WORLD_SIZE)


class TorchElasticEnvironment(ClusterEnvironment):
    """One process of a torchrun-style launch."""

    source = "torchrun"
    creates_processes_externally = True

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """LOCAL_RANK, GROUP_RANK or TORCHELASTIC_RUN_ID is set."""
        return any(name in environ for name in _MARKERS)

    def topology(self) -> ClusterTopology:
        """Process ranks plus the node view (GROUP_RANK is the node rank)."""
        env = self._environ
        ranks, node_rank, nnodes = process_ranks(env, _VARIABLES, "this is a torchrun-style process",
                                                   local_rank_required=True)
        address = None
        if ranks.world_size > 1 or ev.MASTER_ADDR in env:
            address = host_port(env, ev.MASTER_ADDR, ev.MASTER_PORT, f"WORLD_SIZE is {ranks.world_size}")
        return ClusterTopology.for_node(self.source, node_rank, nnodes, address, self.platform_trial(),
                                        platform_ranks=ranks)
