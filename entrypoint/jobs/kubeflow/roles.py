"""``job kubeflow``: resources and placement per replica type (Master, Chief, Worker, PS, Evaluator).

Every replica type has its own pod template, so each may have its own requests, limits, node selector, tolerations
and placement. Defaults: every role gets the pod options; TensorFlow's parameter servers get no GPUs, and in a GPU job
none of the GPU gang's placement either: not its node selector (it would put CPU-only servers on GPU nodes), not its
tolerations (the GPU taint's toleration is for pods that ask for GPUs: Kubernetes' ExtendedResourceToleration
admission adds it to those), not its Kueue topology, pod (anti-)affinity, spread or node affinity (Kueue would have to
fit a CPU PodSet into the GPU gang's domain, which has no CPU nodes: the job is never admitted). Nor does an
evaluator given ``gpus=0`` in a GPU job. A GPU-less job's roles all keep the pod options. ``--role-*`` gives a role
its own of any of these (``ROLE:none``: none). The training replicas' GPU count is one value (PyTorchJob's
``nprocPerNode``; MultiWorkerMirroredStrategy wants the same devices on every worker), so ``gpus`` is per role for ps
and evaluators only.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from entrypoint.errors import ConfigError
from entrypoint.jobs.kubeflow import placement, pods
from entrypoint.jobs.kubeflow.placement import NONE, Placement
from entrypoint.jobs.kubeflow.pods import PodOptions

ROLES = {"pytorchjob": ("master", "worker"), "tfjob": ("chief", "worker", "ps", "evaluator"), "trainjob": ()}
_RESOURCE_KEYS = ("cpu", "cpu-limit", "memory", "memory-limit", "shm-size", "gpus")
_OWN_GPUS = ("ps", "evaluator")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The per-role options of ``job kubeflow``."""
    g = p.add_argument_group("per replica type (master|chief|worker|ps|evaluator; TrainJob: none)")
    g.add_argument("--role-resources", action="append", default=[], metavar="ROLE:KEY=VALUE[,...]",
                   help="that role's cpu, cpu-limit, memory, memory-limit, shm-size (and gpus for ps, evaluator), "
                   "repeatable")
    g.add_argument("--role-node-selector", action="append", default=[], metavar="ROLE:KEY=VALUE",
                   help="that role's node selector, replacing --node-selector for it, repeatable")
    g.add_argument("--role-toleration", action="append", default=[], metavar="ROLE:KEY[=VALUE]:EFFECT",
                   help="that role's tolerations, replacing --toleration for it, repeatable")
    g.add_argument("--role-topology", action="append", default=[], metavar="ROLE:required|preferred:LABEL|ROLE:none",
                   help="that role's Kueue topology, replacing --topology for it")
    g.add_argument("--role-node-affinity", action="append", default=[], metavar="ROLE:EXPR[:preferred]|ROLE:none",
                   help="that role's node affinity (as --node-affinity), replacing the job's for it, repeatable")
    g.add_argument("--role-pod-affinity", action="append", default=[], metavar="ROLE:KEY[:preferred]|ROLE:none",
                   help="that role's pod affinity, replacing --pod-affinity for it")
    g.add_argument("--role-pod-anti-affinity", action="append", default=[], metavar="ROLE:KEY[:preferred]|ROLE:none",
                   help="that role's pod anti-affinity, replacing --pod-anti-affinity for it")
    g.add_argument("--role-spread", action="append", default=[], metavar="ROLE:KEY[:SKEW[:WHEN]]|ROLE:none",
                   help="that role's topology spread, replacing --spread for it, repeatable")


def _split(text: str, flag: str, kind: str) -> tuple[str, str]:
    role, colon, rest = text.partition(":")
    if not colon or not rest:
        raise ConfigError(flag, f"expected ROLE:..., ROLE one of {', '.join(ROLES[kind]) or 'none for a TrainJob'}")
    if role not in ROLES[kind]:
        raise ConfigError(flag, f"{role}: not a replica type of this kind; one of {', '.join(ROLES[kind])}"
                          if ROLES[kind] else "a TrainJob's nodes are one replica type: use the pod options")
    return role, rest


# --role-* placement options: the Placement field each sets, whether it repeats, and how its value is read.
_PLACEMENT = {"--role-topology": ("topology", False, placement.topology),
              "--role-node-affinity": ("node_affinity", True, placement.node_term),
              "--role-pod-affinity": ("affinity", False, placement.affinity),
              "--role-pod-anti-affinity": ("anti_affinity", False, placement.affinity),
              "--role-spread": ("spread", True, placement.spread_option)}


def _role_placements(ns: argparse.Namespace, kind: str) -> dict[str, dict[str, Any]]:
    """Each role's own placement fields from --role-topology / -node-affinity / -pod-affinity / -pod-anti-affinity /
    -spread (``ROLE:none``: none of that field)."""
    found: dict[str, dict[str, Any]] = {}
    for flag, (field, repeats, read) in _PLACEMENT.items():
        for text in getattr(ns, flag.removeprefix("--").replace("-", "_")):
            role, rest = _split(text, flag, kind)
            mine = found.setdefault(role, {})
            if rest == NONE:
                mine[field] = () if repeats else None
            elif repeats:
                mine[field] = (*mine.get(field, ()), read(rest, flag))
            elif field in mine:
                raise ConfigError(flag, f"{role}: given twice")
            else:
                mine[field] = read(rest, flag)
    return found


def role_options(ns: argparse.Namespace, kind: str, base: PodOptions) -> dict[str, PodOptions]:
    """Each role's pod options: the base ones; a CPU ps or evaluator of a GPU job without the GPU gang's node
    selector, tolerations, fabric and placement; then --role-* (checked)."""
    out = {role: base for role in ROLES[kind]}
    gpu_job = bool(base.gpus)
    if "ps" in out:  # a CPU pod: no fabric; in a GPU job, off the GPU nodes and out of the GPU gang's placement
        out["ps"] = replace(base, gpus=0, fabric=None)
        if gpu_job:
            out["ps"] = replace(out["ps"], node_selector=(), tolerations=(), placement=Placement())
    selectors: dict[str, list[str]] = {}
    tolerations: dict[str, list[str]] = {}
    for flag, texts, into in (("--role-node-selector", ns.role_node_selector, selectors),
                              ("--role-toleration", ns.role_toleration, tolerations)):
        for text in texts:
            role, rest = _split(text, flag, kind)
            into.setdefault(role, []).append(rest)
    for role, items in selectors.items():
        out[role] = replace(out[role], node_selector=pods.node_selector(items, "--role-node-selector"))
    for role, items in tolerations.items():
        out[role] = replace(out[role], tolerations=tuple(pods.toleration(t, "--role-toleration") for t in items))
    for text in ns.role_resources:
        role, rest = _split(text, "--role-resources", kind)
        out[role] = _resources(out[role], role, rest)
    for role in _OWN_GPUS:  # a role whose own gpus=0 leaves the GPU pods' placement, as ps does by default
        if role in out and base.gpus and not out[role].gpus:
            out[role] = replace(out[role], node_selector=out[role].node_selector if role in selectors else (),
                                tolerations=out[role].tolerations if role in tolerations else (), fabric=None,
                                placement=Placement())
    for role, fields in _role_placements(ns, kind).items():
        out[role] = replace(out[role], placement=placement.check(replace(out[role].placement, **fields)))
    for role, opts in out.items():
        pods.check_pod(opts, f"{role}: ")
    return out


def _resources(opts: PodOptions, role: str, text: str) -> PodOptions:
    flag = "--role-resources"
    values: dict[str, str] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq or key not in _RESOURCE_KEYS or key in values:
            raise ConfigError(flag, f"{role}: expected KEY=VALUE,..., KEY one of {', '.join(_RESOURCE_KEYS)} (once)")
        values[key] = value
    if "gpus" in values:
        if role not in _OWN_GPUS:
            raise ConfigError(flag, f"{role}: GPUs are one count for every training replica (--gpus); per role for "
                              f"{' and '.join(_OWN_GPUS)} only")
        if not values["gpus"].isdigit():
            raise ConfigError(flag, f"{role}: gpus is a whole number")
    return replace(
        opts, gpus=int(values.get("gpus", opts.gpus)),
        cpu=pods.quantity(values.get("cpu", opts.cpu), flag), cpu_limit=pods.quantity(
            values.get("cpu-limit", opts.cpu_limit), flag),
        memory=pods.quantity(values.get("memory", opts.memory), flag),
        memory_limit=pods.quantity(values.get("memory-limit", opts.memory_limit), flag),
        shm_size=pods.quantity(values.get("shm-size", opts.shm_size), flag),
    )
