"""``job kubeflow``: a Training Operator (kubeflow.org/v1) PyTorchJob or TFJob, or a Trainer v2 TrainJob.

Every v1 replica restarts with ``restartPolicy: ExitCode``: from training-operator v1.5.0 on (its
kubeflow/common v0.4.3) the operator recreates a pod whose container exits with a code >= 128 (preemption, a
peer that never came) and fails the job on a lower one (1 user code, 2 configuration), which is how
docs/EXIT_CODES.md splits ours; older operators retry only 130, 137, 138 and 143. ``runPolicy.backoffLimit``
counts container restarts, which a recreated pod does not have: it does not bound these restarts
(kubeflow/trainer#2045); ``activeDeadlineSeconds`` does. Horovod jobs are PyTorchJobs: the operator's
PET_* / MASTER_ADDR variables are all our launcher needs. ``spec.nprocPerNode`` and ``runPolicy.suspend`` came with
training-operator v1.7.0 ("Set correct ENV for PytorchJob to support torchrun" #1840, "Implement suspend semantics"
#1859); an older operator's CRD schema drops them. ``runPolicy.schedulingPolicy`` (minAvailable, queue,
priorityClass, scheduleTimeoutSeconds) is read when the operator runs with a gang scheduler (volcano,
scheduler-plugins). Kueue reads its queue from the job's ``kueue.x-k8s.io/queue-name`` label
(https://kueue.sigs.k8s.io/docs/tasks/run/trainjobs/, and so for its PyTorchJob and TFJob integrations); Istio's
sidecar injection from each pod's ``sidecar.istio.io/inject`` annotation
(https://www.kubeflow.org/docs/components/pytorch/: a PyTorchJob "needs annotation sidecar.istio.io/inject: "false""
in a Kubeflow user namespace).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field, replace
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jobs import planned
from entrypoint.jobs.args import infer_framework, run_options
from entrypoint.jobs.images import parse_image
from entrypoint.jobs.kubeflow import pods
from entrypoint.jobs.kubeflow.placement import V1_JOB_LABEL, selector
from entrypoint.jobs.kubeflow.pods import PodOptions
from entrypoint.planning import registry

KINDS = {"pytorchjob": "PyTorchJob", "tfjob": "TFJob", "trainjob": "TrainJob"}
# The replicas each kind has: PyTorchJob Master/Worker, TFJob Chief/Worker/PS/Evaluator, TrainJob nodes.
KIND_ROLES = {kind: tuple(types) for kind, types in planned.KUBEFLOW_REPLICAS.items()}
API_VERSION = "kubeflow.org/v1"
MIN_OPERATOR = "v1.5.0"  # restartPolicy ExitCode as docs/EXIT_CODES.md needs it
MIN_OPERATOR_NPROC = "v1.7.0"  # spec.nprocPerNode, runPolicy.suspend
CLEAN_POD_POLICIES = ("None", "Running", "All")
DEFAULT_BACKOFF_LIMIT = 3
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
ISTIO_INJECT = "sidecar.istio.io/inject"
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class Gang:
    """runPolicy.schedulingPolicy (a gang scheduler's PodGroup) and runPolicy.suspend."""

    min_available: int | None = None
    queue: str | None = None
    timeout_s: int | None = None
    suspend: bool = False

    def policy(self, priority_class: str | None) -> dict[str, Any] | None:
        """schedulingPolicy, camelCase (None when no gang option is given)."""
        if self.min_available is None and self.queue is None and self.timeout_s is None:
            return None
        items = (("minAvailable", self.min_available), ("queue", self.queue), ("priorityClass", priority_class),
                 ("scheduleTimeoutSeconds", self.timeout_s))
        return {k: v for k, v in items if v is not None}


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
    role_pods: dict[str, PodOptions] = field(default_factory=dict)  # roles.role_options (by ROLES' names)
    labels: tuple[tuple[str, str], ...] = ()  # the job's metadata.labels
    annotations: tuple[tuple[str, str], ...] = ()
    gang: Gang = field(default_factory=Gang)

    def pods_of(self, role: str) -> PodOptions:
        """The pod options of a role (chief, worker, ps, evaluator; a PyTorchJob's chief is its master)."""
        key = "master" if role == "chief" and self.kind == "pytorchjob" else role
        return self.role_pods.get(key, self.pods)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The job-level options of ``job kubeflow`` (the pods' are in jobs.pods, per role in jobs.roles)."""
    p.add_argument("--name", help="metadata.name, a DNS-1035 label (default: <image name>-job)")
    p.add_argument("--namespace")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help=f"the job's label, repeatable (Kueue: {KUEUE_QUEUE}=LOCAL_QUEUE)")
    p.add_argument("--annotation", action="append", default=[], metavar="KEY=VALUE", help="the job's, repeatable")
    g = p.add_argument_group("run policy (PyTorchJob/TFJob runPolicy; TrainJob: --active-deadline, --suspend)")
    g.add_argument("--backoff-limit", type=int, help=f"runPolicy.backoffLimit (default {DEFAULT_BACKOFF_LIMIT}); "
                   "it does not bound ExitCode restarts: see --active-deadline")
    g.add_argument("--clean-pod-policy", choices=CLEAN_POD_POLICIES, help="pods to delete when the job ends")
    g.add_argument("--ttl-seconds-after-finished", type=int, metavar="S", help="delete the finished job after S")
    g.add_argument("--active-deadline", type=int, metavar="S", dest="active_deadline_seconds",
                   help="activeDeadlineSeconds: fail the job after S seconds, restarts included")
    g.add_argument("--suspend", action="store_true", help="create the job suspended (training-operator v1.7.0+)")
    g.add_argument("--min-available", type=int, metavar="N", help="gang scheduling: start no pod before N can run "
                   "(schedulingPolicy.minAvailable; needs the operator's gang scheduler)")
    g.add_argument("--scheduling-queue", metavar="QUEUE", help="the gang scheduler's queue (schedulingPolicy.queue)")
    g.add_argument("--schedule-timeout", type=int, metavar="S", help="schedulingPolicy.scheduleTimeoutSeconds")
    p.add_argument("--runtime", default="torch-distributed", help="TrainJob: the ClusterTrainingRuntime "
                   "(default torch-distributed)")


def metadata_options(ns: argparse.Namespace) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...],
                                                      Gang, list[str]]:
    """--label, --annotation, the gang options, checked; and warnings about keys read elsewhere than given."""
    labels = pods.metadata(ns.label, "--label", True)
    annotations = pods.metadata(ns.annotation, "--annotation", False)
    for flag, value, low in (("--min-available", ns.min_available, 1), ("--schedule-timeout", ns.schedule_timeout, 1)):
        if value is not None and value < low:
            raise ConfigError(flag, f"must be >= {low}")
    if ns.scheduling_queue is not None and not ns.scheduling_queue.strip():
        raise ConfigError("--scheduling-queue", "must name a queue")
    warnings = []
    if any(item.partition("=")[0] == KUEUE_QUEUE for item in ns.pod_label):
        warnings.append(f"--pod-label {KUEUE_QUEUE}: Kueue reads the queue from the job's labels: use --label")
    if ns.topology is not None and not any(k == KUEUE_QUEUE for k, _ in labels):
        warnings.append(f"--topology: Kueue places only the jobs of its queues: give --label {KUEUE_QUEUE}=QUEUE")
    if any(k == ISTIO_INJECT for k, _ in annotations):
        warnings.append(f"--annotation {ISTIO_INJECT}: Istio reads it from each pod: use --pod-annotation")
    return labels, annotations, Gang(ns.min_available, ns.scheduling_queue, ns.schedule_timeout, ns.suspend), warnings


def check_name(name: str, flag: str = "--name") -> None:
    """The operators' rule for job names: a DNS-1035 label (a lowercase letter first), at most 63."""
    if not (_DNS_1035.fullmatch(name) and len(name) <= 63):
        raise ConfigError(flag, "must be a DNS-1035 label: a lowercase letter, then lowercase letters, digits "
                          "and '-', at most 63, not ending in '-'")


def default_name(image: str, limit: int = 63) -> str:
    """A valid job name from the image's name (``pytorch-job`` for ``.../pytorch:v1``, ``job-3d`` for ``3d``), at
    most ``limit`` characters."""
    base = parse_image(image).name.lower()
    base = re.sub(r"[^a-z0-9-]+", "-", base).strip("-")[:max(1, min(50, limit - 4))].strip("-") or "trainer"
    return f"{base}-job" if base[0].isalpha() else f"job-{base}"


# The replicated jobs of Kubeflow Trainer's runtimes for our images (manifests/base/runtimes/): each becomes a Job of
# the TrainJob's JobSet, named <name>-<replicated job>-<index>. The node job is Indexed with numNodes completions.
RUNTIME_JOBS = {"torch-distributed": ("node",), "torch-distributed-with-cache": ("dataset-initializer", "node")}


def longest_generated_name(req: KubeflowRequest, name: str) -> str:
    """The longest name the operator derives from the job's: a v1 operator's Service and pod per replica
    ``<name>-<type>-<index>`` (training-operator's GenGeneralName, the type in lowercase); a TrainJob's JobSet names
    each replicated job's Jobs ``<name>-<job>-<index>`` and the node job's pods ``<name>-node-<job index>-<pod
    index>-<5 random>``, and its webhook checks both (``jobNameTooLongErrorMsg``; ``podNameTooLongErrorMsg``, with the
    suffix ``-abcde``). Each must be a DNS-1035 label of at most 63. An unknown runtime is judged by its node job."""
    if req.kind == "trainjob":
        jobs = [f"{name}-{job}-0" for job in RUNTIME_JOBS.get(req.runtime, ("node",))]
        return max([*jobs, f"{name}-node-0-{req.workers - 1}-abcde"], key=len)
    counts = {"chief": 1, "worker": req.workers - 1, "ps": req.ps, "evaluator": req.evaluators}
    types = planned.KUBEFLOW_REPLICAS[req.kind]
    return max((f"{name}-{types[role].lower()}-{counts[role] - 1}" for role in types if counts.get(role, 0) > 0),
               key=len)


def job_name(req: KubeflowRequest) -> str:
    """--name, else a name from the image short enough for the names the operator derives from it."""
    if req.name is not None:
        return req.name
    probe = "x" * 63
    return default_name(req.image, 63 - (len(longest_generated_name(req, probe)) - len(probe)))


def _check_generated_names(req: KubeflowRequest, name: str) -> None:
    longest = longest_generated_name(req, name)
    if len(longest) <= 63:
        return
    spare = 63 - (len(longest) - len(name))
    what = ("JobSet names the TrainJob's Jobs <name>-<replicated job>-<index> and its pods "
            "<name>-node-0-<index>-<5 random characters>" if req.kind == "trainjob"
            else "the operator names each replica's Service and pod <name>-<type>-<index>")
    suffix = longest[len(name):]
    raise ConfigError("--name", f"{what}, a DNS-1035 label of at most 63, and this job's longest, <name>{suffix}, "
                      f"would have {len(longest)}: at most {spare} characters for this job")


def _check_counts(req: KubeflowRequest) -> None:
    if req.kind not in KINDS:
        raise ConfigError("--kind", f"expected one of {', '.join(KINDS)}")
    numbers = (req.ps, req.evaluators, req.backoff_limit or 0, req.ttl_seconds_after_finished or 0)
    if req.workers < 1 or min(numbers) < 0 or (req.active_deadline_seconds is not None
                                               and req.active_deadline_seconds < 1):
        raise ConfigError("job kubeflow", "--workers and --active-deadline must be >= 1; --ps, --evaluators, "
                          "--backoff-limit, --ttl-seconds-after-finished >= 0")
    total = req.workers + req.ps + req.evaluators
    if req.gang.min_available is not None and req.gang.min_available > total:
        raise ConfigError("--min-available", f"is more than the job's {total} pods: the gang would never start")


def check(req: KubeflowRequest) -> str:
    """Validate the request (the kind's rules, then each replica type planned as it will run); the framework."""
    _check_counts(req)
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
    check_name(job_name(req))
    _check_generated_names(req, job_name(req))
    for flag, value in (("--namespace", req.namespace), ("--runtime", req.runtime)):
        if value is not None and not (_DNS_1123.fullmatch(value) and len(value) <= 63):
            raise ConfigError(flag, "must be a DNS-1123 label: lowercase letters, digits and '-', at most 63")
    counts = {"chief": 1, "worker": req.workers - 1, "ps": req.ps, "evaluator": req.evaluators}
    gpus = {role: req.pods_of(role).gpus for role in counts}
    replicas = planned.kubeflow_replicas(req.kind, job_name(req), req.run_args,
                                         dict(req.pods.env), counts, gpus)
    for replica in replicas:
        planned.plan_replica(replica, framework.name, "job kubeflow")
    return framework.name


def default_framework(kind: str) -> str:
    """The first registered framework a kind runs (a PyTorchJob's: pytorch)."""
    return next(n for n in registry.names() if kind in registry.get(n).kubeflow_kinds)


def role_counts(req: KubeflowRequest) -> dict[str, int]:
    """Pods per role."""
    return {"chief": 1, "worker": req.workers - 1, "ps": req.ps, "evaluator": req.evaluators}


@dataclass(frozen=True)
class RolePlace:
    """How one role's pods are placed among the job's: the replica types sharing its placement (its affinity and
    spread select those), whether it is in the training gang's Kueue PodSet group, whether it is cut into slices."""

    peers: tuple[str, ...]
    group: bool = False
    sliced: bool = False


def gang_layout(req: KubeflowRequest) -> tuple[dict[str, RolePlace], list[str]]:
    """Each present role's RolePlace, and warnings. The chief (Master) and the workers are two PodSets: with the same
    topology they form Kueue's PodSet group (Kueue places a group in one domain; "exactly 2 pod sets", one of a single
    pod); a slice topology cuts each PodSet with at least a slice's pods into slices (their count a multiple of the
    slice, at most the PodSet's pods), and Kueue refuses a group beside slices."""
    present = [r for r, n in role_counts(req).items() if n > 0 and r in KIND_ROLES[req.kind]]
    places = {r: req.pods_of(r).placement for r in present}
    types = planned.KUBEFLOW_REPLICAS[req.kind]
    layout: dict[str, RolePlace] = {}
    warnings: list[str] = []
    for role in present:
        peers = tuple(types[r].lower() for r in present if places[r] == places[role])
        cut = places[role].slice
        sliced = cut is not None and role_counts(req)[role] >= cut[1]
        if sliced and cut is not None and role_counts(req)[role] % cut[1]:
            raise ConfigError("--topology-slice", f"{types[role]} has {role_counts(req)[role]} pods, not a multiple of "
                              f"{cut[1]}: a slice would be cut short")
        layout[role] = RolePlace(peers, sliced=sliced)
    sliced_any = [r for r in present if layout[r].sliced]
    sizes = [p.slice[1] for p in places.values() if p.slice is not None]
    if sizes and not sliced_any:
        raise ConfigError("--topology-slice", f"{sizes[0]} pods per slice, but no replica type has that many: Kueue "
                          "refuses a slice larger than its PodSet")
    pair = [r for r in ("chief", "worker") if r in present]
    if len(pair) == 2 and places["chief"].topology and places["chief"].topology == places["worker"].topology:
        if any(layout[r].sliced for r in pair):
            warnings.append(f"--topology-slice: Kueue does not group a sliced PodSet with another (its webhook refuses "
                            f"podset-group-name beside slices): {types['chief']} and {types['worker']} each get a "
                            "domain of the topology, possibly different ones")
        else:
            layout.update({r: replace(layout[r], group=True) for r in pair})
    return layout, warnings


def _replica(req: KubeflowRequest, container: str, replicas: int, role: str) -> dict[str, Any]:
    opts = req.pods_of(role)
    place = gang_layout(req)[0][role]
    everyone = len(place.peers) == sum(1 for r, n in role_counts(req).items() if n > 0 and r in KIND_ROLES[req.kind])
    peers = selector(V1_JOB_LABEL, job_name(req), None if everyone else list(place.peers))
    spec = {**pods.pod_fields(opts, peers),
            "containers": [pods.container(opts, container, req.image, list(req.run_args), opts.gpus)]}
    template: dict[str, Any] = {"spec": _ordered(spec)}
    metadata = pods.pod_metadata(opts, place.group, place.sliced, f"{planned.KUBEFLOW_REPLICAS[req.kind][role]}: ")
    if metadata:
        template = {"metadata": metadata, **template}
    return {"replicas": replicas, "restartPolicy": "ExitCode", "template": template}


def _ordered(spec: dict[str, Any]) -> dict[str, Any]:
    """containers first, as people write pod specs."""
    return {"containers": spec.pop("containers"), **spec}


def _run_policy(req: KubeflowRequest) -> dict[str, Any]:
    items: list[tuple[str, Any]] = [
        ("cleanPodPolicy", req.clean_pod_policy),
        ("ttlSecondsAfterFinished", req.ttl_seconds_after_finished),
        ("activeDeadlineSeconds", req.active_deadline_seconds),
        ("backoffLimit", DEFAULT_BACKOFF_LIMIT if req.backoff_limit is None else req.backoff_limit),
        ("suspend", req.gang.suspend or None),
        ("schedulingPolicy", req.gang.policy(req.pods.priority_class)),
    ]
    return {k: v for k, v in items if v is not None}


def job_metadata(req: KubeflowRequest) -> dict[str, Any]:
    """The job's metadata: name, namespace, labels, annotations."""
    items = (("name", job_name(req)), ("namespace", req.namespace),
             ("labels", dict(req.labels)), ("annotations", dict(req.annotations)))
    return {k: v for k, v in items if v}


def build_v1(req: KubeflowRequest) -> dict[str, Any]:
    """The PyTorchJob or TFJob manifest; ConfigError when the combination is invalid."""
    check(req)
    if req.kind == "pytorchjob":
        replicas = {"Master": _replica(req, "pytorch", 1, "chief")}
        if req.workers > 1:
            replicas["Worker"] = _replica(req, "pytorch", req.workers - 1, "worker")
        spec: dict[str, Any] = {"nprocPerNode": str(req.pods_of("chief").gpus or 1), "runPolicy": _run_policy(req),
                                "pytorchReplicaSpecs": replicas}
    else:
        replicas = {"Chief": _replica(req, "tensorflow", 1, "chief")}
        for key, role, count in (("Worker", "worker", req.workers - 1), ("PS", "ps", req.ps),
                                 ("Evaluator", "evaluator", req.evaluators)):
            if count > 0:
                replicas[key] = _replica(req, "tensorflow", count, role)
        spec = {"runPolicy": _run_policy(req), "tfReplicaSpecs": replicas}
    return {"apiVersion": API_VERSION, "kind": KINDS[req.kind], "metadata": job_metadata(req), "spec": spec}


def header(req: KubeflowRequest) -> str:
    """The manifest's first comment lines: which operator version reads it as we mean it."""
    if req.kind == "trainjob":
        return ("# Kubeflow Trainer v2.2 or later (runtimePatches, activeDeadlineSeconds); restarts follow the "
                "runtime's JobSet and Job policies\n")
    needs = [what for what, used in (("nprocPerNode", req.kind == "pytorchjob"), ("runPolicy.suspend",
                                                                                 req.gang.suspend)) if used]
    first = f"{MIN_OPERATOR_NPROC} or later ({', '.join(needs)}); " if needs else f"{MIN_OPERATOR} or later: "
    return (f"# Kubeflow Training Operator {first}restartPolicy ExitCode retries exit codes >= 128 (from "
            f"{MIN_OPERATOR} on; older operators: only 130, 137, 138, 143).\n# runPolicy.backoffLimit does not bound "
            "those restarts; activeDeadlineSeconds (--active-deadline) does.\n")
