"""The emulated Vertex cluster: its worker pools and the CLUSTER_SPEC / TF_CONFIG each replica gets.

``local`` starts replicas from these; a job spec (``local.specfile``) becomes the same pools, and ``job`` plans
each pool's replicas with the variables they give (``jobs.planned``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from entrypoint.cluster.environments.vertex import VERTEX_POOLS
from entrypoint.lifecycle.startup.ports import free_ports


@dataclass(frozen=True)
class Pool:
    """One Vertex worker pool: its name (``workerpool0``..``3``), replica count and entrypoint command.

    ``command`` is what follows ``python -m entrypoint`` (``run ...``). A pool with ``start=False``
    is listed in every CLUSTER_SPEC, as Vertex lists it, but no process is started for it (a
    Reduction Server runs Google's image, not ours); ``note`` says why. ``env`` is the pool's own
    container environment (a job spec's ``containerSpec.env``), beneath the variables Vertex sets.
    """

    name: str
    replicas: int
    command: tuple[str, ...] = ()
    start: bool = True
    note: str = ""
    env: tuple[tuple[str, str], ...] = ()


def vertex_pools(workers: int, ps: int, evaluators: int, command: Sequence[str]) -> list[Pool]:
    """``--workers N --ps P --evaluators E``: the chief, N-1 workers, P servers, E evaluators, one command."""
    sizes = zip(VERTEX_POOLS, (1, workers - 1, ps, evaluators), strict=True)
    return [Pool(name, count, tuple(command)) for name, count in sizes if count > 0]


def cluster_specs(pools: Sequence[Pool], trial: str | None,
                  addresses: Iterator[str] | None = None) -> list[tuple[Pool, int, dict[str, Any]]]:
    """CLUSTER_SPEC per replica, as Vertex writes it (pools absent when empty), every replica on a free port of
    127.0.0.1 (or at the next of ``addresses``: a job spec's checks plan replicas without taking ports)."""
    if addresses is None:
        addresses = (f"127.0.0.1:{port}" for port in free_ports(sum(p.replicas for p in pools)))
    cluster = {p.name: [next(addresses) for _ in range(p.replicas)] for p in pools if p.replicas > 0}
    out = []
    for pool in pools:
        for index in range(pool.replicas):
            task: dict[str, Any] = {"type": pool.name, "index": index}
            if trial is not None:
                task["trial"] = trial
            spec = {"cluster": cluster, "environment": "cloud", "task": task, "job": {"emulated": True}}
            out.append((pool, index, spec))
    return out


def vertex_tf_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The TF_CONFIG Vertex sets beside CLUSTER_SPEC: chief / worker / ps, evaluator outside ``cluster``."""
    cluster = {VERTEX_POOLS[p]: m for p, m in spec["cluster"].items() if VERTEX_POOLS[p] != "evaluator"}
    task = {"type": VERTEX_POOLS[spec["task"]["type"]], "index": spec["task"]["index"]}
    if "trial" in spec["task"]:
        task["trial"] = spec["task"]["trial"]
    return {"cluster": cluster, "task": task, "environment": "cloud", "job": spec["job"]}
