"""Shared by the job-spec tests: run ``entrypoint job`` in-process, and read what it wrote with the real types.

google-cloud-aiplatform and the Kubeflow training SDK are imported inside the functions that need
them, so collecting these modules works in every venv; only .venv/jobs (``-m jobs``) runs them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from entrypoint.cli import main

TORCH_IMAGE = "us-central1-docker.pkg.dev/my-project/trainers/pytorch:v1"
TF_IMAGE = "us-central1-docker.pkg.dev/my-project/trainers/tensorflow:v1"
HVD_IMAGE = "us-central1-docker.pkg.dev/my-project/trainers/horovod:v1"
# Built with REDUCTION_SERVER=1 (docs/images.md tags those -rs).
HVD_RS_IMAGE = "us-central1-docker.pkg.dev/my-project/trainers/horovod:v1-rs"
TF_RS_IMAGE = "us-central1-docker.pkg.dev/my-project/trainers/tensorflow:v1-rs"


def job(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``python -m entrypoint job ARGV`` in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(["job", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str) -> str:
    """Assert the contract for invalid input (exit 2, one line, no traceback) and return the line."""
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("entrypoint: error: "), err
    return lines[0]


def custom_job(text: str) -> Any:
    """Parse REST JSON into aiplatform_v1's CustomJob (unknown fields are an error)."""
    from google.cloud.aiplatform_v1.types import CustomJob

    return CustomJob.from_json(text)


def custom_job_spec(doc: dict[str, Any]) -> Any:
    """Parse a CustomJobSpec dict (gcloud --config) into aiplatform_v1's CustomJobSpec, strictly."""
    from google.cloud.aiplatform_v1.types import CustomJobSpec

    return CustomJobSpec.from_json(json.dumps(doc))


def kubeflow_model(manifest: dict[str, Any]) -> Any:
    """Deserialize into the Kubeflow training SDK's model; nothing may be dropped as unknown on the way back."""
    from kubeflow.training.api_client import ApiClient

    client = ApiClient()
    kind = {"PyTorchJob": "KubeflowOrgV1PyTorchJob", "TFJob": "KubeflowOrgV1TFJob"}[manifest["kind"]]
    model = client._ApiClient__deserialize(manifest, kind)  # the SDK's own deserializer (type-checked)
    assert client.sanitize_for_serialization(model) == manifest
    return model


def trainjob_model(manifest: dict[str, Any]) -> Any:
    """Deserialize into Kubeflow Trainer v2's TrainJob model (kubeflow-trainer-api); nothing may be dropped."""
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

    model = TrainerV1alpha1TrainJob.from_dict(manifest)
    assert model is not None
    assert model.to_dict() == manifest  # an unknown or misplaced field would be dropped on the way
    return model


def run_python_script(script: str, monkeypatch: pytest.MonkeyPatch, method: str, field: str) -> list[Any]:
    """Run a ``--format python`` script with the real SDK: credentials faked, the API's create call caught."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.aiplatform import jobs
    from google.cloud.aiplatform_v1.services.job_service import JobServiceClient

    made: list[Any] = []

    def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        resource = type(kwargs[field])(kwargs[field])
        made.append(kwargs[field])
        collection = re.sub(r"_([a-z])", lambda m: m[1].upper(), field) + "s"  # customJobs
        resource.name = f"projects/1/locations/us-central1/{collection}/1"
        return resource

    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), "my-project"))
    _fake_experiment_lookups(monkeypatch)
    monkeypatch.setattr(JobServiceClient, method, create)
    monkeypatch.setattr(jobs._RunnableJob, "_block_until_complete", lambda self: None)
    monkeypatch.setattr(sys, "argv", ["job.py"])
    exec(compile(script, "job.py", "exec"), {"__name__": "__main__"})
    return made


def _fake_experiment_lookups(monkeypatch: pytest.MonkeyPatch) -> None:
    """CustomJob.submit(experiment=, experiment_run=) looks both up through the metadata API: answer as it would for
    existing ones (resource names as the SDK forms them: a run's context id is ``<experiment>-<run>``)."""
    from google.cloud import aiplatform

    class Experiment:
        def __init__(self, name: str, **_: Any) -> None:
            self.resource_name = f"projects/my-project/locations/us-central1/metadataStores/default/contexts/{name}"

    class ExperimentRun:
        def __init__(self, name: str, experiment: Experiment, **_: Any) -> None:
            self.resource_name = f"{experiment.resource_name}-{name}"

    monkeypatch.setattr(aiplatform, "Experiment", Experiment)
    monkeypatch.setattr(aiplatform, "ExperimentRun", ExperimentRun)


def gcloud_list(value: str) -> list[str]:
    """A list flag as gcloud splits it: commas, or the ``^D^`` delimiter of ``gcloud topic escaping``."""
    delim = ","
    if value.startswith("^") and "^" in value[1:]:
        delim, value = value[1:].split("^", 1)
    if not value:
        return []
    if not value.endswith(delim):
        value += delim
    return value.split(delim)[:-1]


def shell_argv(command: str, tmp: Path) -> list[str]:
    """The argv ``gcloud`` gets when bash runs ``command`` (a stand-in gcloud on PATH records it)."""
    fake = tmp / "bin" / "gcloud"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", "-c", command], env={"PATH": f"{fake.parent}:/usr/bin:/bin"},
                          capture_output=True, text=True, check=True, timeout=60)
    return ["gcloud", *json.loads(proc.stdout)]


def gcloud_command_job_spec(words: list[str]) -> tuple[list[str], dict[str, Any]]:
    """The words before the flags, and the CustomJobSpec gcloud builds from the flags (as its create does)."""
    head = [w for w in words if not w.startswith("--")]
    pools: list[dict[str, Any]] = []
    args: list[str] = []
    spec: dict[str, Any] = {}
    flags = {"--service-account": "serviceAccount", "--network": "network",
             "--persistent-resource-id": "persistentResourceId"}
    for word in words:
        flag, _, value = word.partition("=")
        if flag in flags:
            spec[flags[flag]] = value
        elif word == "--enable-web-access":
            spec["enableWebAccess"] = True
        elif word == "--enable-dashboard-access":
            spec["enableDashboardAccess"] = True
        elif word.startswith("--worker-pool-spec="):
            fields = dict(item.split("=", 1) for item in gcloud_list(word.split("=", 1)[1]))
            pools.append(_gcloud_pool(fields))
        elif word.startswith("--args="):
            args = gcloud_list(word.split("=", 1)[1])
    for pool in pools:
        if pool and args:  # gcloud gives --args to every pool that has a container
            pool["containerSpec"]["args"] = args
    return head, {"workerPoolSpecs": pools, **spec}


def _gcloud_pool(spec: dict[str, str]) -> dict[str, Any]:
    if not spec:
        return {}
    machine: dict[str, Any] = {"machineType": spec["machine-type"]}
    if "accelerator-type" in spec:
        machine["acceleratorType"] = spec["accelerator-type"]
        machine["acceleratorCount"] = int(spec.get("accelerator-count", "1"))
    return {"machineSpec": machine, "replicaCount": int(spec.get("replica-count", "1")),
            "containerSpec": {"imageUri": spec["container-image-uri"]}}
