"""The plan's round trip: ``to_dict`` through JSON and ``from_dict``, and through the worker handoff (the sealed
memory file named by TRAINER_PLAN_FILE), for several layouts. Written against ``make_plan``, ``to_dict`` /
``from_dict`` and equality only, never against the plan's fields, so they hold while those change.
No framework is imported: a framework's ``plan`` function never imports its framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.planning import handoff
from entrypoint.planning.plan import Plan, make_plan
from tests.unit.test_environments import AIP_TF_CONFIG, KUBEFLOW, vertex

TF_PS_EVALUATOR = {
    "cluster": {"chief": ["chief-0:2222"], "worker": ["worker-0:2222", "worker-1:2222"], "ps": ["ps-0:2222"],
                "evaluator": ["evaluator-0:2222"]},
    "task": {"type": "evaluator", "index": 0},
}
TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "TORCHELASTIC_RUN_ID": "job-7", "MASTER_ADDR": "node-0", "MASTER_PORT": "29500"}
ARGS = ("--lr", "0.1", "--api-key=do-not-print", "ünïcode", "")

# (platform variables, GPUs, options), named by their ids
LAYOUTS: list[Any] = [
    pytest.param({}, 0, {"framework": "pytorch"}, id="single node, one process"),
    pytest.param({}, 0, {"framework": "pytorch", "nproc_per_node": 3, "module": "trainers.digits_torch",
                         "user_args": ARGS}, id="single node, three processes, hooks module, user args"),
    pytest.param({}, 2, {"framework": "tensorflow", "module": "trainers.tabular_keras"}, id="single node, TF, 2 GPUs"),
    pytest.param(vertex("workerpool0", 0), 8, {"framework": "pytorch", "job_dir": "gs://bkt/job"},
                 id="Vertex chief, 3 pools with a reduction server, gs:// job dir"),
    pytest.param(vertex("workerpool1", 1, trial=None), 4, {"framework": "pytorch"}, id="Vertex worker, no trial"),
    pytest.param(vertex("workerpool3", 2), 0, {"framework": "tensorflow"}, id="Vertex pool 3 as TF evaluator"),
    pytest.param(vertex("workerpool2", 0), 0, {"framework": "tensorflow"}, id="Vertex pool 2 as TF ps"),
    pytest.param({"TF_CONFIG": json.dumps(TF_PS_EVALUATOR)}, 0, {"framework": "tensorflow"},
                 id="TF_CONFIG with ps and evaluator (the evaluator)"),
    pytest.param({"TF_CONFIG": json.dumps(AIP_TF_CONFIG)}, 0, {"framework": "tensorflow", "timeout": 12.5},
                 id="AI Platform TF_CONFIG worker with ps"),
    pytest.param(TORCHRUN, 0, {"framework": "pytorch"}, id="placed by torchrun"),
    pytest.param({**KUBEFLOW, "RANK": "0"}, 0, {"framework": "pytorch", "nproc_per_node": 2},
                 id="Kubeflow PyTorchJob master"),
    pytest.param({}, 0, {"framework": "horovod", "nproc_per_node": 2, "module": "trainers.digits_horovod"},
                 id="Horovod, two processes"),
]


def make(env: dict[str, str], gpus: int, options: dict[str, Any]) -> Plan:
    return make_plan(resolve(env), RunOptions(**options), PlatformSettings(restart_count=2), gpus)


# Local ranks to place the plan at: the round trip is checked, not where a rank lands (other tests do that).
def local_ranks(plan: Plan) -> list[int]:
    """The node's first two local ranks; only the platform's own for a process the platform started."""
    ranks = plan.topology.platform_ranks
    return [ranks.local_rank] if ranks is not None else list(range(min(plan.nproc_per_node, 2)))


@pytest.mark.parametrize(("env", "gpus", "options"), LAYOUTS)
def test_the_plan_survives_json(env: dict[str, str], gpus: int, options: dict[str, Any]) -> None:
    plan = make(env, gpus, options)
    text = json.dumps(plan.to_dict())
    again = Plan.from_dict(json.loads(text))
    assert again == plan
    assert json.dumps(again.to_dict()) == text  # and the second trip writes the same bytes
    assert again.emitted_env() == plan.emitted_env() and again.describe() == plan.describe()


@pytest.mark.parametrize(("env", "gpus", "options"), LAYOUTS)
def test_a_placed_plan_survives_json(env: dict[str, str], gpus: int, options: dict[str, Any]) -> None:
    plan = make(env, gpus, options)
    for rank in local_ranks(plan):
        placed = plan.for_process(rank)
        assert Plan.from_dict(json.loads(json.dumps(placed.to_dict()))) == placed


@pytest.mark.parametrize(("env", "gpus", "options"), LAYOUTS)
def test_every_worker_reads_back_the_plan_the_launcher_wrote(env: dict[str, str], gpus: int,
                                                             options: dict[str, Any]) -> None:
    plan = make(env, gpus, options)
    with handoff.plan_file(plan) as variables:
        assert set(variables) == {ev.TRAINER_PLAN_FILE}
        path = variables[ev.TRAINER_PLAN_FILE]
        assert path.startswith(f"/proc/{os.getpid()}/fd/")
        assert handoff.launcher_of(handoff.read(variables)) == os.getpid()  # known before the plan is read
        for rank in local_ranks(plan):
            loaded, launcher = handoff.load(handoff.read({**variables, ev.LOCAL_RANK: str(rank)}))
            assert loaded == plan.for_process(rank)
            assert launcher == os.getpid()
        first = local_ranks(plan)[0]
        horovod, _ = handoff.load(handoff.read({**variables, ev.HOROVOD_LOCAL_RANK: str(first)}))
        assert horovod == plan.for_process(first)
    assert not os.path.exists(path)  # gone with the block: nothing left behind


def test_the_plan_file_is_private_sealed_and_not_on_a_disk() -> None:
    plan = make({}, 0, {"framework": "pytorch", "user_args": ARGS})
    with handoff.plan_file(plan) as variables:
        path = variables[ev.TRAINER_PLAN_FILE]
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.readlink(path).startswith("/memfd:trainer-plan")
        fd = os.open(path, os.O_WRONLY)
        try:
            with pytest.raises(PermissionError):
                os.write(fd, b"{}")  # F_SEAL_WRITE
        finally:
            os.close(fd)
        assert handoff.load_if_any() is None  # this process was not handed a plan
    assert handoff.load_if_any() is None


def test_a_worker_without_a_readable_plan_file_is_a_config_error(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="TRAINER_PLAN_FILE: missing"):
        handoff.load(handoff.read({}))
    with pytest.raises(ConfigError, match=r"TRAINER_PLAN_FILE: cannot read the plan \(FileNotFoundError\)"):
        handoff.load(handoff.read({ev.TRAINER_PLAN_FILE: str(tmp_path / "gone")}))
    (tmp_path / "bad").write_text("{not json")
    with pytest.raises(ConfigError, match=r"cannot read the plan \(JSONDecodeError\)"):
        handoff.load(handoff.read({ev.TRAINER_PLAN_FILE: str(tmp_path / "bad")}))


def test_a_worker_whose_launcher_died_before_it_read_the_plan_dies_with_it_silently(tmp_path: Any) -> None:
    """A node SIGKILLed as torch's agent starts its workers (in sessions of their own, out of the node's process
    group): the worker must end as its launcher did, not run on and report the launcher's vanished plan file as a
    configuration error (exit 2) after the platform already restarted the node."""
    launcher = subprocess.Popen([sys.executable, "-c", "pass"])
    launcher.wait()  # its pid is gone: its memory file (the plan) went with it
    env = {**os.environ, ev.TRAINER_PLAN_FILE: f"/proc/{launcher.pid}/fd/3", ev.LOCAL_RANK: "1",
           ev.TORCHELASTIC_ERROR_FILE: str(tmp_path / "error.json")}
    done = subprocess.run([sys.executable, "-m", "entrypoint.worker"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 137, done.stdout + done.stderr
    assert "TRAINER_PLAN_FILE" not in done.stdout + done.stderr
    assert not (tmp_path / "error.json").exists()  # no failure of its own recorded either
    assert handoff.launcher_of(handoff.read({ev.TRAINER_PLAN_FILE: str(tmp_path / "plan")})) is None
