"""AI Platform Training (legacy): CLUSTER_SPEC with master / worker / ps / evaluator."""

from __future__ import annotations

import json
from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._cluster_spec import topology_from_spec
from entrypoint.cluster.environments._parse import load_object
from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.topology import ClusterTopology, Role

LEGACY_POOLS: dict[str, Role] = {
    "master": "chief",
    "chief": "chief",
    "worker": "worker",
    "ps": "ps",
    "evaluator": "evaluator",
}


class AIPlatformEnvironment(ClusterEnvironment):
    """A CLUSTER_SPEC whose pools and task type use the legacy names."""

    source = "aiplatform"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """A parseable CLUSTER_SPEC naming only legacy pools (no ``workerpoolN``)."""
        raw = environ.get(ev.CLUSTER_SPEC)
        if raw is None:
            return False
        try:
            spec = json.loads(raw)
        except (ValueError, RecursionError):
            return False
        if not isinstance(spec, dict):
            return False
        cluster, task = spec.get("cluster"), spec.get("task")
        keys = set(cluster) if isinstance(cluster, dict) else set()
        task_type = task.get("type") if isinstance(task, dict) else None
        if task_type is not None and not isinstance(task_type, str):
            return False
        names = keys | ({task_type} if task_type else set())
        return bool(names) and names <= set(LEGACY_POOLS)

    def topology(self) -> ClusterTopology:
        """Parse CLUSTER_SPEC; ``master`` is the chief."""
        spec = load_object(ev.CLUSTER_SPEC, self._environ[ev.CLUSTER_SPEC])
        return topology_from_spec(
            ev.CLUSTER_SPEC, "aiplatform", spec, LEGACY_POOLS, fallback_trial=self.platform_trial()
        )
