"""Table-driven tests from the platforms' own documented examples."""

from __future__ import annotations

import json
from typing import Any

import pytest

from entrypoint.cluster.environments import DETECTION_ORDER, resolve
from entrypoint.cluster.environments.local import LocalEnvironment
from entrypoint.cluster.placement import place
from entrypoint.cluster.topology import ClusterTopology

VERTEX_CLUSTER = {
    "workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
    "workerpool1": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"],
    "workerpool2": ["cmle-training-workerpool2-ab-0:2222"],
    "workerpool3": [
        "cmle-training-workerpool3-ab-0:2222",
        "cmle-training-workerpool3-ab-1:2222",
        "cmle-training-workerpool3-ab-2:2222",
    ],
}
CHIEF = "cmle-training-workerpool0-ab-0:2222"


def vertex(task_type: str, index: int, trial: str | None = "3") -> dict[str, str]:
    task: dict[str, Any] = {"type": task_type, "index": index}
    if trial:
        task["trial"] = trial
    spec = {"cluster": VERTEX_CLUSTER, "environment": "cloud", "task": task,
            "job": {"worker_pool_specs": [], "args": ["--api-key=do-not-print"]}}
    return {"CLUSTER_SPEC": json.dumps(spec)}


AIP_TF_CONFIG = {  # the AI Platform / Vertex TF_CONFIG example: chief + 2 workers + 1 ps, trial "1"
    "cluster": {
        "chief": ["training-workerpool0-abc-0:2222"],
        "ps": ["training-workerpool2-abc-0:2222"],
        "worker": ["training-workerpool1-abc-0:2222", "training-workerpool1-abc-1:2222"],
    },
    "environment": "cloud",
    "job": {},
    "task": {"cloud": "xyz", "index": 0, "trial": "1", "type": "worker"},
}
LEGACY_SPEC = {
    "cluster": {"master": ["master-0:2222"], "worker": ["worker-0:2222", "worker-1:2222"], "ps": ["ps-0:2222"]},
    "environment": "cloud",
    "task": {"type": "master", "index": 0, "trial": "7"},
    "job": {"scale_tier": "CUSTOM"},
}
KUBEFLOW = {"MASTER_ADDR": "mnist-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "PYTHONUNBUFFERED": "0"}
TORCHRUN_R3 = {  # torchrun --nnodes 4 --nproc-per-node 2: global rank 3 is local rank 1 on node 1
    "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "4", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "8", "MASTER_ADDR": "node-0",
    "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job-1",
}
# What Kubeflow Trainer's JAX runtime sets in TrainJob "mnist"'s pods (one JAX process a pod; JAX_PROCESS_ID is the
# pod's completion index)
JAX_RUNTIME = {"JAX_NUM_PROCESSES": "2", "JAX_COORDINATOR_ADDRESS": "mnist-node-0-0.mnist:6666",
               "JAX_COORDINATOR_PORT": "6666"}
MPIRUN_R5 = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
             "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}

# name, env, (source, role, index, node_rank, num_nodes, chief_address, trial)
CASES: list[tuple[str, dict[str, str], tuple[Any, ...]]] = [
    ("vertex chief", vertex("workerpool0", 0), ("vertex", "chief", 0, 0, 3, CHIEF, "3")),
    ("vertex worker 1 of 2", vertex("workerpool1", 1), ("vertex", "worker", 1, 2, 3, CHIEF, "3")),
    ("vertex ps", vertex("workerpool2", 0), ("vertex", "ps", 0, None, 3, CHIEF, "3")),
    ("vertex evaluator 3 of 3", vertex("workerpool3", 2), ("vertex", "evaluator", 2, None, 3, CHIEF, "3")),
    ("vertex no trial", vertex("workerpool1", 0, trial=None), ("vertex", "worker", 0, 1, 3, CHIEF, None)),
    ("aiplatform tf_config worker", {"TF_CONFIG": json.dumps(AIP_TF_CONFIG)},
     ("tf_config", "worker", 0, 1, 3, "training-workerpool0-abc-0:2222", "1")),
    ("legacy cluster_spec master", {"CLUSTER_SPEC": json.dumps(LEGACY_SPEC)},
     ("aiplatform", "chief", 0, 0, 3, "master-0:2222", "7")),
    ("kubeflow master", {**KUBEFLOW, "RANK": "0"}, ("torch", "chief", 0, 0, 3, "mnist-master-0:23456", None)),
    ("kubeflow worker", {**KUBEFLOW, "RANK": "2"}, ("torch", "worker", 1, 2, 3, "mnist-master-0:23456", None)),
    ("ai platform pytorch node 1",
     {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "cmle-master", "MASTER_PORT": "2222"},
     ("torch", "worker", 0, 1, 2, "cmle-master:2222", None)),
    ("torchrun rank 3 of 8 on node 1", TORCHRUN_R3, ("torchrun", "worker", 0, 1, 4, "node-0:29500", None)),
    ("mpirun rank 5 of 8", MPIRUN_R5, ("mpi", "worker", 0, 1, 2, None, None)),
    ("kubeflow pet", {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "4",
                      "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456", **KUBEFLOW, "RANK": "1"},
     ("kubeflow", "worker", 0, 1, 2, "job-master-0:23456", None)),
    # Kubeflow Trainer's JAX runtime (its jax plugin): the coordinator is process 0's pod, host:port
    ("kubeflow jax runtime process 1 of 2", {**JAX_RUNTIME, "JAX_PROCESS_ID": "1"},
     ("jax_runtime", "worker", 0, 1, 2, "mnist-node-0-0.mnist:6666", None)),
    ("kubeflow jax runtime process 0", {**JAX_RUNTIME, "JAX_PROCESS_ID": "0"},
     ("jax_runtime", "chief", 0, 0, 2, "mnist-node-0-0.mnist:6666", None)),
    ("jax runtime, address without a port", {"JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": "2",
                                             "JAX_COORDINATOR_ADDRESS": "coord", "JAX_COORDINATOR_PORT": "1234"},
     ("jax_runtime", "worker", 1, 2, 3, "coord:1234", None)),
    ("jax runtime, one process", {"JAX_NUM_PROCESSES": "1"}, ("jax_runtime", "chief", 0, 0, 1, None, None)),
    ("a platform's variables beat the jax runtime's", {**KUBEFLOW, "RANK": "2", **JAX_RUNTIME, "JAX_PROCESS_ID": "0"},
     ("torch", "worker", 1, 2, 3, "mnist-master-0:23456", None)),
    ("a coordinator address alone is no cluster", {"JAX_COORDINATOR_ADDRESS": "c:1"},
     ("local", "chief", 0, 0, 1, None, None)),
    ("nothing", {}, ("local", "chief", 0, 0, 1, None, None)),
]


@pytest.mark.parametrize(("env", "expected"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_resolves_documented_examples(env: dict[str, str], expected: tuple[Any, ...]) -> None:
    topo = resolve(env)
    got = (topo.source, topo.role, topo.index, topo.node_rank, topo.num_nodes, topo.chief_address, topo.trial)
    assert got == expected


def test_vertex_emits_tf_config_with_chief_trial_and_evaluator_outside() -> None:
    worker = resolve(vertex("workerpool1", 1))
    assert worker.tf_config() == {
        "cluster": {"chief": [CHIEF], "worker": VERTEX_CLUSTER["workerpool1"], "ps": VERTEX_CLUSTER["workerpool2"]},
        "task": {"type": "worker", "index": 1, "trial": "3"},
        "environment": "cloud",
    }
    evaluator = resolve(vertex("workerpool3", 2))
    config = evaluator.tf_config()
    assert config is not None
    assert "evaluator" not in config["cluster"]
    assert config["task"] == {"type": "evaluator", "index": 2, "trial": "3"}
    assert evaluator.torch_env() == {}


def test_vertex_pool2_without_servers_for_nccl_reading() -> None:
    config = resolve(vertex("workerpool0", 0)).tf_config(include_servers=False)
    assert config is not None and "ps" not in config["cluster"]


def test_vertex_emits_torch_variables() -> None:
    assert resolve(vertex("workerpool1", 1)).torch_env() == {
        "MASTER_ADDR": "cmle-training-workerpool0-ab-0", "MASTER_PORT": "2222", "NODE_RANK": "2", "NNODES": "3",
    }


def test_legacy_master_becomes_chief_in_emitted_tf_config() -> None:
    config = resolve({"CLUSTER_SPEC": json.dumps(LEGACY_SPEC)}).tf_config()
    assert config is not None
    assert config["cluster"]["chief"] == ["master-0:2222"] and "master" not in config["cluster"]
    assert config["task"] == {"type": "chief", "index": 0, "trial": "7"}


def test_tf_config_master_is_fixed_to_chief() -> None:
    spec = {"cluster": {"master": ["m:1"], "worker": ["w:1"]}, "task": {"type": "master", "index": 0}}
    topo = resolve({"TF_CONFIG": json.dumps(spec)})
    assert topo.role == "chief"
    assert topo.tf_config() == {"cluster": {"chief": ["m:1"], "worker": ["w:1"]},
                                "task": {"type": "chief", "index": 0}, "environment": "cloud"}


def test_tf_config_of_workers_only_makes_worker0_the_chief() -> None:
    spec = {"cluster": {"worker": ["w0:1", "w1:1"]}, "task": {"type": "worker", "index": 0}}
    topo = resolve({"TF_CONFIG": json.dumps(spec)})
    assert (topo.node_rank, topo.num_nodes, topo.is_chief_node, topo.chief_address) == (0, 2, True, "w0:1")


def test_kubeflow_and_torch_node_variables() -> None:
    master = resolve({**KUBEFLOW, "RANK": "0"})
    assert master.torch_env() == {"MASTER_ADDR": "mnist-master-0", "MASTER_PORT": "23456", "NODE_RANK": "0",
                                  "NNODES": "3"}
    assert master.is_chief_node and not master.processes_started_externally
    worker = resolve({**KUBEFLOW, "RANK": "2"})
    assert worker.torch_env()["NODE_RANK"] == "2" and not worker.is_chief_node
    assert worker.tf_config() is None  # torch variables do not name the workers' addresses


def test_torchrun_process_is_already_spawned() -> None:
    topo = resolve(TORCHRUN_R3)
    assert topo.processes_started_externally
    placed = place(topo, 2, 1)
    assert (placed.node_rank, placed.rank, placed.local_rank, placed.world_size) == (1, 3, 1, 8)
    assert not placed.is_chief
    assert topo.torch_env() == {"MASTER_ADDR": "node-0", "MASTER_PORT": "29500", "NODE_RANK": "1", "NNODES": "4"}


def test_mpirun_rank() -> None:
    topo = resolve(MPIRUN_R5)
    placed = place(topo, 1, 1)  # the platform's ranks are taken as given
    assert (placed.rank, placed.local_rank) == (5, 1) and not placed.is_chief


def test_horovod_variables_win_over_mpi() -> None:
    env = {**MPIRUN_R5, "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0",
           "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "2",
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "3333"}
    topo = resolve(env)
    assert (topo.source, place(topo, 1, 0).is_chief, topo.num_nodes, topo.chief_address) == ("mpi", True, 2,
                                                                                          "10.0.0.1:3333")


def test_spawned_child_with_inherited_cluster_spec_is_per_process() -> None:
    env = {**vertex("workerpool1", 0), "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1", "MASTER_ADDR": "c", "MASTER_PORT": "1"}
    topo = resolve(env)
    assert topo.source == "torchrun" and topo.processes_started_externally


def test_cluster_spec_beats_tf_config() -> None:
    env = {**vertex("workerpool1", 0), "TF_CONFIG": json.dumps(AIP_TF_CONFIG)}
    assert resolve(env).source == "vertex"


def test_trial_from_cloud_ml_trial_id() -> None:
    assert resolve({"CLOUD_ML_TRIAL_ID": "12"}).trial == "12"


def test_detection_order_ends_with_local() -> None:
    assert DETECTION_ORDER[-1] is LocalEnvironment
    assert len(set(DETECTION_ORDER)) == len(DETECTION_ORDER)


def test_topology_is_immutable() -> None:
    topo = resolve({})
    with pytest.raises(AttributeError):
        topo.role = "worker"  # type: ignore[misc]
    assert isinstance(topo, ClusterTopology)
