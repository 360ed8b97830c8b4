"""The pod side of ``job kubeflow``: resources, a memory-backed /dev/shm, volumes, placement, env, identity, metadata.

Shared by the training operator's PyTorchJob / TFJob (a pod template per replica) and Trainer v2's TrainJob
(``trainer.resourcesPerNode`` / ``trainer.env`` and a runtime patch of the pod). Kubernetes' own rules:
resource quantities (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/; a request
above its limit is refused: ResourceRequirements, "Requests cannot exceed Limits"), tolerations
(https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/), emptyDir with ``medium: Memory``
(https://kubernetes.io/docs/concepts/storage/volumes/#emptydir), label and annotation keys
(https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set),
``schedulerName`` and ``priorityClassName`` (PodSpec).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import is_secret_name
from entrypoint.errors import ConfigError
from entrypoint.jobs.kubeflow import fabricpods, placement, volumes
from entrypoint.jobs.kubeflow.fabricpods import FabricPods
from entrypoint.jobs.kubeflow.placement import Placement
from entrypoint.jobs.kubeflow.volumes import Volume
from entrypoint.jobs.vertex.options import parse_pairs

_QUANTITY = re.compile(r"(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_SUFFIX = {"m": 10**-3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "": 1}
# [prefix/]name: the prefix a DNS-1123 subdomain (dot-separated labels), the name as a label value but not empty.
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SHM_VOLUME = "dshm"
# Set by the operators in every pod (the entrypoint reads them): a manifest's own value would fight them.
OPERATOR_SETS = (ev.TF_CONFIG, ev.MASTER_ADDR, ev.MASTER_PORT, ev.WORLD_SIZE, ev.RANK)


@dataclass(frozen=True)
class PodOptions:
    """What every training pod gets besides its image and args."""

    gpus: int = 0
    cpu: str | None = None
    cpu_limit: str | None = None
    memory: str | None = None
    memory_limit: str | None = None
    shm_size: str | None = None  # None: unbounded (counts against the memory limit); "0": no /dev/shm volume
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[tuple[tuple[str, str], ...], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    env_secrets: tuple[tuple[str, str, str], ...] = ()  # (variable, secret name, key)
    service_account: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    volumes: tuple[Volume, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()  # the pods' (template.metadata.labels)
    annotations: tuple[tuple[str, str], ...] = ()  # the pods' (template.metadata.annotations)
    scheduler_name: str | None = None
    priority_class: str | None = None
    placement: Placement = field(default_factory=Placement)
    fabric: FabricPods | None = None  # --node-fabric: the GPU fabric's pod pieces (jobs/kubeflow/fabricpods.py)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The pod options of ``job kubeflow``."""
    g = p.add_argument_group("pods")
    g.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu per pod (also its process count)")
    g.add_argument("--cpu", metavar="QUANTITY", help="CPU request per pod (e.g. 8, 500m)")
    g.add_argument("--cpu-limit", metavar="QUANTITY", help="CPU limit (default: none, no throttling)")
    g.add_argument("--memory", metavar="QUANTITY", help="memory request per pod, also its limit (e.g. 32Gi)")
    g.add_argument("--memory-limit", metavar="QUANTITY", help="memory limit (default: --memory)")
    g.add_argument("--shm-size", metavar="QUANTITY", help="size limit of the memory-backed /dev/shm "
                   "(default: none, it counts against the memory limit; 0: no /dev/shm volume)")
    g.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    g.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE]:EFFECT",
                   help="tolerate a taint (kubectl taint's syntax), repeatable")
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="container env, repeatable")
    g.add_argument("--env-secret", action="append", default=[], metavar="KEY=SECRET:KEY",
                   help="container env from a Kubernetes Secret's key, repeatable")
    g.add_argument("--service-account", metavar="NAME", help="the pods' Kubernetes service account")
    g.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME", help="repeatable")
    g.add_argument("--volume", action="append", default=[], metavar="pvc:CLAIM:/PATH|hostpath:/HOST:/PATH|"
                   "gcs:BUCKET:/PATH[:ro]|emptydir:memory|disk|local-ssd:/PATH[:size=Q]",
                   help="a volume mounted in every pod (gcs: GKE's Cloud Storage FUSE CSI driver, :file-cache=Q, "
                   ":cache=memory|local-ssd, :mount-options=A,B last), repeatable")
    g.add_argument("--pod-label", action="append", default=[], metavar="KEY=VALUE", help="on every pod, repeatable")
    g.add_argument("--pod-annotation", action="append", default=[], metavar="KEY=VALUE",
                   help='on every pod, repeatable (e.g. sidecar.istio.io/inject=false in Kubeflow namespaces)')
    g.add_argument("--scheduler-name", metavar="NAME", help="the pods' scheduler (e.g. volcano for gang scheduling)")
    g.add_argument("--priority-class", metavar="NAME", help="the pods' PriorityClass (and the gang's, with "
                   "--min-available)")
    fabricpods.add_arguments(g)


def quantity(value: str | None, flag: str) -> str | None:
    if value is not None and not _QUANTITY.fullmatch(value):
        raise ConfigError(flag, "expected a Kubernetes quantity such as 8, 500m, 32Gi")
    return value


def amount(quantity: str) -> float:
    """A quantity's value (``500m`` -> 0.5, ``32Gi`` -> 34359738368)."""
    match = _QUANTITY.fullmatch(quantity)
    assert match is not None
    return float(match[1]) * _SUFFIX[match[3] or ""]


def check_pod(opts: PodOptions, where: str = "") -> None:
    """One role's pod as the platform will judge it: requests within limits, memory-backed volumes within the memory
    limit, node selectors the volumes do not contradict, nothing the GPU fabric's pieces already are."""
    check_requests(opts, where)
    check_memory_volumes(opts, where)
    wanted = volumes.node_labels(opts.volumes)
    for key, value in opts.node_selector:
        if key in wanted and wanted[key] != value:
            raise ConfigError("--node-selector", f"{where}{key}={value}, but a local-ssd volume needs nodes with "
                              f"{key}={wanted[key]} (GKE's label of Local SSD ephemeral storage): no node has both")
    if opts.fabric is not None:
        fabricpods.check_collisions(opts.fabric, [v.mount_path for v in opts.volumes],
                                    [v.name for v in opts.volumes], [name for name, _, _ in opts.env_secrets], where)


def check_memory_volumes(opts: PodOptions, where: str = "") -> None:
    """Memory-backed emptyDirs (``--volume emptydir:memory``, /dev/shm) are the container's memory ("files you write
    count against your container's memory limit", emptyDir): each, and all together, within the memory limit, else
    the container is OOM-killed before they fill."""
    limit = opts.memory_limit or opts.memory
    sized = [(f"--volume {v.mount_path}", v.size) for v in opts.volumes
             if v.kind == "emptydir" and v.source == "memory" and v.size]
    if opts.shm_size and amount(opts.shm_size):
        sized.append(("--shm-size", opts.shm_size))
    if not limit or not sized:
        return
    total = sum(amount(size) for _, size in sized)
    for flag, size in sized:
        if amount(size) > amount(limit):
            raise ConfigError(flag, f"{where}a memory-backed volume of {size} is above the memory limit {limit}, which "
                              "its files count against: the container is OOM-killed before it fills")
    if len(sized) > 1 and total > amount(limit):
        raise ConfigError(", ".join(flag for flag, _ in sized), f"{where}memory-backed volumes of {total / 2**30:.3g} "
                          f"GiB together are above the memory limit {limit}, which their files count against: the "
                          "container is OOM-killed before they fill")


def check_requests(opts: PodOptions, where: str = "") -> None:
    """A request above its limit is refused by the API server ("Requests cannot exceed Limits"); /dev/shm must
    fit in the memory limit it counts against, in whole bytes."""
    for resource, request, limit in (("cpu", opts.cpu, opts.cpu_limit), ("memory", opts.memory, opts.memory_limit)):
        if request and limit and amount(request) > amount(limit):
            raise ConfigError(f"--{resource}/--{resource}-limit", f"{where}the {resource} request is above its limit; "
                              "Kubernetes refuses the pod (requests cannot exceed limits)")
    if opts.shm_size is None:
        return
    if not amount(opts.shm_size).is_integer():
        raise ConfigError("--shm-size", f"{where}is a number of bytes, not a fraction of one (500m is half a byte: "
                          "write 512Mi)")
    limit = opts.memory_limit or opts.memory
    if limit and amount(opts.shm_size) > amount(limit):
        raise ConfigError("--shm-size", f"{where}is above the memory limit, and a memory-backed /dev/shm counts "
                          "against it (its files are the container's memory): the pod is killed before /dev/shm is "
                          "full; at most the memory limit")


def metadata(items: list[str], flag: str, labels: bool) -> tuple[tuple[str, str], ...]:
    """Labels or annotations: keys [prefix/]name; label values <= 63 of [-A-Za-z0-9_.]; annotation values free."""
    pairs = parse_pairs(items, flag, split_commas=False)
    for key, value in pairs:
        name = key.rsplit("/", 1)[-1]
        if not _LABEL_KEY.fullmatch(key) or len(name) > 63 or len(key) - len(name) > 254:
            raise ConfigError(flag, f"{key[:60]}: not a valid key ([prefix/]name, the name at most 63)")
        if labels and not _LABEL_VALUE.fullmatch(value):
            raise ConfigError(flag, f"{key}: a label value has at most 63 letters, digits, '-', '_' or '.'")
    return tuple(pairs)


def toleration(text: str, flag: str = "--toleration") -> tuple[tuple[str, str], ...]:
    """``KEY[=VALUE]:EFFECT`` (kubectl taint's syntax) as a Toleration's fields."""
    left, colon, effect = text.rpartition(":")
    if not colon or effect not in EFFECTS:
        raise ConfigError(flag, f"expected KEY[=VALUE]:EFFECT, EFFECT one of {', '.join(EFFECTS)}")
    key, eq, value = left.partition("=")
    if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
        raise ConfigError(flag, "the taint's key or value is not a valid label key or value")
    if eq:
        return (("key", key), ("operator", "Equal"), ("value", value), ("effect", effect))
    return (("key", key), ("operator", "Exists"), ("effect", effect))


def node_selector(items: list[str], flag: str = "--node-selector") -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` node labels, checked."""
    selector = parse_pairs(items, flag, split_commas=False)
    for key, value in selector:
        if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise ConfigError(flag, f"{key[:60]}: not a valid label key and value")
    return tuple(selector)


def _env(ns: argparse.Namespace) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str, str], ...]]:
    env = parse_pairs(ns.env, "--env", split_commas=False)
    secrets = []
    for name, ref in parse_pairs(ns.env_secret, "--env-secret", split_commas=False):
        secret, colon, key = ref.partition(":")
        if not colon or not _DNS_1123.fullmatch(secret) or not key:
            raise ConfigError("--env-secret", f"{name}: expected {name}=SECRET:KEY (a Secret's name and key)")
        secrets.append((name, secret, key))
    names = [n for n, _ in env] + [n for n, _, _ in secrets]
    for name in names:
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError("--env", f"{name[:40]!r} is not an environment variable name")
        if name in OPERATOR_SETS or name.startswith("PET_"):
            raise ConfigError("--env", f"{name} is set by the operator in every pod; do not set it")
        if names.count(name) > 1:
            raise ConfigError("--env", f"{name} is given more than once")
    for name, _ in env:
        if is_secret_name(name):
            raise ConfigError("--env", f"{name} looks like a secret: a manifest is no place for its value; "
                              f"use --env-secret {name}=SECRET:KEY")
    return tuple(env), tuple(secrets)


def from_namespace(ns: argparse.Namespace) -> PodOptions:
    """The pod options, checked (one ConfigError line naming the option, never a value)."""
    if ns.gpus < 0:
        raise ConfigError("--gpus", "must be >= 0")
    for name in [*ns.image_pull_secret, *([ns.service_account] if ns.service_account else [])]:
        if not _DNS_1123.fullmatch(name) or len(name) > 253:
            raise ConfigError("--service-account/--image-pull-secret", "names are DNS-1123 subdomains (lowercase "
                              "letters, digits, '-', '.')")
    env, secrets = _env(ns)
    for flag, name in (("--scheduler-name", ns.scheduler_name), ("--priority-class", ns.priority_class)):
        if name is not None and not (_DNS_1123.fullmatch(name) and len(name) <= 253):
            raise ConfigError(flag, "is a DNS-1123 subdomain (lowercase letters, digits, '-', '.')")
    opts = PodOptions(
        gpus=ns.gpus, cpu=quantity(ns.cpu, "--cpu"), cpu_limit=quantity(ns.cpu_limit, "--cpu-limit"),
        memory=quantity(ns.memory, "--memory"), memory_limit=quantity(ns.memory_limit, "--memory-limit"),
        shm_size=quantity(ns.shm_size, "--shm-size"), node_selector=node_selector(ns.node_selector),
        tolerations=tuple(toleration(t) for t in ns.toleration), env=env, env_secrets=secrets,
        service_account=ns.service_account, image_pull_secrets=tuple(ns.image_pull_secret),
        volumes=volumes.parse(ns.volume), labels=metadata(ns.pod_label, "--pod-label", True),
        annotations=metadata(ns.pod_annotation, "--pod-annotation", False), scheduler_name=ns.scheduler_name,
        priority_class=ns.priority_class, placement=placement.from_namespace(ns),
        fabric=fabricpods.from_namespace(ns),
    )
    check_pod(opts)
    return opts


def resources(opts: PodOptions, gpus: int) -> dict[str, Any]:
    """requests and limits (quantities as strings); GPUs are limits only, as extended resources allow."""
    requests = {k: v for k, v in (("cpu", opts.cpu), ("memory", opts.memory)) if v}
    limits = {k: v for k, v in (("cpu", opts.cpu_limit), ("memory", opts.memory_limit or opts.memory)) if v}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def env_vars(opts: PodOptions) -> list[dict[str, Any]]:
    """EnvVar list: plain values, then Secret references."""
    out: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in opts.env]
    out += [e for e in (fabricpods.env(opts.fabric) if opts.fabric else []) if e["name"] not in dict(opts.env)]
    out += [{"name": k, "valueFrom": {"secretKeyRef": {"name": s, "key": key}}} for k, s, key in opts.env_secrets]
    return out


def shm(opts: PodOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The memory-backed /dev/shm: (volumes, volumeMounts); none with --shm-size 0."""
    if opts.shm_size is not None and float(re.sub(r"[A-Za-z]+$", "", opts.shm_size) or 0) == 0:
        return [], []
    empty: dict[str, Any] = {"medium": "Memory"}
    if opts.shm_size:
        empty["sizeLimit"] = opts.shm_size
    return [{"name": SHM_VOLUME, "emptyDir": empty}], [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]


def pod_fields(opts: PodOptions, peers: dict[str, Any] | None = None) -> dict[str, Any]:
    """PodSpec fields besides the containers: service account, pull secrets, scheduling, placement, volumes;
    ``peers`` is the label selector of the pods that share this pod's placement (for affinity and spread)."""
    shm_volumes, _ = shm(opts)
    items: list[tuple[str, Any]] = [
        ("serviceAccountName", opts.service_account),
        ("imagePullSecrets", [{"name": n} for n in opts.image_pull_secrets] or None),
        ("schedulerName", opts.scheduler_name),
        ("priorityClassName", opts.priority_class),
        ("nodeSelector", {**dict(opts.node_selector), **volumes.node_labels(opts.volumes)} or None),
        ("tolerations", [dict(t) for t in opts.tolerations] or None),
        *opts.placement.pod_fields(peers or {}).items(),
        ("volumes", [*shm_volumes, *(v.to_volume() for v in opts.volumes), *volumes.cache_volumes(opts.volumes),
                     *(fabricpods.volumes(opts.fabric) if opts.fabric else [])] or None),
        ("initContainers", fabricpods.init_containers(opts.fabric) if opts.fabric else None),
    ]
    return {k: v for k, v in items if v is not None}


def volume_mounts(opts: PodOptions) -> list[dict[str, Any]]:
    """The training container's mounts: /dev/shm, then the --volume ones."""
    return [*shm(opts)[1], *(v.to_mount() for v in opts.volumes),
            *(fabricpods.mounts(opts.fabric) if opts.fabric else [])]


def pod_metadata(opts: PodOptions, group: bool = False, sliced: bool = True, where: str = "") -> dict[str, Any]:
    """The pod template's metadata: --pod-label, --pod-annotation and what the volumes (gke-gcsfuse), the placement
    (Kueue: ``group`` puts it in the gang's PodSet group, ``sliced`` gives it the slices) and the fabric need. The
    user's annotations win, but not into what Kueue's webhook refuses."""
    annotations = {**volumes.pod_annotations(opts.volumes), **opts.placement.annotations(group, sliced),
                   **(fabricpods.pod_annotations(opts.fabric) if opts.fabric else {})}
    tas = [k for k in placement.KUEUE_TAS if k in annotations or k in dict(opts.annotations)]
    if len(tas) > 1:
        raise ConfigError("--topology/--pod-annotation", f"{where}two Kueue topology annotations ({', '.join(tas)}): "
                          "Kueue's webhook refuses more than one of podset-required-, -preferred- and "
                          "-unconstrained-topology in a pod template")
    annotations.update(opts.annotations)
    placement.kueue_annotations(annotations, where)
    volumes.check_sidecar(annotations, opts.volumes, where)
    return {k: v for k, v in (("labels", dict(opts.labels)), ("annotations", annotations)) if v}


def container(opts: PodOptions, name: str, image: str, args: list[str], gpus: int) -> dict[str, Any]:
    """One training container: image, args, env, resources, the /dev/shm mount."""
    out: dict[str, Any] = {"name": name, "image": image}
    if args:
        out["args"] = args  # the image's ENTRYPOINT is `python -m entrypoint run`
    if env_vars(opts):
        out["env"] = env_vars(opts)
    if resources(opts, gpus):
        out["resources"] = resources(opts, gpus)
    if opts.fabric and fabricpods.security_context(opts.fabric):
        out["securityContext"] = fabricpods.security_context(opts.fabric)
    if volume_mounts(opts):
        out["volumeMounts"] = volume_mounts(opts)
    return out
