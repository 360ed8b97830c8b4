"""Plans, output directories, GPU counting and ``describe`` (which imports no ML framework)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from entrypoint import cli
from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import PlatformSettings, secret_like_names
from entrypoint.cluster.gpus import detect_gpu_count
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.outputs.locations import local_path, resolve_outputs
from entrypoint.planning.plan import make_plan
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.unit.test_environments import vertex


def plan_for(env: dict[str, str], framework: str, gpus: int = 0, **options: Any):
    return make_plan(resolve(env), RunOptions(framework=framework, **options), PlatformSettings(), gpus)


def run_describe(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert cli.main(["describe", *args]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


@pytest.mark.parametrize(("env", "gpus", "strategy"), [
    ({}, 0, "default"),
    ({}, 1, "default"),
    ({}, 2, "MirroredStrategy"),
    (vertex("workerpool0", 0), 0, "ParameterServerStrategy"),
    ({"TF_CONFIG": json.dumps({"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "chief"}})}, 4,
     "MultiWorkerMirroredStrategy"),
])
def test_tensorflow_strategy(env: dict[str, str], gpus: int, strategy: str) -> None:
    plan = plan_for(env, "tensorflow", gpus)
    assert plan.strategy == strategy and plan.nproc_per_node == 1 and plan.reason


def test_parameter_server_strategy_without_ps_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="ParameterServerStrategy needs a ps pool"):
        plan_for({}, "tensorflow", strategy="ParameterServerStrategy")


@pytest.mark.parametrize("framework", ["tensorflow", "horovod"])
@pytest.mark.parametrize("strategy", ["fsdp", "hsdp"])
def test_sharded_strategies_are_pytorchs_only(framework: str, strategy: str) -> None:
    with pytest.raises(ConfigError, match=f"--strategy: {strategy} is not available with {framework}"):
        plan_for({}, framework, strategy=strategy)


def test_pytorch_plans_ddp_and_says_when_fsdp_takes_over() -> None:
    plan = plan_for(vertex("workerpool1", 0), "pytorch")
    assert plan.strategy == "ddp" and "else FSDP (decided after build_model)" in plan.reason
    assert plan_for(vertex("workerpool1", 0), "pytorch", strategy="hsdp").strategy == "hsdp"


def test_vertex_pool2_is_reduction_server_for_pytorch_and_ps_for_tensorflow() -> None:
    torch_plan = plan_for(vertex("workerpool1", 0), "pytorch", gpus=8)
    assert torch_plan.server_pool == "reduction_server"
    assert (torch_plan.strategy, torch_plan.nproc_per_node, torch_plan.world_size) == ("ddp", 8, 24)
    assert '"ps"' not in torch_plan.emitted_env()["TF_CONFIG"]
    tf_plan = plan_for(vertex("workerpool1", 0), "tensorflow")
    assert tf_plan.server_pool == "parameter_servers" and '"ps"' in tf_plan.emitted_env()["TF_CONFIG"]
    forced = plan_for(vertex("workerpool1", 0), "tensorflow", strategy="MultiWorkerMirroredStrategy")
    assert forced.server_pool == "reduction_server"


def test_reducer_replica_must_not_run_our_image() -> None:
    with pytest.raises(ConfigError, match="Reduction Server"):
        plan_for(vertex("workerpool2", 0), "pytorch")


def test_pytorch_processes_per_node() -> None:
    assert plan_for({}, "pytorch", gpus=0).nproc_per_node == 1
    assert plan_for({}, "pytorch", gpus=4).nproc_per_node == 4
    two = plan_for({}, "pytorch", gpus=0, nproc_per_node=2)
    assert (two.nproc_per_node, two.world_size, two.strategy) == (2, 2, "ddp")
    pet = {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "3", "PET_MASTER_ADDR": "m",
           "PET_MASTER_PORT": "1"}
    assert plan_for(pet, "pytorch").world_size == 6


def test_outputs_default_to_job_dir_and_trial_subdirectory() -> None:
    out = resolve_outputs(job_dir=None, model_dir=None, checkpoint_dir=None, tensorboard_dir=None, trial=None)
    assert (out.model_dir, out.checkpoint_dir, out.tensorboard_dir) == (
        "./outputs/model", "./outputs/checkpoints", "./outputs/logs")
    trial = resolve_outputs(job_dir="/jobs/x", model_dir=None, checkpoint_dir=None, tensorboard_dir=None, trial="3")
    assert trial.model_dir == "/jobs/x/3/model"
    aip = resolve_outputs(job_dir=None, model_dir="gs://b/base/model/", checkpoint_dir="gs://b/base/3/checkpoints",
                          tensorboard_dir=None, trial="3")
    assert aip.model_dir == "gs://b/base/model/3"  # the platform did not put the trial in it
    assert aip.checkpoint_dir == "gs://b/base/3/checkpoints"  # it did here: left alone
    mounted = os.path.ismount("/gcs") or os.path.ismount("/gcs/b")  # Vertex's FUSE mount, else gcsfs
    assert local_path("gs://b/base/model") == ("/gcs/b/base/model" if mounted else "gs://b/base/model")


def test_aip_variables_set_the_output_dirs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AIP_MODEL_DIR", "gs://bucket/job/model/")
    out = run_describe(capsys, "--framework", "pytorch", "--job-dir", "/tmp/j")
    assert out["plan"]["model_dir"] == "gs://bucket/job/model"
    assert out["plan"]["checkpoint_dir"] == "/tmp/j/checkpoints"


@pytest.mark.parametrize(("value", "count"), [("", 0), ("-1", 0), ("0", 1), ("0,1", 2), ("0,1,-1,3", 2),
                                              ("GPU-aaaa,GPU-bbbb", 2), ("NoDevFiles", 0)])
def test_gpu_count_from_cuda_visible_devices(value: str, count: int) -> None:
    assert detect_gpu_count(value) == count


def test_describe_shows_mirrored_for_one_node_with_two_gpus(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "detect_gpu_count", lambda _visible: 2)
    out = run_describe(capsys, "--framework", "tensorflow")
    assert out["plan"]["strategy"] == "MirroredStrategy" and out["plan"]["gpus_per_node"] == 2


def test_describe_vertex_keys(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in vertex("workerpool1", 1).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MY_API_KEY", "do-not-print")
    out = run_describe(capsys, "--framework", "pytorch")
    topo, plan = out["topology"], out["plan"]
    assert {k: topo[k] for k in ("source", "role", "index", "node_rank", "num_nodes", "chief_address", "trial")} == {
        "source": "vertex", "role": "worker", "index": 1, "node_rank": 2, "num_nodes": 3,
        "chief_address": "cmle-training-workerpool0-ab-0:2222", "trial": "3"}
    assert {"framework", "strategy", "nproc_per_node", "model_dir", "checkpoint_dir", "tensorboard_dir"} <= set(plan)
    assert plan["model_dir"] == "./outputs/3/model"
    assert out["env"]["MASTER_ADDR"] == "cmle-training-workerpool0-ab-0" and out["env"]["NODE_RANK"] == "2"
    assert json.loads(out["env"]["TF_CONFIG"])["task"] == {"type": "worker", "index": 1, "trial": "3"}
    assert "MY_API_KEY" in out["secret_like_variables"]
    assert "do-not-print" not in json.dumps(out)


def test_secret_like_names_only() -> None:
    names = secret_like_names({"AWS_SECRET_ACCESS_KEY": "x", "HF_TOKEN": "y", "DB_PASSWORD": "z", "PATH": "/bin"})
    assert names == ["AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "HF_TOKEN"]


def test_describe_imports_no_ml_framework() -> None:
    code = ("import sys; from entrypoint.cli import main; rc = main(['describe', '--framework', 'pytorch']); "
            "bad = [m for m in ('torch', 'tensorflow', 'horovod', 'keras') if m in sys.modules]; "
            "sys.exit(3 if bad else rc)")
    env = subprocess_env({"CLUSTER_SPEC": vertex("workerpool0", 0)["CLUSTER_SPEC"]})
    proc = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["topology"]["source"] == "vertex"


def test_unknown_framework_names_accepted_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINER_FRAMEWORK", "mxnet")
    assert cli.main(["describe"]) == 2


def test_horovod_fusion_defaults_flags_and_user_override(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = run_describe(capsys, "--framework", "horovod")["env"]
    assert (env["HOROVOD_FUSION_THRESHOLD"], env["HOROVOD_CYCLE_TIME"]) == ("134217728", "5")
    env = run_describe(capsys, "--framework", "horovod", "--fusion-threshold", "64", "--cycle-time-ms", "3.5",
                       "--autotune", "--job-dir", "/j")["env"]
    assert (env["HOROVOD_FUSION_THRESHOLD"], env["HOROVOD_CYCLE_TIME"]) == ("64", "3.5")
    assert env["HOROVOD_AUTOTUNE"] == "1" and env["HOROVOD_AUTOTUNE_LOG"] == "/j/horovod_autotune.csv"
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1048576")
    env = run_describe(capsys, "--framework", "horovod", "--fusion-threshold", "64")["env"]
    assert env["HOROVOD_FUSION_THRESHOLD"] == "1048576"
    assert "HOROVOD_FUSION_THRESHOLD" not in run_describe(capsys, "--framework", "pytorch")["env"]


def test_tensorflow_ps_replica_with_reduction_server_reading_is_an_error() -> None:
    with pytest.raises(ConfigError, match="Reduction Server"):
        plan_for(vertex("workerpool2", 0), "tensorflow", strategy="MultiWorkerMirroredStrategy")
    assert plan_for(vertex("workerpool2", 0), "tensorflow").strategy == "ParameterServerStrategy"
