"""Vertex AI: CLUSTER_SPEC with pools workerpool0 (chief) .. workerpool3 (evaluators)."""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._cluster_spec import topology_from_spec
from entrypoint.cluster.environments._parse import load_object
from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.topology import ClusterTopology, Role

# workerpool2 is parameter servers for TensorFlow and a Reduction Server for NCCL-based
# frameworks; the topology keeps it as ``servers`` and the plan decides which reading applies.
VERTEX_POOLS: dict[str, Role] = {
    "workerpool0": "chief",
    "workerpool1": "worker",
    "workerpool2": "ps",
    "workerpool3": "evaluator",
}


class VertexEnvironment(ClusterEnvironment):
    """Vertex AI custom jobs (and anything else that sets CLUSTER_SPEC, so its errors get reported)."""

    source = "vertex"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """Every CLUSTER_SPEC the legacy AI Platform class did not claim."""
        return ev.CLUSTER_SPEC in environ

    def topology(self) -> ClusterTopology:
        """Parse CLUSTER_SPEC; workerpool0 must hold exactly one replica."""
        spec = load_object(ev.CLUSTER_SPEC, self._environ[ev.CLUSTER_SPEC])
        return topology_from_spec(
            ev.CLUSTER_SPEC, "vertex", spec, VERTEX_POOLS,
            chief_pool="workerpool0", fallback_trial=self.platform_trial(),
        )
