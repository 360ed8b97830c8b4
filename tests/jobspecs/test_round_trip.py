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


def test_pytorch_json_with_reducers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Chief + 1 worker on T4s with 2 reducers: 2 DDP processes; the reducers listed, never started."""
    spec = _write(capsys, tmp_path / "spec.json", "--image", TORCH_IMAGE, "--workers", "2",
                  "--accelerator", "NVIDIA_TESLA_T4:1", "--reduction-servers", "2", "--",
                  "--framework", "pytorch", "--script", WHO)
    proc, facts = _local_spec(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
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
    from entrypoint.jobs.specfile import job_from_document, to_pools

    mine = {"machineSpec": {"machineType": "n1-standard-4"}, "containerSpec": {"imageUri": TF_IMAGE}}
    doc = {"workerPoolSpecs": [mine, mine, {}, {**mine, "containerSpec": {"imageUri": "gcr.io/else/eval:1"}}]}
    pools = to_pools(job_from_document(doc))
    assert [(p.name, p.start) for p in pools] == [("workerpool0", True), ("workerpool1", True),
                                                  ("workerpool3", False)]
    assert pools[0].command == ("run",)


def test_spec_and_workers_are_exclusive(tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "local", "--spec", "x.json", "--workers", "2"], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert "--spec takes the pools" in one_line_error(proc.returncode, proc.stderr)
