"""Horovod as the registry sees it: one process per GPU meeting through Horovod's gloo rendezvous, no ssh.

Imports nothing heavy. The fusion settings (128 MiB, 5 ms) are Vertex's Reduction Server
recommendation; variables the user set always win.
"""

from __future__ import annotations

from entrypoint import envvars as ev
from entrypoint.environments.settings import PlatformSettings
from entrypoint.options import RunOptions
from entrypoint.outputs import OutputDirs
from entrypoint.pytorch.framework import plan_torch_node
from entrypoint.registry import Framework, NodePlan
from entrypoint.topology import ClusterTopology

HOROVOD_FUSION_THRESHOLD_DEFAULT = 134217728  # 128 MiB, Vertex's Reduction Server recommendation
HOROVOD_CYCLE_TIME_DEFAULT_MS = 5.0


def tuning_env(options: RunOptions, user_set: dict[str, str], job_dir: str) -> dict[str, str]:
    """HOROVOD_FUSION_THRESHOLD / CYCLE_TIME (/ AUTOTUNE) for the workers; variables the user set always win."""
    threshold = options.fusion_threshold if options.fusion_threshold is not None else HOROVOD_FUSION_THRESHOLD_DEFAULT
    cycle = options.cycle_time_ms if options.cycle_time_ms is not None else HOROVOD_CYCLE_TIME_DEFAULT_MS
    env = {ev.HOROVOD_FUSION_THRESHOLD: str(threshold), ev.HOROVOD_CYCLE_TIME: f"{cycle:g}"}
    if options.autotune:
        env[ev.HOROVOD_AUTOTUNE] = "1"
        env[ev.HOROVOD_AUTOTUNE_LOG] = f"{job_dir.rstrip('/')}/horovod_autotune.csv"
    env.update(user_set)
    return env


def plan(topo: ClusterTopology, options: RunOptions, settings: PlatformSettings, gpus: int,
         outputs: OutputDirs) -> NodePlan:
    """One Horovod process per GPU (or --nproc-per-node) on every node; fusion tuned; tf-keras for Keras users."""
    nproc, reason, server_pool = plan_torch_node(topo, options, gpus, "horovod")
    env = tuning_env(options, dict(settings.horovod_tuning), outputs.job_dir)
    # tf-keras (Keras 2) ships beside TensorFlow in our images: horovod.tensorflow.keras needs Keras 2.
    env[ev.TF_USE_LEGACY_KERAS] = settings.tf_use_legacy_keras or "1"
    return NodePlan(strategy="horovod", reason=reason, nproc_per_node=nproc, server_pool=server_pool, env=env)


FRAMEWORK = Framework(
    name="horovod",
    probe="horovod",
    strategies=("default", "horovod"),
    plan=plan,
    launcher="entrypoint.horovod.launch:launch",
    worker="entrypoint.horovod.worker:run",
)
