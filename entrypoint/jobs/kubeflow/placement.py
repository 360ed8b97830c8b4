"""``job kubeflow`` placement of a GPU gang: Kueue topology-aware scheduling, pod (anti-)affinity, topology spread.

- Kueue's topology-aware scheduling reads a pod template's annotation ``kueue.x-k8s.io/podset-required-topology`` or
  ``kueue.x-k8s.io/podset-preferred-topology``: a node label (a level of the cluster's Topology, such as
  ``cloud.google.com/gce-topology-block``) whose one domain must (or should) hold the whole PodSet; Kueue refuses a
  template with more than one such annotation, and admits only jobs in its queues (the job's
  ``kueue.x-k8s.io/queue-name`` label). https://kueue.sigs.k8s.io/docs/concepts/topology_aware_scheduling/
- Inter-pod affinity and anti-affinity (``affinity.podAffinity`` / ``podAntiAffinity``) and
  ``topologySpreadConstraints`` select the job's own pods by the label their operator puts on them:
  training-operator's ``training.kubeflow.org/job-name`` (kubeflow/common's JobNameLabel), JobSet's
  ``jobset.sigs.k8s.io/jobset-name`` (a TrainJob's JobSet has the TrainJob's name).
  https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity,
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
V1_JOB_LABEL = "training.kubeflow.org/job-name"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
UNSATISFIABLE = ("DoNotSchedule", "ScheduleAnyway")
PREFERRED_WEIGHT = 100
_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class Placement:
    """Where the job's pods go relative to each other and to the cluster's topology."""

    topology: tuple[str, str] | None = None  # (required|preferred, node label) for Kueue
    affinity: tuple[str, bool] | None = None  # (topology key, required)
    anti_affinity: tuple[str, bool] | None = None
    spread: tuple[tuple[str, int, str], ...] = ()  # (topology key, maxSkew, whenUnsatisfiable)

    def annotations(self) -> dict[str, str]:
        """The pod template's Kueue topology annotation."""
        return {KUEUE_TOPOLOGY[self.topology[0]]: self.topology[1]} if self.topology else {}

    def pod_fields(self, job_pods: dict[str, str]) -> dict[str, Any]:
        """``affinity`` and ``topologySpreadConstraints``, selecting the job's pods by ``job_pods``."""
        selector = {"matchLabels": dict(job_pods)}
        affinity = {}
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The placement options of ``job kubeflow``."""
    g = p.add_argument_group("placement of the job's pods (every replica type)")
    g.add_argument("--topology", metavar="required|preferred:NODE_LABEL",
                   help="Kueue topology-aware scheduling: the pods of each replica type in one domain of that node "
                   "label (e.g. required:cloud.google.com/gce-topology-block); needs a Kueue queue label")
    g.add_argument("--pod-affinity", metavar="TOPOLOGY_KEY[:preferred]",
                   help="the job's pods in one domain of TOPOLOGY_KEY (required unless :preferred)")
    g.add_argument("--pod-anti-affinity", metavar="TOPOLOGY_KEY[:preferred]",
                   help="at most one of the job's pods per domain (e.g. kubernetes.io/hostname)")
    g.add_argument("--spread", action="append", default=[],
                   metavar="TOPOLOGY_KEY[:MAX_SKEW[:DoNotSchedule|ScheduleAnyway]]",
                   help="topologySpreadConstraints over the job's pods (default 1, DoNotSchedule), repeatable")


def _key(text: str, flag: str) -> str:
    if not _KEY.fullmatch(text) or len(text.rsplit("/", 1)[-1]) > 63:
        raise ConfigError(flag, "expected a node label key ([prefix/]name), such as kubernetes.io/hostname")
    return text


def _affinity(text: str | None, flag: str) -> tuple[str, bool] | None:
    if text is None:
        return None
    preferred = text.endswith(":preferred")
    return _key(text.removesuffix(":preferred"), flag), not preferred


def from_namespace(ns: argparse.Namespace) -> Placement:
    """The placement options, checked (one ConfigError line naming the option)."""
    topology = None
    if ns.topology is not None:
        mode, colon, level = ns.topology.partition(":")
        if not colon or mode not in KUEUE_TOPOLOGY:
            raise ConfigError("--topology", "expected required:NODE_LABEL or preferred:NODE_LABEL")
        topology = (mode, _key(level, "--topology"))
    spread = []
    for text in ns.spread:
        key, _, rest = text.partition(":")
        skew, _, when = rest.partition(":")
        if (skew and not (skew.isdigit() and int(skew) >= 1)) or (when and when not in UNSATISFIABLE):
            raise ConfigError("--spread", f"expected TOPOLOGY_KEY[:MAX_SKEW[:{'|'.join(UNSATISFIABLE)}]], MAX_SKEW "
                              ">= 1")
        spread.append((_key(key, "--spread"), int(skew or 1), when or UNSATISFIABLE[0]))
    if len({s[0] for s in spread}) != len(spread):
        raise ConfigError("--spread", "one constraint per topology key")
    affinity = _affinity(ns.pod_affinity, "--pod-affinity")
    anti = _affinity(ns.pod_anti_affinity, "--pod-anti-affinity")
    if affinity and anti and affinity[0] == anti[0] and affinity[1] and anti[1]:
        raise ConfigError("--pod-anti-affinity", "requires one pod per domain of the key --pod-affinity requires all "
                          "pods in one domain of: no second pod could ever be scheduled")
    return Placement(topology, affinity, anti, tuple(spread))
