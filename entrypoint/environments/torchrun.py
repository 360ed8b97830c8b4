"""torchrun / torch elastic: per-process RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK.

These processes are already one per GPU (spawned by torchrun or by our own launcher): the
entrypoint must never spawn again.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint import envvars as ev
from entrypoint.environments._parse import get_int, host_port, require_int
from entrypoint.environments.base import ClusterEnvironment
from entrypoint.errors import ConfigError
from entrypoint.topology import ClusterTopology, ProcessInfo

_MARKERS = (ev.LOCAL_RANK, ev.GROUP_RANK, ev.TORCHELASTIC_RUN_ID)


class TorchElasticEnvironment(ClusterEnvironment):
    """One process of a torchrun-style launch."""

    source = "torchrun"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """LOCAL_RANK, GROUP_RANK or TORCHELASTIC_RUN_ID is set."""
        return any(name in environ for name in _MARKERS)

    def topology(self) -> ClusterTopology:
        """Process ranks plus the node view (GROUP_RANK is the node rank)."""
        env = self._environ
        because = "this is a torchrun-style process"
        rank = require_int(env, ev.RANK, because)
        world = require_int(env, ev.WORLD_SIZE, because, minimum=1)
        local_rank = require_int(env, ev.LOCAL_RANK, because)
        local_world = get_int(env, ev.LOCAL_WORLD_SIZE, minimum=1) or 1
        if rank >= world:
            raise ConfigError(ev.RANK, f"{rank} is out of range for WORLD_SIZE {world}")
        if local_rank >= local_world:
            raise ConfigError(ev.LOCAL_RANK, f"{local_rank} is out of range for LOCAL_WORLD_SIZE {local_world}")
        if local_world > world:
            raise ConfigError(ev.LOCAL_WORLD_SIZE, f"{local_world} is larger than WORLD_SIZE {world}")
        node_rank = get_int(env, ev.GROUP_RANK)
        if node_rank is None:
            node_rank = rank // local_world
        nnodes = get_int(env, ev.GROUP_WORLD_SIZE, minimum=1) or -(-world // local_world)
        if node_rank >= nnodes:
            raise ConfigError(ev.GROUP_RANK, f"{node_rank} is out of range for {nnodes} nodes")
        address = None
        if world > 1 or ev.MASTER_ADDR in env:
            address = host_port(env, ev.MASTER_ADDR, ev.MASTER_PORT, f"WORLD_SIZE is {world}")
        return ClusterTopology.for_node("torchrun", node_rank, nnodes, address, self.platform_trial(),
                                        process=ProcessInfo(rank, world, local_rank, local_world))
