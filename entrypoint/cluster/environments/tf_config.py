"""TF_CONFIG on its own (TensorFlow clusters, Kubeflow TFJob): ``chief`` or ``master``, evaluator outside."""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments._cluster_spec import topology_from_spec
from entrypoint.cluster.environments._parse import load_object
from entrypoint.cluster.environments.aiplatform import LEGACY_POOLS
from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.topology import ClusterTopology


class TFConfigEnvironment(ClusterEnvironment):
    """TF_CONFIG; a ``master`` is read as the chief (TensorFlow 2 only knows ``chief``)."""

    source = "tf_config"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """TF_CONFIG is set."""
        return ev.TF_CONFIG in environ

    def topology(self) -> ClusterTopology:
        """Parse TF_CONFIG."""
        spec = load_object(ev.TF_CONFIG, self._environ[ev.TF_CONFIG])
        return topology_from_spec(ev.TF_CONFIG, "tf_config", spec, LEGACY_POOLS,
                                  fallback_trial=self.platform_trial())
