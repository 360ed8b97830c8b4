"""``job kubeflow --kind trainjob``: a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) for our image.

The TrainJob names a ClusterTrainingRuntime (``torch-distributed`` by default) whose torch plugin sets
PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT in each node's
container: what our entrypoint reads for PyTorch and Horovod (https://github.com/kubeflow/trainer,
pkg/runtime/framework/plugins/torch). Our image replaces the runtime's, its ENTRYPOINT runs the args.
Pod details a TrainJob has no field for (service account, pull secrets, placement, /dev/shm, volumes, the pods'
labels and annotations) go into a ``runtimePatches`` entry (Trainer v2.2 and later): its PodSpecPatch takes
affinity, containers (env, volumeMounts), imagePullSecrets, nodeSelector, serviceAccountName, tolerations and
volumes, and no schedulerName, priorityClassName or container resources (kubeflow-trainer-api 2.3.0's models),
so those are refused here, as are the v1 run policy and gang options (the runtime's JobSet, its podGroupPolicy
or Kueue decide them). Restarts are the runtime's: the operators' ExitCode policy does not exist here, so every
failure, permanent ones included, retries as the runtime's Job allows.
"""

from __future__ import annotations

from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jobs.kubeflow import fabricpods, pods
from entrypoint.jobs.kubeflow.job import KubeflowRequest, check, job_metadata, job_name
from entrypoint.jobs.kubeflow.placement import JOBSET_LABEL, selector

API_VERSION = "trainer.kubeflow.org/v1alpha1"
PATCH_MANAGER = "trainer-entrypoint.job-kubeflow"
NODE = "node"  # the runtime's replicated job and container name (constants.Node)


def _refuse_v1_only(req: KubeflowRequest) -> None:
    v1_only = (("--backoff-limit", req.backoff_limit), ("--clean-pod-policy", req.clean_pod_policy),
               ("--ttl-seconds-after-finished", req.ttl_seconds_after_finished),
               ("--min-available", req.gang.min_available), ("--scheduling-queue", req.gang.queue),
               ("--schedule-timeout", req.gang.timeout_s))
    given = [flag for flag, value in v1_only if value is not None]
    if given:
        raise ConfigError(", ".join(given), "a TrainJob has no such field (its runtime's JobSet sets it); "
                          "--active-deadline and --suspend are the TrainJob's")
    unpatchable = (("--scheduler-name", req.pods.scheduler_name), ("--priority-class", req.pods.priority_class),
                   ("--spread", req.pods.placement.spread or None))
    given = [flag for flag, value in unpatchable if value is not None]
    if given:
        raise ConfigError(", ".join(given), "a TrainJob's runtime patch cannot set it (PodSpecPatch has no such "
                          "field): the runtime's podGroupPolicy or Kueue schedules a TrainJob")
    if req.pods.fabric is not None:
        raise ConfigError("--node-fabric", "a TrainJob's runtime patch cannot set it (PodSpecPatch has no init "
                          f"containers): the runtime ({req.runtime}) must carry "
                          f"{fabricpods.runtime_pieces(req.pods.fabric.fabric)} (docs/fabric.md)")


def _patch(req: KubeflowRequest) -> dict[str, Any] | None:
    """The runtime patch for what TrainJob.spec.trainer cannot say."""
    pod = pods.pod_fields(req.pods, selector(JOBSET_LABEL, job_name(req)))
    mounts = pods.volume_mounts(req.pods)
    if mounts:
        pod["containers"] = [{"name": NODE, "volumeMounts": mounts}]
    cut = req.pods.placement.slice
    if cut is not None and (req.workers < cut[1] or req.workers % cut[1]):
        raise ConfigError("--topology-slice", f"{req.workers} nodes are not a whole number of slices of {cut[1]} "
                          "(Kueue: at most the PodSet's pods; here a multiple of them, or a slice is cut short)")
    metadata = pods.pod_metadata(req.pods)
    if not pod and not metadata:
        return None
    template: dict[str, Any] = {"metadata": metadata} if metadata else {}
    if pod:
        template["spec"] = pod
    job = {"template": {"spec": {"template": template}}}
    return {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": NODE, **job}]}}}}


def build_trainjob(req: KubeflowRequest) -> dict[str, Any]:
    """The TrainJob manifest; ConfigError when the combination is invalid."""
    check(req)
    _refuse_v1_only(req)
    trainer: dict[str, Any] = {"image": req.image}
    if req.run_args:
        trainer["args"] = list(req.run_args)
    if pods.env_vars(req.pods):
        trainer["env"] = pods.env_vars(req.pods)
    trainer["numNodes"] = req.workers
    trainer["numProcPerNode"] = req.pods.gpus or 1
    if pods.resources(req.pods, req.pods.gpus):
        trainer["resourcesPerNode"] = pods.resources(req.pods, req.pods.gpus)
    spec: dict[str, Any] = {
        "runtimeRef": {"name": req.runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
        "trainer": trainer,
    }
    patch = _patch(req)
    if patch:
        spec["runtimePatches"] = [patch]
    if req.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = req.active_deadline_seconds
    if req.gang.suspend:
        spec["suspend"] = True
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": job_metadata(req), "spec": spec}
