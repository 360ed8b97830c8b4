"""Kubeflow Trainer's JAX runtime (a JobSet, one pod per process): JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_COORDINATOR_*.

The runtime starts one process per pod and names it by its completion index: JAX_PROCESS_ID of JAX_NUM_PROCESSES,
and the coordinator, process 0's pod, as JAX_COORDINATOR_ADDRESS (``<job>-node-0-0.<job>:<port>``, the port also in
JAX_COORDINATOR_PORT). A pod is a node here: its one process drives every device of the pod, and the entrypoint is
that process (it spawns nothing else), so the format is node-level like PET_*: node rank, node count, the chief's
``host:port``.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._parse import check_address, get_int, require_int
from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.errors import ConfigError


def _address(env: Mapping[str, str], nodes: int) -> str | None:
    """JAX_COORDINATOR_ADDRESS as ``host:port`` (the port from JAX_COORDINATOR_PORT when the address has none)."""
    raw = env.get(ev.JAX_COORDINATOR_ADDRESS, "").strip()
    if not raw:
        if nodes > 1:
            raise ConfigError(ev.JAX_COORDINATOR_ADDRESS, f"missing ({ev.JAX_NUM_PROCESSES} is {nodes})")
        return None
    host, sep, port = raw.rpartition(":")
    if sep and port.isdigit() and host and not host.endswith(":"):  # host:port (a bare IPv6 address is no host:port)
        return check_address(ev.JAX_COORDINATOR_ADDRESS, raw, "")
    port_number = require_int(env, ev.JAX_COORDINATOR_PORT, f"{ev.JAX_COORDINATOR_ADDRESS} has no port", minimum=1)
    if port_number > 65535:
        raise ConfigError(ev.JAX_COORDINATOR_PORT, "must be a port number (1-65535)")
    return check_address(ev.JAX_COORDINATOR_ADDRESS, f"{raw}:{port_number}", "")


class JaxRuntimeEnvironment(ClusterEnvironment):
    """JAX_NUM_PROCESSES / JAX_PROCESS_ID / JAX_COORDINATOR_ADDRESS (/ JAX_COORDINATOR_PORT), one process a pod."""

    source = "jax_runtime"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """The runtime's pair: JAX_NUM_PROCESSES or JAX_PROCESS_ID (a coordinator address alone is a setting
        users give jax.distributed themselves, not a cluster)."""
        return ev.JAX_NUM_PROCESSES in environ or ev.JAX_PROCESS_ID in environ

    def topology(self) -> ClusterTopology:
        """Node rank JAX_PROCESS_ID of JAX_NUM_PROCESSES nodes; the chief (process 0) at the coordinator's address."""
        env = self._environ
        nodes = get_int(env, ev.JAX_NUM_PROCESSES, minimum=1)
        if nodes is None:
            raise ConfigError(ev.JAX_NUM_PROCESSES, f"missing ({ev.JAX_PROCESS_ID} is set)")
        rank = get_int(env, ev.JAX_PROCESS_ID)
        if rank is None:
            if nodes > 1:
                raise ConfigError(ev.JAX_PROCESS_ID, f"missing ({ev.JAX_NUM_PROCESSES} says there are several)")
            rank = 0
        if rank >= nodes:
            raise ConfigError(ev.JAX_PROCESS_ID, f"is out of range: it must be below {ev.JAX_NUM_PROCESSES}")
        return ClusterTopology.for_node("jax_runtime", rank, nodes, _address(env, nodes), self.platform_trial())
