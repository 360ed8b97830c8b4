"""``job kubeflow``: a Training Operator (kubeflow.org/v1) PyTorchJob or TFJob, or a Trainer v2 TrainJob.

Every v1 replica restarts with ``restartPolicy: ExitCode``: from training-operator v1.5.0 on (its
kubeflow/common v0.4.3) the operator recreates a pod whose container exits with a code >= 128 (preemption, a
peer that never came) and fails the job on a lower one (1 user code, 2 configuration), which is how
docs/EXIT_CODES.md splits ours; older operators retry only 130, 137, 138 and 143. ``runPolicy.backoffLimit``
counts container restarts, which a recreated pod does not have: it does not bound these restarts
(kubeflow/trainer#2045); ``activeDeadlineSeconds`` does. Horovod jobs are PyTorchJobs: the operator's
PET_* / MASTER_ADDR variables are all our launcher needs.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jobs import planned, pods
from entrypoint.jobs.args import infer_framework, run_options
from entrypoint.jobs.images import parse_image
from entrypoint.jobs.pods import PodOptions
from entrypoint.planning import registry

KINDS = {"pytorchjob": "PyTorchJob", "tfjob": "TFJob", "trainjob": "TrainJob"}
# The replicas each kind has: PyTorchJob Master/Worker, TFJob Chief/Worker/PS/Evaluator, TrainJob nodes.
KIND_ROLES = {kind: tuple(types) for kind, types in planned.KUBEFLOW_REPLICAS.items()}
API_VERSION = "kubeflow.org/v1"
MIN_OPERATOR = "v1.5.0"
CLEAN_POD_POLICIES = ("None", "Running", "All")
DEFAULT_BACKOFF_LIMIT = 3
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class KubeflowRequest:
    """What ``job kubeflow`` was asked for."""

    kind: str
    image: str
    run_args: tuple[str, ...]
    framework: str | None = None
    workers: int = 1
    ps: int = 0
    evaluators: int = 0
    name: str | None = None
    namespace: str | None = None
    backoff_limit: int | None = None
    clean_pod_policy: str | None = None
    ttl_seconds_after_finished: int | None = None
    active_deadline_seconds: int | None = None
    runtime: str = "torch-distributed"
    pods: PodOptions = field(default_factory=PodOptions)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The job-level options of ``job kubeflow`` (the pods' are in jobs.pods)."""
    p.add_argument("--name", help="metadata.name, a DNS-1035 label (default: <image name>-job)")
    p.add_argument("--namespace")
    g = p.add_argument_group("run policy (PyTorchJob/TFJob runPolicy; TrainJob: --active-deadline only)")
    g.add_argument("--backoff-limit", type=int, help=f"runPolicy.backoffLimit (default {DEFAULT_BACKOFF_LIMIT}); "
                   "it does not bound ExitCode restarts: see --active-deadline")
    g.add_argument("--clean-pod-policy", choices=CLEAN_POD_POLICIES, help="pods to delete when the job ends")
    g.add_argument("--ttl-seconds-after-finished", type=int, metavar="S", help="delete the finished job after S")
    g.add_argument("--active-deadline", type=int, metavar="S", dest="active_deadline_seconds",
                   help="activeDeadlineSeconds: fail the job after S seconds, restarts included")
    p.add_argument("--runtime", default="torch-distributed", help="TrainJob: the ClusterTrainingRuntime "
                   "(default torch-distributed)")


def check_name(name: str, flag: str = "--name") -> None:
    """The operators' rule for job names: a DNS-1035 label (a lowercase letter first), at most 63."""
    if not (_DNS_1035.fullmatch(name) and len(name) <= 63):
        raise ConfigError(flag, "must be a DNS-1035 label: a lowercase letter, then lowercase letters, digits "
                          "and '-', at most 63, not ending in '-'")


def default_name(image: str) -> str:
    """A valid job name from the image's name (``pytorch-job`` for ``.../pytorch:v1``, ``job-3d`` for ``3d``)."""
    base = parse_image(image).name.lower()
    base = re.sub(r"[^a-z0-9-]+", "-", base).strip("-")[:50] or "trainer"
    return f"{base}-job" if base[0].isalpha() else f"job-{base}"


def check(req: KubeflowRequest) -> str:
    """Validate the request; return the framework."""
    if req.kind not in KINDS:
        raise ConfigError("--kind", f"expected one of {', '.join(KINDS)}")
    numbers = (req.ps, req.evaluators, req.backoff_limit or 0, req.ttl_seconds_after_finished or 0)
    if req.workers < 1 or min(numbers) < 0 or (req.active_deadline_seconds is not None
                                               and req.active_deadline_seconds < 1):
        raise ConfigError("job kubeflow", "--workers and --active-deadline must be >= 1; --ps, --evaluators, "
                          "--backoff-limit, --ttl-seconds-after-finished >= 0")
    options = run_options(req.run_args, "job kubeflow")
    name = infer_framework(req.framework, req.image, options.framework) or default_framework(req.kind)
    framework = registry.get(name)
    if req.kind not in framework.kubeflow_kinds:
        runtime = f" (Trainer v2 has no {framework.label} runtime)" if req.kind == "trainjob" else ""
        raise ConfigError("--kind", f"a {KINDS[req.kind]} does not run {framework.label}{runtime}; use --kind "
                          f"{' or '.join(framework.kubeflow_kinds)}")
    for flag, role, count in (("--ps", "ps", req.ps), ("--evaluators", "evaluator", req.evaluators)):
        why = registry.role_refusal(framework, role)
        if count and (why or role not in KIND_ROLES[req.kind]):
            raise ConfigError(flag, why or f"a {KINDS[req.kind]} has no {registry.ROLE_NAMES[role]}")
    check_name(req.name or default_name(req.image))
    for flag, value in (("--namespace", req.namespace), ("--runtime", req.runtime)):
        if value is not None and not (_DNS_1123.fullmatch(value) and len(value) <= 63):
            raise ConfigError(flag, "must be a DNS-1123 label: lowercase letters, digits and '-', at most 63")
    counts = {"chief": 1, "worker": req.workers - 1, "ps": req.ps, "evaluator": req.evaluators}
    gpus = {"chief": req.pods.gpus, "worker": req.pods.gpus, "ps": 0, "evaluator": req.pods.gpus}
    replicas = planned.kubeflow_replicas(req.kind, req.name or default_name(req.image), req.run_args,
                                         dict(req.pods.env), counts, gpus)
    for replica in replicas:
        planned.plan_replica(replica, framework.name, "job kubeflow")
    return framework.name


def default_framework(kind: str) -> str:
    """The first registered framework a kind runs (a PyTorchJob's: pytorch)."""
    return next(n for n in registry.names() if kind in registry.get(n).kubeflow_kinds)


def _replica(req: KubeflowRequest, container: str, replicas: int, gpus: int) -> dict[str, Any]:
    spec = {**pods.pod_fields(req.pods),
            "containers": [pods.container(req.pods, container, req.image, list(req.run_args), gpus)]}
    return {"replicas": replicas, "restartPolicy": "ExitCode", "template": {"spec": _ordered(spec)}}


def _ordered(spec: dict[str, Any]) -> dict[str, Any]:
    """containers first, as people write pod specs."""
    return {"containers": spec.pop("containers"), **spec}


def _run_policy(req: KubeflowRequest) -> dict[str, Any]:
    items: list[tuple[str, Any]] = [
        ("cleanPodPolicy", req.clean_pod_policy),
        ("ttlSecondsAfterFinished", req.ttl_seconds_after_finished),
        ("activeDeadlineSeconds", req.active_deadline_seconds),
        ("backoffLimit", DEFAULT_BACKOFF_LIMIT if req.backoff_limit is None else req.backoff_limit),
    ]
    return {k: v for k, v in items if v is not None}


def build_v1(req: KubeflowRequest) -> dict[str, Any]:
    """The PyTorchJob or TFJob manifest; ConfigError when the combination is invalid."""
    check(req)
    metadata: dict[str, Any] = {"name": req.name or default_name(req.image)}
    if req.namespace:
        metadata["namespace"] = req.namespace
    gpus = req.pods.gpus
    if req.kind == "pytorchjob":
        replicas = {"Master": _replica(req, "pytorch", 1, gpus)}
        if req.workers > 1:
            replicas["Worker"] = _replica(req, "pytorch", req.workers - 1, gpus)
        spec: dict[str, Any] = {"nprocPerNode": str(gpus or 1), "runPolicy": _run_policy(req),
                                "pytorchReplicaSpecs": replicas}
    else:
        replicas = {"Chief": _replica(req, "tensorflow", 1, gpus)}
        if req.workers > 1:
            replicas["Worker"] = _replica(req, "tensorflow", req.workers - 1, gpus)
        if req.ps:
            replicas["PS"] = _replica(req, "tensorflow", req.ps, 0)
        if req.evaluators:
            replicas["Evaluator"] = _replica(req, "tensorflow", req.evaluators, gpus)
        spec = {"runPolicy": _run_policy(req), "tfReplicaSpecs": replicas}
    return {"apiVersion": API_VERSION, "kind": KINDS[req.kind], "metadata": metadata, "spec": spec}


def header(kind: str) -> str:
    """The manifest's first comment lines: which operator version reads it as we mean it."""
    if kind == "trainjob":
        return ("# Kubeflow Trainer v2.2 or later (runtimePatches, activeDeadlineSeconds); restarts follow the "
                "runtime's JobSet and Job policies\n")
    return (f"# Kubeflow Training Operator {MIN_OPERATOR} or later: restartPolicy ExitCode retries exit codes >= 128 "
            "(older operators: only 130, 137, 138, 143).\n# runPolicy.backoffLimit does not bound those restarts; "
            "activeDeadlineSeconds (--active-deadline) does.\n")
