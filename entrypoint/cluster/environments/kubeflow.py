"""Kubeflow PyTorchJob with ``nprocPerNode`` / elastic policy: torchrun's arguments as PET_* variables.

The pod is a node and PET_* are the arguments its torchrun would get, so the entrypoint plays
torchrun: PET_NNODES nodes, this one PET_NODE_RANK, PET_NPROC_PER_NODE processes each.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._parse import get_int, host_port, is_uint
from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.errors import ConfigError


def _nnodes(raw: str) -> int:
    """PET_NNODES is ``N`` or an elastic ``MIN:MAX``; only a fixed size is supported."""
    low, _, high = raw.strip().partition(":")
    high = high or low
    if not (is_uint(low) and is_uint(high)) or int(low) < 1:
        raise ConfigError(ev.PET_NNODES, "must be a node count N or N:N")
    if low != high:
        raise ConfigError(ev.PET_NNODES, "an elastic range (MIN:MAX) is not supported; use a fixed count")
    return int(low)


class KubeflowEnvironment(ClusterEnvironment):
    """PET_NNODES / PET_NODE_RANK / PET_NPROC_PER_NODE / PET_MASTER_ADDR / PET_MASTER_PORT."""

    source = "kubeflow"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """PET_NNODES or PET_NODE_RANK is set."""
        return ev.PET_NNODES in environ or ev.PET_NODE_RANK in environ

    def topology(self) -> ClusterTopology:
        """Node-level topology from torchrun's PET_* arguments (MASTER_* as fallback)."""
        env = self._environ
        if ev.PET_NNODES not in env:
            raise ConfigError(ev.PET_NNODES, "missing (PET_NODE_RANK is set)")
        nnodes = _nnodes(env[ev.PET_NNODES])
        node_rank = get_int(env, ev.PET_NODE_RANK)
        if node_rank is None:
            if nnodes > 1:
                raise ConfigError(ev.PET_NODE_RANK, "missing (PET_NNODES says there are several nodes)")
            node_rank = 0
        if node_rank >= nnodes:
            raise ConfigError(ev.PET_NODE_RANK, "is out of range: it must be below PET_NNODES")
        address: str | None = None
        if ev.PET_MASTER_ADDR in env:
            address = host_port(env, ev.PET_MASTER_ADDR, ev.PET_MASTER_PORT, "PET_MASTER_ADDR is set")
        elif ev.MASTER_ADDR in env or nnodes > 1:
            address = host_port(env, ev.MASTER_ADDR, ev.MASTER_PORT, f"PET_NNODES is {nnodes}")
        nproc_raw = env.get(ev.PET_NPROC_PER_NODE, "").strip()
        nproc = get_int(env, ev.PET_NPROC_PER_NODE, minimum=1) if is_uint(nproc_raw) else None
        if nproc_raw and nproc is None and nproc_raw not in ("auto", "gpu", "cpu"):
            raise ConfigError(ev.PET_NPROC_PER_NODE, "must be a count or auto/gpu/cpu")
        return ClusterTopology.for_node("kubeflow", node_rank, nnodes, address, self.platform_trial(),
                                        nproc_per_node=nproc)
