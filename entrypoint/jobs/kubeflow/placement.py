"""``job kubeflow`` placement: Kueue topology-aware scheduling, node affinity, pod (anti-)affinity, topology spread.

Placement follows the role: the job-wide options place the GPU gang (the training replicas, and a ps or evaluator that
has GPUs); a CPU parameter server or evaluator gets none of it unless ``--role-*`` gives it its own (``roles.py``).
Each pod's affinity and spread select the pods that share its placement (``selector``).

- Kueue's topology-aware scheduling reads a pod template's annotations: ``kueue.x-k8s.io/podset-required-topology``
  or ``-preferred-topology`` (a node label, a level of the cluster's Topology, whose one domain must or should hold
  the PodSet); at most one of those and ``-unconstrained-topology`` ("must not contain more than one topology
  annotation", its webhook's ValidateTASPodSetRequest); ``podset-group-name`` puts two PodSets in one domain ("can
  only define groups of exactly 2 pod sets", one of them with a single pod, the same topology request; not with slice
  annotations); ``podset-slice-required-topology`` with ``podset-slice-size`` (>= 1, at most the PodSet's pods) holds
  each slice of that many pods in one domain of the slice's level. Kueue admits only jobs of its queues (the job's
  ``kueue.x-k8s.io/queue-name`` label). https://kueue.sigs.k8s.io/docs/concepts/topology_aware_scheduling/,
  kubernetes-sigs/kueue pkg/controller/jobframework/tas_validation.go.
- Node affinity (``affinity.nodeAffinity``): required expressions are ANDed in one node selector term, preferred ones
  are weighted terms (1-100); operators In, NotIn, Exists, DoesNotExist, Gt, Lt.
  https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#node-affinity
- Inter-pod affinity and anti-affinity, ``topologySpreadConstraints``: over the pods that share the placement,
  selected by the label their operator gives them (training-operator's ``training.kubeflow.org/job-name`` and
  ``replica-type``, the type in lowercase; JobSet's ``jobset.sigs.k8s.io/jobset-name``: a TrainJob's JobSet has its
  name). https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity,
  https://kubernetes.io/docs/concepts/scheduling-eviction/topology-spread-constraints/
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from entrypoint.errors import ConfigError

KUEUE_TOPOLOGY = {"required": "kueue.x-k8s.io/podset-required-topology",
                  "preferred": "kueue.x-k8s.io/podset-preferred-topology"}
KUEUE_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
KUEUE_TAS = (*KUEUE_TOPOLOGY.values(), KUEUE_UNCONSTRAINED)  # at most one of these per pod template
KUEUE_SLICE = ("kueue.x-k8s.io/podset-slice-required-topology", "kueue.x-k8s.io/podset-slice-size")
KUEUE_GROUP = "kueue.x-k8s.io/podset-group-name"
GANG_GROUP = "training-gang"  # the group of a v1 job's two training PodSets (not a number, as Kueue requires)
V1_JOB_LABEL = "training.kubeflow.org/job-name"
V1_TYPE_LABEL = "training.kubeflow.org/replica-type"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
UNSATISFIABLE = ("DoNotSchedule", "ScheduleAnyway")
PREFERRED_WEIGHT = 100
NONE = "none"  # --role-*: this role gets none of it
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY = re.compile(rf"({_SUBDOMAIN}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?")
_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_EXPRESSION = re.compile(r"(?P<neg>!)?(?P<key>[^=!<>:]+)(?:(?P<op>!=|=|>|<)(?P<values>[^:]*))?"
                         r"(?P<pref>:preferred(?:=(?P<weight>\d+))?)?")
NodeTerm = tuple[str, str, tuple[str, ...], int | None]  # key, operator, values, weight (None: required)


@dataclass(frozen=True)
class Placement:
    """Where pods sharing one placement go relative to each other and to the cluster's topology."""

    topology: tuple[str, str] | None = None  # (required|preferred, node label) for Kueue
    slice: tuple[str, int] | None = None  # (node label, pods per slice): Kueue's slice topology
    affinity: tuple[str, bool] | None = None  # (topology key, required)
    anti_affinity: tuple[str, bool] | None = None
    spread: tuple[tuple[str, int, str], ...] = ()  # (topology key, maxSkew, whenUnsatisfiable)
    node_affinity: tuple[NodeTerm, ...] = ()

    def annotations(self, group: bool = False, sliced: bool = True) -> dict[str, str]:
        """The pod template's Kueue annotations: the topology, the slices (``sliced``), the gang's group."""
        out = {KUEUE_TOPOLOGY[self.topology[0]]: self.topology[1]} if self.topology else {}
        if self.slice and sliced:
            out.update({KUEUE_SLICE[0]: self.slice[0], KUEUE_SLICE[1]: str(self.slice[1])})
        if group:
            out[KUEUE_GROUP] = GANG_GROUP
        return out

    def pod_fields(self, selector: dict[str, Any]) -> dict[str, Any]:
        """``affinity`` and ``topologySpreadConstraints``; the pod terms select the pods that share this placement."""
        affinity: dict[str, Any] = {}
        required = [_expression(t) for t in self.node_affinity if t[3] is None]
        preferred = [{"weight": t[3], "preference": {"matchExpressions": [_expression(t)]}}
                     for t in self.node_affinity if t[3] is not None]
        if required or preferred:
            affinity["nodeAffinity"] = {
                **({"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": required}]}} if required else {}),
                **({"preferredDuringSchedulingIgnoredDuringExecution": preferred} if preferred else {})}
        for field, given in (("podAffinity", self.affinity), ("podAntiAffinity", self.anti_affinity)):
            if given is None:
                continue
            term = {"labelSelector": selector, "topologyKey": given[0]}
            affinity[field] = ({"requiredDuringSchedulingIgnoredDuringExecution": [term]} if given[1] else
                               {"preferredDuringSchedulingIgnoredDuringExecution": [
                                   {"weight": PREFERRED_WEIGHT, "podAffinityTerm": term}]})
        spread = [{"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when, "labelSelector": selector}
                  for key, skew, when in self.spread]
        return {k: v for k, v in (("affinity", affinity), ("topologySpreadConstraints", spread)) if v}


def _expression(term: NodeTerm) -> dict[str, Any]:
    key, operator, values, _ = term
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def selector(job_label: str, job: str, types: list[str] | None = None) -> dict[str, Any]:
    """The label selector of the pods sharing a placement: the job's, of these replica types (lowercase) when the
    job has others."""
    out: dict[str, Any] = {"matchLabels": {job_label: job}}
    if types is not None:
        out["matchExpressions"] = [{"key": V1_TYPE_LABEL, "operator": "In", "values": sorted(types)}]
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The placement options of ``job kubeflow`` (per role: ``roles.py``)."""
    g = p.add_argument_group("placement of the GPU gang's pods (CPU ps and evaluators: --role-* only)")
    g.add_argument("--topology", metavar="required|preferred:NODE_LABEL",
                   help="Kueue topology-aware scheduling: the gang in one domain of that node label (e.g. "
                   "required:cloud.google.com/gce-topology-block); needs a Kueue queue label")
    g.add_argument("--topology-slice", metavar="NODE_LABEL:PODS",
                   help="Kueue slices: each PODS pods of a PodSet in one domain of NODE_LABEL (e.g. "
                   "cloud.google.com/gce-topology-subblock:4)")
    g.add_argument("--node-affinity", action="append", default=[], metavar="EXPR[:preferred[=WEIGHT]]",
                   help="KEY=V1,V2 (In), KEY!=V (NotIn), KEY (Exists), !KEY (DoesNotExist), KEY>N, KEY<N; "
                   "required unless :preferred (weight 1-100, default 100), repeatable")
    g.add_argument("--pod-affinity", metavar="TOPOLOGY_KEY[:preferred]",
                   help="the gang's pods in one domain of TOPOLOGY_KEY (required unless :preferred)")
    g.add_argument("--pod-anti-affinity", metavar="TOPOLOGY_KEY[:preferred]",
                   help="at most one of the gang's pods per domain (e.g. kubernetes.io/hostname)")
    g.add_argument("--spread", action="append", default=[],
                   metavar="TOPOLOGY_KEY[:MAX_SKEW[:DoNotSchedule|ScheduleAnyway]]",
                   help="topologySpreadConstraints over the gang's pods (default 1, DoNotSchedule), repeatable")


def label_key(text: str, flag: str) -> str:
    """A label key: ``[prefix/]name``, the prefix a DNS subdomain (at most 253), the name at most 63."""
    prefix, _, name = text.rpartition("/")
    if not _KEY.fullmatch(text) or len(name) > 63 or len(prefix) > 253:
        raise ConfigError(flag, "expected a node label key ([prefix/]name, the prefix a DNS subdomain), such as "
                          "kubernetes.io/hostname")
    return text


def topology(text: str, flag: str) -> tuple[str, str]:
    mode, colon, level = text.partition(":")
    if not colon or mode not in KUEUE_TOPOLOGY:
        raise ConfigError(flag, "expected required:NODE_LABEL or preferred:NODE_LABEL")
    return mode, label_key(level, flag)


def slice_option(text: str, flag: str) -> tuple[str, int]:
    level, colon, size = text.rpartition(":")
    if not colon or not size.isdigit() or int(size) < 1:
        raise ConfigError(flag, "expected NODE_LABEL:PODS, PODS >= 1 (Kueue's podset-slice-size)")
    return label_key(level, flag), int(size)


def affinity(text: str, flag: str) -> tuple[str, bool]:
    preferred = text.endswith(":preferred")
    return label_key(text.removesuffix(":preferred"), flag), not preferred


def spread_option(text: str, flag: str) -> tuple[str, int, str]:
    key, _, rest = text.partition(":")
    skew, _, when = rest.partition(":")
    if (skew and not (skew.isdigit() and int(skew) >= 1)) or (when and when not in UNSATISFIABLE):
        raise ConfigError(flag, f"expected TOPOLOGY_KEY[:MAX_SKEW[:{'|'.join(UNSATISFIABLE)}]], MAX_SKEW >= 1")
    return label_key(key, flag), int(skew or 1), when or UNSATISFIABLE[0]


def node_term(text: str, flag: str) -> NodeTerm:
    """One ``--node-affinity`` expression as a NodeSelectorRequirement, required or weighted."""
    m = _EXPRESSION.fullmatch(text.strip())
    if m is None or (m["neg"] and m["op"]):
        raise ConfigError(flag, "expected KEY=V1,V2, KEY!=V, KEY, !KEY, KEY>N or KEY<N, then :preferred[=WEIGHT]")
    key = label_key(m["key"], flag)
    values = tuple(v for v in (m["values"] or "").split(",") if v) if m["op"] else ()
    operator = {None: "DoesNotExist" if m["neg"] else "Exists", "=": "In", "!=": "NotIn", ">": "Gt",
                "<": "Lt"}[m["op"]]
    if (m["op"] and not values) or any(not _VALUE.fullmatch(v) for v in values):
        raise ConfigError(flag, f"{key}: values are label values (at most 63 of letters, digits, '-', '_', '.')")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
        raise ConfigError(flag, f"{key}: Gt and Lt take one whole number")
    weight = int(m["weight"] or PREFERRED_WEIGHT) if m["pref"] else None
    if weight is not None and not 1 <= weight <= 100:
        raise ConfigError(flag, f"{key}: a preferred term's weight is 1 to 100")
    return key, operator, values, weight


def check(place: Placement, flag: str = "--pod-anti-affinity") -> Placement:
    """What no scheduler could satisfy: both required on the same key."""
    if len({s[0] for s in place.spread}) != len(place.spread):
        raise ConfigError("--spread", "one constraint per topology key")
    a, anti = place.affinity, place.anti_affinity
    if a and anti and a[0] == anti[0] and a[1] and anti[1]:
        raise ConfigError(flag, "requires one pod per domain of the key --pod-affinity requires all pods in one "
                          "domain of: no second pod could ever be scheduled")
    return place


def from_namespace(ns: argparse.Namespace) -> Placement:
    """The job-wide placement options, checked (one ConfigError line naming the option)."""
    return check(Placement(
        topology=topology(ns.topology, "--topology") if ns.topology is not None else None,
        slice=slice_option(ns.topology_slice, "--topology-slice") if ns.topology_slice is not None else None,
        affinity=affinity(ns.pod_affinity, "--pod-affinity") if ns.pod_affinity is not None else None,
        anti_affinity=affinity(ns.pod_anti_affinity, "--pod-anti-affinity") if ns.pod_anti_affinity else None,
        spread=tuple(spread_option(t, "--spread") for t in ns.spread),
        node_affinity=tuple(node_term(t, "--node-affinity") for t in ns.node_affinity)))


def kueue_annotations(annotations: dict[str, str], where: str) -> None:
    """Kueue's webhook refuses a pod template with more than one topology annotation, or a slice or group that its
    rules do not allow (ValidateTASPodSetRequest): refused here in one line."""
    found = [k for k in KUEUE_TAS if k in annotations]
    if len(found) > 1:
        raise ConfigError("--topology/--pod-annotation", f"{where}two Kueue topology annotations ({', '.join(found)}): "
                          "Kueue's webhook refuses more than one of podset-required-, -preferred- and "
                          "-unconstrained-topology in a pod template")
    if KUEUE_GROUP in annotations and (any(k in annotations for k in KUEUE_SLICE) or not
                                       any(k in annotations for k in KUEUE_TOPOLOGY.values())):
        raise ConfigError("--pod-annotation", f"{where}{KUEUE_GROUP} needs a required or preferred topology and no "
                          "slice (Kueue's webhook)")
