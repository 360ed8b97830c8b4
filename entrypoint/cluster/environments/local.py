"""No cluster variables at all: one node, which is the chief."""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.topology import ClusterTopology


class LocalEnvironment(ClusterEnvironment):
    """The fallback: a single node training on its own."""

    source = "local"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """Always applies; it is last in the detection order."""
        return True

    def topology(self) -> ClusterTopology:
        """Chief, node 0 of 1, no peers."""
        return ClusterTopology(
            source="local", role="chief", index=0, node_rank=0, num_nodes=1,
            chief_address=None, trial=self.platform_trial(),
        )
