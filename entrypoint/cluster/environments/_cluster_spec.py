"""Shared parsing for the formats that list address pools (Vertex, AI Platform, TF_CONFIG)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from entrypoint.cluster.environments._parse import get_addresses, get_index, get_object, get_trial, shown
from entrypoint.cluster.topology import ClusterTopology, Role, Source
from entrypoint.errors import ConfigError


def topology_from_spec(
    variable: str,
    source: Source,
    spec: Mapping[str, Any],
    roles: Mapping[str, Role],
    *,
    chief_pool: str | None = None,
    fallback_trial: str | None = None,
) -> ClusterTopology:
    """Parse ``{"cluster": {...}, "task": {...}}`` given the pool-name -> role mapping.

    ``chief_pool`` names a pool that must exist (Vertex's workerpool0). An evaluator task may be
    absent from ``cluster`` (TensorFlow keeps evaluators outside it).
    """
    pools, names = _read_pools(variable, spec, roles, chief_pool)
    task = get_object(variable, spec, "task", "task")
    if "type" not in task:
        raise ConfigError(variable, "missing", "task.type")
    task_type = task["type"]
    if not isinstance(task_type, str) or task_type not in roles:
        raise ConfigError(variable, f"unknown task type ({shown(task_type)}); expected one of {', '.join(roles)}",
                          "task.type")
    role = roles[task_type]
    index = get_index(variable, task, "task.index")
    members = pools.get(role)
    if members is None:
        if role != "evaluator":
            raise ConfigError(variable, f"names {task_type}, which has no replicas in cluster", "task.type")
    elif index >= len(members):
        raise ConfigError(variable, f"is out of range for {task_type} ({len(members)} replicas)", "task.index")
    names.setdefault(role, task_type)  # an evaluator outside ``cluster`` is still named by its task type
    return ClusterTopology.from_pools(
        source, role, index, chief=pools.get("chief", ()), workers=pools.get("worker", ()),
        servers=pools.get("ps", ()), evaluators=pools.get("evaluator", ()),
        trial=get_trial(variable, task, "task.trial") or fallback_trial, pool_names=tuple(sorted(names.items())),
    )


def _read_pools(variable: str, spec: Mapping[str, Any], roles: Mapping[str, Role],
                chief_pool: str | None) -> tuple[dict[Role, tuple[str, ...]], dict[Role, str]]:
    """The non-empty pools by role, and the name the spec gave each; one chief at most."""
    cluster = get_object(variable, spec, "cluster", "cluster")
    pools: dict[Role, tuple[str, ...]] = {}
    names: dict[Role, str] = {}
    for position, (key, value) in enumerate(cluster.items()):
        if key not in roles:
            raise ConfigError(variable, f"pool #{position + 1} has an unknown name; expected one of "
                              f"{', '.join(roles)}", "cluster")
        path = f"cluster.{key}"
        role = roles[key]
        if role in names:
            raise ConfigError(variable, f"two chiefs: both {names[role]!r} and {key!r} are given", path)
        addresses = get_addresses(variable, value, path)
        if addresses:
            pools[role] = addresses
            names[role] = key
    if chief_pool is not None and "chief" not in pools:
        raise ConfigError(variable, "missing or empty: a job always has one primary replica", f"cluster.{chief_pool}")
    chief = pools.get("chief", ())
    if len(chief) > 1:
        raise ConfigError(variable, f"two chiefs: {len(chief)} replicas where exactly one is allowed",
                          f"cluster.{names['chief']}")
    if not chief and not pools.get("worker"):
        raise ConfigError(variable, "has neither a chief nor a worker pool", "cluster")
    return pools, names
