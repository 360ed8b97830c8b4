"""PyTorch variables as AI Platform and Kubeflow PyTorchJob set them: one set per node (pod).

WORLD_SIZE is the number of nodes and RANK this node's rank; the entrypoint spawns one process
per GPU on each node. (On Kubeflow with one GPU per pod the two readings coincide; pass
``--nproc-per-node 1`` to keep one process per pod on multi-GPU pods.)
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._parse import get_int, host_port
from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.errors import ConfigError

_MARKERS = (ev.RANK, ev.WORLD_SIZE, ev.MASTER_ADDR, ev.MASTER_PORT)


class TorchEnvironment(ClusterEnvironment):
    """RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT at node level."""

    source = "torch"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """Any of the four variables is set."""
        return any(name in environ for name in _MARKERS)

    def topology(self) -> ClusterTopology:
        """Node rank and node count from RANK and WORLD_SIZE; the chief is MASTER_ADDR:MASTER_PORT."""
        env = self._environ
        world = get_int(env, ev.WORLD_SIZE, minimum=1)
        rank = get_int(env, ev.RANK)
        if world is None:
            if rank is not None and ev.MASTER_ADDR not in env:
                raise ConfigError(ev.MASTER_ADDR, "missing (RANK is set, and WORLD_SIZE is missing too)")
            present = next(name for name in _MARKERS if name in env)
            raise ConfigError(ev.WORLD_SIZE, f"missing ({present} is set, so a PyTorch cluster was meant)")
        address: str | None
        if world > 1:
            if rank is None:
                raise ConfigError(ev.RANK, "missing (WORLD_SIZE says there are several nodes)")
            address = host_port(env, ev.MASTER_ADDR, ev.MASTER_PORT, f"WORLD_SIZE is {world}")
        else:
            rank = 0 if rank is None else rank
            address = (host_port(env, ev.MASTER_ADDR, ev.MASTER_PORT, "MASTER_ADDR is set")
                       if ev.MASTER_ADDR in env else None)
        if rank >= world:
            raise ConfigError(ev.RANK, "is out of range: it must be below WORLD_SIZE")
        return ClusterTopology.for_node("torch", rank, world, address, self.platform_trial())
