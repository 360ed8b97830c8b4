"""Placement: one function gives every process its ranks; torch's and Horovod's variables agree with it.

Framework-free: the launchers' variable builders (``pytorch.launch.process_env``, ``horovod.launch.worker_env``)
import no ML framework.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.cluster.placement import Placement, place
from entrypoint.horovod.launch import worker_env
from entrypoint.options import RunOptions
from entrypoint.planning.plan import Plan, make_plan
from entrypoint.pytorch.launch.node import process_env
from tests.unit.test_environments import MPIRUN_R5, TORCHRUN_R3, vertex


def node_env(layout: str, node: int, nodes: int) -> dict[str, str]:
    """The platform's variables for node ``node`` of ``nodes`` in each node-level format."""
    if layout == "torch":  # AI Platform PyTorch / Kubeflow PyTorchJob: node rank in RANK
        return {"MASTER_ADDR": "m", "MASTER_PORT": "1234", "WORLD_SIZE": str(nodes), "RANK": str(node)}
    if layout == "kubeflow":  # PET_* (torchrun's arguments for this node)
        return {"PET_NNODES": str(nodes), "PET_NODE_RANK": str(node), "PET_MASTER_ADDR": "m",
                "PET_MASTER_PORT": "1234"}
    spec: dict[str, Any] = {"cluster": {"chief": ["c:1"], "worker": [f"w{i}:1" for i in range(nodes - 1)]},
                            "task": {"type": "chief" if node == 0 else "worker", "index": max(node - 1, 0)}}
    return {"TF_CONFIG": json.dumps(spec)}


LAYOUTS = [(layout, nodes, nproc) for layout in ("torch", "kubeflow", "tf_config")
           for nodes in (1, 2, 3) for nproc in (1, 2, 4)]


@pytest.mark.parametrize(("layout", "nodes", "nproc"), LAYOUTS)
def test_every_process_has_one_rank_and_torch_and_horovod_agree(layout: str, nodes: int, nproc: int) -> None:
    seen: list[int] = []
    for node in range(nodes):
        topo = resolve(node_env(layout, node, nodes))
        plan = make_plan(topo, RunOptions(framework="pytorch", nproc_per_node=nproc), PlatformSettings(), 0)
        assert plan.placement is None and plan.world_size == nodes * nproc
        for local_rank in range(nproc):
            placed = plan.for_process(local_rank).placed
            torch = process_env(plan.for_process(local_rank), "m", 1234, "/e")
            hvd = worker_env(topo, place(topo, nproc, local_rank), "m", 1234, 30)
            assert placed == place(topo, nproc, local_rank)
            assert (int(torch["RANK"]), int(torch["WORLD_SIZE"]), int(torch["LOCAL_RANK"]),
                    int(torch["LOCAL_WORLD_SIZE"]), int(torch["GROUP_RANK"])) == (
                placed.rank, placed.world_size, placed.local_rank, placed.local_world_size, placed.node_rank)
            assert (hvd["HOROVOD_RANK"], hvd["HOROVOD_SIZE"], hvd["HOROVOD_LOCAL_RANK"], hvd["HOROVOD_LOCAL_SIZE"],
                    hvd["HOROVOD_CROSS_RANK"], hvd["HOROVOD_CROSS_SIZE"]) == (
                torch["RANK"], torch["WORLD_SIZE"], torch["LOCAL_RANK"], torch["LOCAL_WORLD_SIZE"],
                torch["GROUP_RANK"], torch["GROUP_WORLD_SIZE"])
            assert placed.is_chief == (node == 0 and local_rank == 0)
            seen.append(placed.training_rank)
    assert sorted(seen) == list(range(nodes * nproc))


@pytest.mark.parametrize(("pool", "index", "rank", "chief"), [
    ("workerpool0", 0, 0, True),
    ("workerpool1", 0, 1, False),
    ("workerpool1", 1, 2, False),
    ("workerpool2", 0, None, False),  # a parameter server is not in the training collective
    ("workerpool3", 0, None, False),  # nor is the evaluator
])
def test_tensorflow_replicas_ps_and_evaluator_have_no_rank(pool: str, index: int, rank: int | None,
                                                           chief: bool) -> None:
    env = vertex(pool, index)
    plan = make_plan(resolve(env), RunOptions(framework="tensorflow"), PlatformSettings(), 0).for_process(0)
    assert (plan.placed.rank, plan.placed.is_chief, plan.placed.trains) == (rank, chief, rank is not None)
    assert plan.placed.world_size == 3  # chief + 2 workers train


def test_tf_config_of_workers_only_places_worker0_as_the_chief() -> None:
    spec = {"cluster": {"worker": ["w0:1", "w1:1"]}, "task": {"type": "worker", "index": 0}}
    placed = place(resolve({"TF_CONFIG": json.dumps(spec)}), 1, 0)
    assert (placed.rank, placed.is_chief, placed.world_size) == (0, True, 2)


@pytest.mark.parametrize(("env", "expected"), [
    (TORCHRUN_R3, Placement(node_rank=1, rank=3, local_rank=1, world_size=8, local_world_size=2)),
    (MPIRUN_R5, Placement(node_rank=1, rank=5, local_rank=1, world_size=8, local_world_size=4)),
])
def test_a_platform_placed_process_keeps_the_platforms_ranks(env: dict[str, str], expected: Placement) -> None:
    topo = resolve(env)
    assert topo.processes_started_externally
    plan = make_plan(topo, RunOptions(framework="pytorch"), PlatformSettings(), 0)
    assert plan.placement == expected  # placed as soon as planned: nothing will start it again
    assert plan.world_size == expected.world_size and plan.nproc_per_node == expected.local_world_size
    with pytest.raises(ValueError, match="local rank"):
        place(topo, 2, 0)


def test_a_placed_plan_survives_its_file_format() -> None:
    plan = make_plan(resolve(node_env("torch", 1, 2)), RunOptions(framework="pytorch", nproc_per_node=2),
                     PlatformSettings(), 0).for_process(1)
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan and again.placed.rank == 3


def test_a_local_rank_outside_the_node_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        place(resolve({}), 2, 2)
