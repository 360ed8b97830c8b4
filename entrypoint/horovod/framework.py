"""Horovod as the registry sees it: one process per GPU meeting through Horovod's gloo rendezvous, no ssh.

Imports nothing heavy. Horovod owns its flags (``--fusion-threshold``, ``--cycle-time-ms``, ``--autotune``) and
the variables they set; the fusion defaults (128 MiB, 5 ms) are Vertex's Reduction Server recommendation, and
variables the user set always win.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.topology import ClusterTopology
from entrypoint.options import RunOptions, non_negative_int, positive_float
from entrypoint.outputs.locations import OutputDirs
from entrypoint.planning.registry import Flag, Framework, NodePlan
from entrypoint.pytorch.framework import CUDA_MAJOR, DATA_LOADER, plan_torch_node

HOROVOD_FUSION_THRESHOLD_DEFAULT = 134217728  # 128 MiB, Vertex's Reduction Server recommendation
HOROVOD_CYCLE_TIME_DEFAULT_MS = 5.0
FLAGS = (
    Flag("--fusion-threshold", f"HOROVOD_FUSION_THRESHOLD bytes (default {HOROVOD_FUSION_THRESHOLD_DEFAULT}; the "
         "env var wins)", non_negative_int),
    Flag("--cycle-time-ms", f"HOROVOD_CYCLE_TIME (default {HOROVOD_CYCLE_TIME_DEFAULT_MS:g} ms)", positive_float),
    Flag("--autotune", "Horovod autotuning, log in the job dir", switch=True),
)


def tuning_env(options: RunOptions, user_set: Mapping[str, str], job_dir: str) -> dict[str, str]:
    """HOROVOD_FUSION_THRESHOLD / CYCLE_TIME (/ AUTOTUNE) for the workers; variables the user set always win."""
    threshold = options.framework_option("fusion_threshold", HOROVOD_FUSION_THRESHOLD_DEFAULT)
    cycle = options.framework_option("cycle_time_ms", HOROVOD_CYCLE_TIME_DEFAULT_MS)
    env = {ev.HOROVOD_FUSION_THRESHOLD: str(threshold), ev.HOROVOD_CYCLE_TIME: f"{cycle:g}"}
    if options.framework_option("autotune", False):
        env[ev.HOROVOD_AUTOTUNE] = "1"
        env[ev.HOROVOD_AUTOTUNE_LOG] = f"{job_dir.rstrip('/')}/horovod_autotune.csv"
    env.update({name: value for name, value in user_set.items() if name in ev.HOROVOD_TUNING})
    return env


def plan(topo: ClusterTopology, options: RunOptions, user_set: Mapping[str, str], gpus: int,
         outputs: OutputDirs) -> NodePlan:
    """One Horovod process per GPU (or --nproc-per-node) on every node; fusion tuned; tf-keras for Keras users."""
    nproc, reason, server_pool = plan_torch_node(topo, options, gpus, "horovod")
    env = tuning_env(options, user_set, outputs.job_dir)
    # tf-keras (Keras 2) ships beside TensorFlow in our images: horovod.tensorflow.keras needs Keras 2.
    env[ev.TF_USE_LEGACY_KERAS] = user_set.get(ev.TF_USE_LEGACY_KERAS, "1")
    return NodePlan(strategy="horovod", reason=reason, nproc_per_node=nproc, server_pool=server_pool, env=env)


FRAMEWORK = Framework(
    name="horovod",
    probe="horovod",
    strategies=("default", "horovod"),
    plan=plan,
    launcher="entrypoint.horovod.launch:launch",
    worker="entrypoint.horovod.worker:run",
    flags=FLAGS,
    user_variables=(*ev.HOROVOD_TUNING, ev.TF_USE_LEGACY_KERAS),
    title="Horovod",
    data_loader=DATA_LOADER,  # the PyTorch hooks loop, through Horovod's collectives
    cpu_collectives="gloo",
    local_rank_variable=ev.HOROVOD_LOCAL_RANK,  # our launcher starts each worker with it (horovod/launch.py)
    prefixed_output=True,  # the launcher prints each worker's lines behind "[rank-N] "
    chosen_alone=False,  # it rides on torch (and TensorFlow): name it with --framework
    image="horovod",
    cuda_major=CUDA_MAJOR,  # built on the PyTorch image's CUDA (docs/horovod.md)
    kubeflow_kinds=("pytorchjob", "trainjob"),  # our launcher needs only PET_*'s node rank, count and master
    init_from=True,  # the PyTorch hooks loop (pytorch/loop/pretrained.py)
    # a peer lost mid-collective (HorovodInternalError), an elastic host change; raised where its ops run
    peer_errors=("horovod.common.exceptions.HorovodInternalError", "horovod.common.exceptions.HostsUpdatedInterrupt"),
    peer_modules=("horovod", "entrypoint.horovod"),
    peer_messages=("horovod has been shut down",),
)
