"""From image to job and back: every generated spec run by ``local --spec`` as real processes.

Each replica runs tests/jobspecs/who_am_i.py in script mode, which writes what the resolver sees in
that process; the assertions are on those files (world size, roles, chief), not on log text.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.jobspecs.helpers import TF_IMAGE, TORCH_IMAGE, job, one_line_error

pytestmark = pytest.mark.jobs

WHO = "tests/jobspecs/who_am_i.py"


def _local_spec(spec: Path, tmp: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``local --spec SPEC``; the facts each process wrote, by ``<replica>-<rank>``."""
    facts = tmp / "facts"
    facts.mkdir()
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "local", "--spec", str(spec), "--output-dir",
                           str(tmp / "out"), *extra], cwd=ROOT, env=subprocess_env({"WHO_AM_I_DIR": str(facts)}),
                          capture_output=True, text=True, timeout=300)
    return proc, {p.stem: json.loads(p.read_text()) for p in sorted(facts.glob("*.json"))}


def _write(capsys: pytest.CaptureFixture[str], path: Path, *argv: str) -> Path:
    code, out, err = job(capsys, "vertex", *argv)
    assert code == 0, err
    path.write_text(out)
    return path


def test_pytorch_json_with_reducers_and_scheduling(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Chief + 1 worker on T4s with 2 reducers: 2 DDP processes; the reducers listed, never started.

    The spec's scheduling, identity and disk options are the platform's: one line names them; the env applies.
    """
    spec = _write(capsys, tmp_path / "spec.json", "--image", TORCH_IMAGE, "--workers", "2",
                  "--accelerator", "NVIDIA_TESLA_T4:1", "--reduction-servers", "2", "--spot", "--timeout", "2h",
                  "--restart-job-on-worker-restart", "--service-account", "sa@p.iam.gserviceaccount.com",
                  "--boot-disk-size", "200", "--labels", "team=ml", "--env", "FROM_SPEC_ENV=yes", "--",
                  "--framework", "pytorch", "--script", WHO)
    proc, facts = _local_spec(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("[local] not emulated here (the platform's to apply): workerPoolSpecs[*].diskSpec, scheduling.timeout, "
            "scheduling.strategy, serviceAccount, labels\n") in proc.stdout
    assert {f["spec_env"] for f in facts.values()} == {"yes"}
    assert sorted(facts) == ["workerpool0-0-0", "workerpool1-0-1"]
    assert {f["world_size"] for f in facts.values()} == {2}
    assert [f["replica"] for f in facts.values() if f["is_chief"]] == ["workerpool0-0"]
    assert {k: f["topology"]["role"] for k, f in facts.items()} == {"workerpool0-0-0": "chief",
                                                                    "workerpool1-0-1": "worker"}
    cluster = facts["workerpool0-0-0"]["cluster_spec"]["cluster"]
    assert [len(cluster[p]) for p in ("workerpool0", "workerpool1", "workerpool2")] == [1, 1, 2]
    assert "workerpool2: 2 replica(s) listed in CLUSTER_SPEC, not started" in proc.stdout
    assert "workerpool0: 1 x n1-standard-4 with 1 x NVIDIA_TESLA_T4" in proc.stdout


def test_tensorflow_gcloud_config_with_ps_and_evaluator(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Chief + 2 workers + ps + evaluator from gcloud's YAML, as trial 7: roles, chief and TF_CONFIG as Vertex's."""
    spec = _write(capsys, tmp_path / "job.yaml", "--image", TF_IMAGE, "--workers", "3", "--ps", "1",
                  "--evaluators", "1", "--format", "gcloud-config", "--", "--framework", "tensorflow",
                  "--script", WHO)
    proc, facts = _local_spec(spec, tmp_path, "--trial", "7")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    roles = {f["replica"]: f["topology"]["role"] for f in facts.values()}
    assert roles == {"workerpool0-0": "chief", "workerpool1-0": "worker", "workerpool1-1": "worker",
                     "workerpool2-0": "ps", "workerpool3-0": "evaluator"}
    assert {f["topology"]["num_nodes"] for f in facts.values()} == {3}
    assert [f["replica"] for f in facts.values() if f["is_chief"]] == ["workerpool0-0"]
    chief = next(f for f in facts.values() if f["is_chief"])
    assert set(chief["tf_config"]["cluster"]) == {"chief", "worker", "ps"}
    assert {f["topology"]["trial"] for f in facts.values()} == {"7"}
    assert {f["cluster_spec"]["task"]["trial"] for f in facts.values()} == {"7"}


def test_snake_case_custom_job_with_env(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The Python client's snake_case keys, replicaCount as proto JSON's string, containerSpec.env applied."""
    code, out, err = job(capsys, "vertex", "--image", TF_IMAGE, "--workers", "2", "--format", "python", "--",
                         "--framework", "tensorflow", "--script", WHO)
    assert code == 0, err
    scope: dict[str, Any] = {}
    exec(out[out.index("worker_pool_specs = "):out.index("job = aiplatform.CustomJob(")], scope)  # the literal
    pools = scope["worker_pool_specs"]
    pools[1]["replica_count"] = "1"
    pools[1]["container_spec"]["env"] = [{"name": "FROM_SPEC_ENV", "value": "yes"}]
    spec = tmp_path / "snake.json"
    spec.write_text(json.dumps({"display_name": "snake", "job_spec": {"worker_pool_specs": pools}}))
    proc, facts = _local_spec(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {f["replica"]: f["spec_env"] for f in facts.values()} == {"workerpool0-0": None, "workerpool1-0": "yes"}


def test_invalid_spec_files(tmp_path: Path) -> None:
    """A chief pool of 2, ps for PyTorch, YAML without PyYAML: one line, exit 2, nothing started."""
    pool = {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 2,
            "containerSpec": {"imageUri": TORCH_IMAGE, "args": ["--framework", "pytorch", "--script", WHO]}}
    cases = {
        "two-chiefs.json": ({"workerPoolSpecs": [pool]}, "exactly 1 replica, not 2"),
        "ps.json": ({"workerPoolSpecs": [{**pool, "replicaCount": 1}, {**pool, "replicaCount": 1}, pool]},
                    "TensorFlow only"),
        "gap-chief.json": ({"workerPoolSpecs": [{}, pool]}, "workerPoolSpecs[0]"),
        "other-workers.json": ({"workerPoolSpecs": [{**pool, "replicaCount": 1}, {
            **pool, "containerSpec": {"imageUri": "gcr.io/someone/else:1"}}]}, "another image than the chief"),
        "entrypoint-replaced.json": ({"workerPoolSpecs": [{**pool, "replicaCount": 1, "containerSpec": {
            **pool["containerSpec"], "command": ["bash", "-c", "train"]}}]}, "ENTRYPOINT"),
    }
    for name, (doc, expected) in cases.items():
        (tmp_path / name).write_text(json.dumps(doc))
        proc = subprocess.run([PYTHON, "-m", "entrypoint", "local", "--spec", str(tmp_path / name)], cwd=ROOT,
                              env=subprocess_env(), capture_output=True, text=True, timeout=60)
        assert expected in one_line_error(proc.returncode, proc.stderr), name
        assert "starting" not in proc.stdout
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"workerPoolSpecs": [pool]}))
    no_yaml = "import sys; sys.modules['yaml'] = None; from entrypoint.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", no_yaml, "local", "--spec", str(tmp_path / "job.yaml")], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert "PyYAML" in one_line_error(proc.returncode, proc.stderr)


def test_pools_on_other_images_are_listed_not_started() -> None:
    from entrypoint.jobs.specdoc import job_from_document
    from entrypoint.local.specfile import to_pools

    mine = {"machineSpec": {"machineType": "n1-standard-4"}, "containerSpec": {"imageUri": TF_IMAGE}}
    doc = {"workerPoolSpecs": [mine, mine, {}, {**mine, "containerSpec": {"imageUri": "gcr.io/else/eval:1"}}]}
    pools = to_pools(job_from_document(doc).job)
    assert [(p.name, p.start) for p in pools] == [("workerpool0", True), ("workerpool1", True),
                                                  ("workerpool3", False)]
    assert pools[0].command == ("run",)


def test_spec_and_workers_are_exclusive(tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "local", "--spec", "x.json", "--workers", "2"], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert "--spec takes the pools" in one_line_error(proc.returncode, proc.stderr)


def test_a_tuning_job_runs_one_trial(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """job vertex-tuning's JSON, run here: trial 1 by default, each parameter appended as Vertex AI does."""
    code, out, err = job(capsys, "vertex-tuning", "--image", TORCH_IMAGE, "--hypertune-metric", "accuracy",
                         "--goal", "maximize", "--param-double", "lr=0.0001:0.01:log", "--param-int", "units=8:16",
                         "--param-categorical", "act=relu,tanh", "--max-trials", "4", "--",
                         "--framework", "pytorch", "--script", WHO, "--", "--seed-data", "1")
    assert code == 0, err
    spec = tmp_path / "tuning.json"
    spec.write_text(out)
    proc, facts = _local_spec(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (chief,) = facts.values()
    assert chief["argv"] == ["--seed-data", "1", "--lr=0.001", "--units=12", "--act=relu"]
    assert chief["trial_env"] == "1" and chief["topology"]["trial"] == "1"
    assert "running one trial with --lr=0.001 --units=12 --act=relu" in proc.stdout


def _spec_error(doc: Any) -> str:
    from entrypoint.errors import ConfigError
    from entrypoint.jobs.specdoc import job_from_document

    with pytest.raises(ConfigError) as caught:
        job_from_document(doc)
    return str(caught.value)


def test_gcloud_config_files_are_camel_case_only() -> None:
    """gcloud reads a snake_case --config file as no pools at all: refused, naming the key and its spelling."""
    pool = {"machineSpec": {"machineType": "n1-standard-4"}, "containerSpec": {"imageUri": TORCH_IMAGE}}
    snake = {"worker_pool_specs": [pool]}
    assert "worker_pool_specs: gcloud's --config takes camelCase keys only" in _spec_error(snake)
    assert "use workerPoolSpecs" in _spec_error(snake)
    nested = {"workerPoolSpecs": [{**pool, "disk_spec": {"boot_disk_size_gb": 200}}]}
    assert "disk_spec" in _spec_error(nested)
    # the REST resource is proto JSON, which takes either spelling
    from entrypoint.jobs.specdoc import job_from_document

    assert job_from_document({"display_name": "x", "job_spec": snake}).job.pool(0) is not None


def test_spec_fields_are_checked() -> None:
    pool = {"machineSpec": {"machineType": "n1-standard-4"},
            "containerSpec": {"imageUri": TORCH_IMAGE, "args": ["--module", "m", "--epochs", 3]}}
    assert "workerPoolSpecs[0].containerSpec.args[3]: must be a string, not int (quote it in YAML)" in _spec_error(
        {"workerPoolSpecs": [pool]})
    assert "replicas is not a field of WorkerPoolSpec" in _spec_error({"workerPoolSpecs": [{"replicas": 2}]})
    assert "machineType" not in _spec_error({"displayName": "x", "jobSpec": {"workerPoolSpecs": [], "foo": 1}})


def test_scheduling_reaches_the_emulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """restartJobOnWorkerRestart / disableRetries (either spelling) are LocalJob's, for local's restart policy."""
    from entrypoint.local.specfile import spec_pools

    pool = {"machineSpec": {"machineType": "n1-standard-4"},
            "containerSpec": {"imageUri": TORCH_IMAGE, "args": ["--module", "m"]}}
    for scheduling, expected in (({"restartJobOnWorkerRestart": True}, (True, False)),
                                 ({"disable_retries": True}, (False, True)), ({}, (False, False))):
        path = tmp_path / "spec.json"
        path.write_text(json.dumps({"displayName": "x", "jobSpec": {"workerPoolSpecs": [pool],
                                                                    "scheduling": scheduling}}))
        local = spec_pools(str(path))
        assert (local.restart_job_on_worker_restart, local.disable_retries, local.trial) == (*expected, None)
        assert [p.name for p in local.pools] == ["workerpool0"]


def test_tensorflow_reducers_without_a_strategy_are_refused(tmp_path: Path) -> None:
    """A hand-written TF spec with reducers and no --strategy would train with ParameterServerStrategy."""
    gpu = {"machineType": "g2-standard-8", "acceleratorType": "NVIDIA_L4", "acceleratorCount": 1}
    ours = {"machineSpec": gpu, "containerSpec": {"imageUri": TF_IMAGE, "args": ["--module", "m"]}}
    reducers = {"machineSpec": {"machineType": "n1-highcpu-16"}, "replicaCount": 2,
                "containerSpec": {"imageUri": "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"}}
    (tmp_path / "tf.json").write_text(json.dumps({"workerPoolSpecs": [ours, ours, reducers]}))
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "local", "--spec", str(tmp_path / "tf.json")], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert "needs --strategy MultiWorkerMirroredStrategy" in one_line_error(proc.returncode, proc.stderr)


@pytest.mark.slow
def test_a_trial_passes_a_conditional_parameter_only_under_its_parents_value(capsys: pytest.CaptureFixture[str],
                                                                            tmp_path: Path) -> None:
    """The trial's optimizer is sgd (the first of its list): momentum, sgd's child, is passed; beta, adam's, is not.
    The study's options that are Vertex AI's (measurement, early stopping) are named as not emulated."""
    code, out, err = job(capsys, "vertex-tuning", "--image", TORCH_IMAGE, "--hypertune-metric", "accuracy",
                         "--goal", "maximize", "--param-categorical", "optimizer=sgd,adam", "--param-double",
                         "momentum=0.2:0.4", "--param-condition", "momentum=optimizer:sgd", "--param-double",
                         "beta=0.9:0.99", "--param-condition", "beta=optimizer:adam", "--early-stopping", "median",
                         "--max-trials", "4", "--", "--framework", "pytorch", "--script", WHO)
    assert code == 0, err
    spec = tmp_path / "tuning.json"
    spec.write_text(out)
    proc, facts = _local_spec(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (chief,) = facts.values()
    assert chief["argv"] == ["--optimizer=sgd", "--momentum=0.30000000000000004"]
    assert "studySpec.measurementSelectionType, studySpec.medianAutomatedStoppingSpec" in proc.stdout


def test_spec_files_the_platform_would_refuse(tmp_path: Path) -> None:
    """local --spec checks a hand-written spec as job vertex checks its own: one line, exit 2, nothing started."""
    def pool(machine: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"machineSpec": machine, "replicaCount": 1, "containerSpec": {
            "imageUri": TORCH_IMAGE, "args": ["--framework", "pytorch", "--script", WHO]}, **extra}

    t4 = {"machineType": "n1-standard-8", "acceleratorType": "NVIDIA_TESLA_T4", "acceleratorCount": 1}
    specific = {"reservationAffinityType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
                "values": ["projects/p/zones/us-central1-a/reservations/r"]}
    cases = {
        "flex-t4.json": ({"workerPoolSpecs": [pool(t4)], "scheduling": {"strategy": "FLEX_START"}},
                         "provisions L4, A100, H100, H200 and B200 GPUs only"),
        "spot-reservation.json": ({"workerPoolSpecs": [pool({**t4, "reservationAffinity": specific})],
                                   "scheduling": {"strategy": "SPOT"}}, "SPOT VMs cannot consume a reservation"),
        "a4-pd-ssd.json": ({"workerPoolSpecs": [pool({"machineType": "a4-highgpu-8g", "acceleratorType": "NVIDIA_B200",
                                                      "acceleratorCount": 8}, diskSpec={"bootDiskType": "pd-ssd"})]},
                           "boots from Hyperdisk only"),
        "env-101.json": ({"workerPoolSpecs": [{**pool(t4), "containerSpec": {
            **pool(t4)["containerSpec"], "env": [{"name": f"V{i}", "value": "1"} for i in range(101)]}}]},
            "101 environment variables"),
        "short-reservation.json": ({"workerPoolSpecs": [pool({**t4, "reservationAffinity": {
            **specific, "values": ["r"]}})]}, "full resource name"),
    }
    for name, (doc, expected) in cases.items():
        (tmp_path / name).write_text(json.dumps(doc))
        proc = subprocess.run([PYTHON, "-m", "entrypoint", "local", "--spec", str(tmp_path / name)], cwd=ROOT,
                              env=subprocess_env(), capture_output=True, text=True, timeout=60)
        assert expected in one_line_error(proc.returncode, proc.stderr), name
        assert "starting" not in proc.stdout


def test_a_tuning_spec_with_a_spaced_metric_id_is_refused(tmp_path: Path) -> None:
    from entrypoint.errors import ConfigError
    from entrypoint.local.specfile import spec_pools

    pool = {"machineSpec": {"machineType": "n1-standard-4"},
            "containerSpec": {"imageUri": TORCH_IMAGE, "args": ["--module", "m", "--"]}}
    doc = {"displayName": "t", "studySpec": {"metrics": [{"metricId": "val acc", "goal": "MAXIMIZE"}],
                                             "parameters": [{"parameterId": "lr", "doubleValueSpec": {
                                                 "minValue": 0.1, "maxValue": 0.2}}]},
           "maxTrialCount": 2, "parallelTrialCount": 1, "trialJobSpec": {"workerPoolSpecs": [pool]}}
    (tmp_path / "t.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"studySpec.metrics\[0\].metricId: must be a metric id without whitespace"):
        spec_pools(str(tmp_path / "t.json"))


def test_the_new_platform_fields_are_named_as_not_emulated(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    """NFS and Lustre mounts, PSC, Experiments, the dashboard: the platform's, named on the one line."""
    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--network", "projects/1/global/networks/n",
                         "--nfs-mount", "10.0.0.2:/vol:data", "--lustre-mount", "10.0.0.3:h:lfs:scratch",
                         "--psc-network-attachment", "att", "--experiment", "e", "--experiment-run", "r",
                         "--project", "p", "--service-account", "sa@p.iam.gserviceaccount.com",
                         "--enable-dashboard-access", "--", "--framework", "pytorch", "--script", WHO)
    assert code == 0, err
    (tmp_path / "spec.json").write_text(out)
    from entrypoint.local.specfile import spec_pools

    spec_pools(str(tmp_path / "spec.json"))
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("[local] not emulated"))
    for field in ("workerPoolSpecs[*].nfsMounts", "workerPoolSpecs[*].lustreMounts", "pscInterfaceConfig",
                  "experiment", "experimentRun", "enableDashboardAccess", "network"):
        assert field in line.split(": ", 1)[1].split(", "), field
