"""``job kubeflow``: a Kubeflow Training Operator (kubeflow.org/v1) PyTorchJob or TFJob for our image.

Every replica restarts with ``restartPolicy: ExitCode``: the operator restarts a pod whose container
exits with a retryable code (>= 128: preemption, a peer that never came) and fails the job on a
permanent one (1 user code, 2 configuration), which is how docs/EXIT_CODES.md splits ours.
Horovod jobs are PyTorchJobs: the operator's PET_* / MASTER_ADDR variables are all our launcher needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jobs.rules import infer_framework, run_options

KINDS = {"pytorchjob": "PyTorchJob", "tfjob": "TFJob"}
API_VERSION = "kubeflow.org/v1"
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class KubeflowRequest:
    """What ``job kubeflow`` was asked for."""

    kind: str
    image: str
    run_args: tuple[str, ...]
    framework: str | None = None
    workers: int = 1
    gpus: int = 0
    ps: int = 0
    evaluators: int = 0
    name: str | None = None
    namespace: str | None = None
    backoff_limit: int = 3


def _container(req: KubeflowRequest, name: str, gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": req.image}
    if req.run_args:
        container["args"] = list(req.run_args)  # the image's ENTRYPOINT is `python -m entrypoint run`
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}  # a Quantity
    return container


def _replica(req: KubeflowRequest, container: str, replicas: int, gpus: int) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "restartPolicy": "ExitCode",
        "template": {"spec": {"containers": [_container(req, container, gpus)]}},
    }


def _check(req: KubeflowRequest) -> str:
    """Validate the request; return the framework."""
    if req.kind not in KINDS:
        raise ConfigError("--kind", f"expected one of {', '.join(KINDS)}")
    if req.workers < 1 or req.gpus < 0 or req.ps < 0 or req.evaluators < 0 or req.backoff_limit < 0:
        raise ConfigError("job kubeflow", "--workers must be >= 1; --gpus, --ps, --evaluators, --backoff-limit >= 0")
    options = run_options(req.run_args, "job kubeflow")
    framework = infer_framework(req.framework, req.image, options.framework)
    if req.kind == "tfjob" and framework not in (None, "tensorflow"):
        raise ConfigError("--kind", f"a TFJob runs TensorFlow, not {framework}; use --kind pytorchjob")
    if req.kind == "pytorchjob":
        if framework == "tensorflow":
            raise ConfigError("--kind", "a TensorFlow job is a TFJob; use --kind tfjob")
        if req.ps or req.evaluators:
            raise ConfigError("--ps/--evaluators", "parameter servers and evaluators are TensorFlow only (TFJob)")
    if req.ps and req.workers < 2:
        raise ConfigError("--ps", "ParameterServerStrategy needs at least one worker besides the chief "
                          "(--workers >= 2)")
    if req.name is not None and not (_DNS_1123.fullmatch(req.name) and len(req.name) <= 63):
        raise ConfigError("--name", "must be a DNS-1123 label: lowercase letters, digits and '-', at most 63")
    return framework or ("tensorflow" if req.kind == "tfjob" else "pytorch")


def default_name(image: str) -> str:
    """A valid job name from the image's name (``pytorch-job`` for ``.../pytorch:v1``)."""
    base = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0].lower()
    base = re.sub(r"[^a-z0-9-]+", "-", base).strip("-")[:50] or "trainer"
    return f"{base}-job"


def build_manifest(req: KubeflowRequest) -> dict[str, Any]:
    """The PyTorchJob or TFJob manifest; ConfigError when the combination is invalid."""
    _check(req)
    metadata: dict[str, Any] = {"name": req.name or default_name(req.image)}
    if req.namespace:
        metadata["namespace"] = req.namespace
    run_policy = {"backoffLimit": req.backoff_limit}
    if req.kind == "pytorchjob":
        replicas = {"Master": _replica(req, "pytorch", 1, req.gpus)}
        if req.workers > 1:
            replicas["Worker"] = _replica(req, "pytorch", req.workers - 1, req.gpus)
        spec: dict[str, Any] = {"nprocPerNode": str(req.gpus or 1), "runPolicy": run_policy,
                                "pytorchReplicaSpecs": replicas}
    else:
        replicas = {"Chief": _replica(req, "tensorflow", 1, req.gpus)}
        if req.workers > 1:
            replicas["Worker"] = _replica(req, "tensorflow", req.workers - 1, req.gpus)
        if req.ps:
            replicas["PS"] = _replica(req, "tensorflow", req.ps, 0)
        if req.evaluators:
            replicas["Evaluator"] = _replica(req, "tensorflow", req.evaluators, req.gpus)
        spec = {"runPolicy": run_policy, "tfReplicaSpecs": replicas}
    return {"apiVersion": API_VERSION, "kind": KINDS[req.kind], "metadata": metadata, "spec": spec}
