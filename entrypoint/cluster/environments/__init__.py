"""Cluster environments: the only place that reads cluster variables from ``os.environ``.

``resolve()`` walks ``DETECTION_ORDER`` and parses the first format whose variables are present.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from entrypoint.cluster.environments.aiplatform import AIPlatformEnvironment
from entrypoint.cluster.environments.base import ClusterEnvironment
from entrypoint.cluster.environments.jax_runtime import JaxRuntimeEnvironment
from entrypoint.cluster.environments.kubeflow import KubeflowEnvironment
from entrypoint.cluster.environments.local import LocalEnvironment
from entrypoint.cluster.environments.mpi import MPIEnvironment
from entrypoint.cluster.environments.settings import PlatformSettings, read_settings, secret_like_names, user_overrides
from entrypoint.cluster.environments.tf_config import TFConfigEnvironment
from entrypoint.cluster.environments.torch_nodes import TorchEnvironment
from entrypoint.cluster.environments.torchrun import TorchElasticEnvironment
from entrypoint.cluster.environments.vertex import VertexEnvironment
from entrypoint.cluster.topology import ClusterTopology

# First match wins. Why each sits where it does:
DETECTION_ORDER: tuple[type[ClusterEnvironment], ...] = (
    # Per-process variables mean this process was already spawned (by torchrun, or by a launcher
    # around our image): it may inherit the node's CLUSTER_SPEC, which must not make it spawn again.
    TorchElasticEnvironment,
    # Likewise for mpirun / horovodrun / our Horovod launcher (OMPI_*, PMI_*, HOROVOD_*).
    MPIEnvironment,
    # Legacy CLUSTER_SPEC (master/worker/ps/evaluator) before Vertex, because Vertex claims every
    # other CLUSTER_SPEC, malformed ones included, so that their errors are reported.
    AIPlatformEnvironment,
    # CLUSTER_SPEC beats TF_CONFIG: Vertex sets both, and only CLUSTER_SPEC names the pools
    # (workerpool2 may be a Reduction Server, which TF_CONFIG would call ``ps``).
    VertexEnvironment,
    # TF_CONFIG alone: TensorFlow clusters and Kubeflow TFJob.
    TFConfigEnvironment,
    # Kubeflow PyTorchJob's PET_* are torchrun's arguments for this node; they are more precise
    # than the RANK/WORLD_SIZE the operator sets beside them.
    KubeflowEnvironment,
    # RANK / WORLD_SIZE / MASTER_* at node level (AI Platform PyTorch, Kubeflow PyTorchJob).
    TorchEnvironment,
    # Kubeflow Trainer's JAX runtime: JAX_NUM_PROCESSES / JAX_PROCESS_ID. Last of the cluster formats: the
    # platforms above never set them, but a user may set them (and JAX_COORDINATOR_ADDRESS, which jax.distributed
    # reads) beside a platform's own variables, which describe the job more fully (pools, the server pool).
    JaxRuntimeEnvironment,
    # Nothing set: one node on its own.
    LocalEnvironment,
)


def detect(environ: Mapping[str, str] | None = None) -> ClusterEnvironment:
    """The first environment in DETECTION_ORDER whose variables are present."""
    env = dict(os.environ) if environ is None else environ
    for cls in DETECTION_ORDER:
        if cls.detect(env):
            return cls(env)
    raise AssertionError("LocalEnvironment always applies")  # pragma: no cover


def resolve(environ: Mapping[str, str] | None = None) -> ClusterTopology:
    """Resolve the cluster environment into a topology (raises ConfigError on bad input)."""
    environment = detect(environ)
    topo = environment.topology()
    assert topo.processes_started_externally == environment.creates_processes_externally, environment.source
    return topo


__all__ = [
    "DETECTION_ORDER",
    "ClusterEnvironment",
    "PlatformSettings",
    "detect",
    "read_settings",
    "resolve",
    "secret_like_names",
    "user_overrides",
]
