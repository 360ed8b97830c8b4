"""TRAINER_CPUS: `local` gives each emulated replica its share of the host's CPUs, and each process's OpenMP pool is
sized to its share (OMP_NUM_THREADS), unless the user chose; a bad value is one configuration error."""

from __future__ import annotations

import os

import pytest

from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import host_cpus, read_settings
from entrypoint.errors import ConfigError
from entrypoint.jobs.replicaenv import vertex_pools
from entrypoint.local.emulator import build_replicas, replica_cpus
from entrypoint.options import RunOptions
from entrypoint.planning.plan import make_plan


@pytest.mark.parametrize(("framework", "nproc", "env", "threads"), [
    ("pytorch", 1, {"TRAINER_CPUS": "4"}, "4"),  # the whole share for the one process
    ("pytorch", 2, {"TRAINER_CPUS": "8"}, "1"),  # torchrun's 1 for several processes a node wins
    ("horovod", 2, {"TRAINER_CPUS": "8"}, "4"),
    ("horovod", 3, {"TRAINER_CPUS": "2"}, "1"),  # never 0
    ("tensorflow", 1, {"TRAINER_CPUS": "3"}, "3"),
    ("pytorch", 1, {"TRAINER_CPUS": "4", "OMP_NUM_THREADS": "16"}, None),  # the user's value: not emitted, kept
    ("pytorch", 1, {}, None),  # nothing known: the framework's own default
])
def test_each_process_gets_its_share_of_the_replicas_cpus(framework: str, nproc: int, env: dict[str, str],
                                                          threads: str | None) -> None:
    plan = make_plan(resolve({}), RunOptions(framework=framework, nproc_per_node=nproc), read_settings(env), 0)
    assert plan.emitted_env().get("OMP_NUM_THREADS") == threads
    assert plan.for_process(nproc - 1).emitted_env().get("OMP_NUM_THREADS") == threads  # through the handoff


def test_processes_the_platform_started_keep_their_pools() -> None:
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "m", "MASTER_PORT": "1"}
    plan = make_plan(resolve(torchrun), RunOptions(framework="pytorch"), read_settings({"TRAINER_CPUS": "4"}), 0)
    assert "OMP_NUM_THREADS" not in plan.emitted_env()


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "²"])
def test_a_bad_cpu_count_is_one_config_error_naming_the_variable(value: str) -> None:
    for read in (lambda: read_settings({"TRAINER_CPUS": value}), lambda: host_cpus({"TRAINER_CPUS": value})):
        with pytest.raises(ConfigError) as info:
            read()
        assert str(info.value).startswith("TRAINER_CPUS: ") and value not in str(info.value).split(": ", 1)[1]


def test_local_divides_the_hosts_cpus_among_its_replicas() -> None:
    assert host_cpus({}) == len(os.sched_getaffinity(0)) and host_cpus({"TRAINER_CPUS": " 6 "}) == 6
    assert replica_cpus({"TRAINER_CPUS": "8"}, 3) == 2 and replica_cpus({"TRAINER_CPUS": "2"}, 5) == 1
    pools = vertex_pools(workers=4, ps=0, evaluators=0, command=["run"])
    replicas = build_replicas(pools, "/tmp/out", None, {"TRAINER_CPUS": "8"})
    assert [r.env["TRAINER_CPUS"] for r in replicas] == ["2"] * 4
