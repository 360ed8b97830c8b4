"""``job kubeflow``: PyTorchJob and TFJob manifests read back by the Kubeflow training SDK's models."""

from __future__ import annotations

import pytest
import yaml

from tests.jobspecs.helpers import HVD_IMAGE, TF_IMAGE, TORCH_IMAGE, job, kubeflow_model

pytestmark = pytest.mark.jobs

RUN = ["--module", "trainers.digits_torch", "--", "--lr", "0.1"]


def _manifest(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code, out, err = job(capsys, "kubeflow", *argv)
    assert code == 0, err
    return dict(yaml.safe_load(out))


def test_pytorchjob(capsys: pytest.CaptureFixture[str]) -> None:
    manifest = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "3", "--gpus", "4",
                         "--namespace", "ml", "--", *RUN)
    model = kubeflow_model(manifest)
    assert (model.api_version, model.kind, model.metadata.name, model.metadata.namespace) == (
        "kubeflow.org/v1", "PyTorchJob", "pytorch-job", "ml")
    assert model.spec.nproc_per_node == "4"
    master, worker = model.spec.pytorch_replica_specs["Master"], model.spec.pytorch_replica_specs["Worker"]
    assert (master.replicas, worker.replicas) == (1, 2)
    for replica in (master, worker):
        assert replica.restart_policy == "ExitCode"
        (container,) = replica.template.spec.containers
        assert (container.name, container.image, container.args) == ("pytorch", TORCH_IMAGE, RUN)
        assert container.resources.limits == {"nvidia.com/gpu": "4"}


def test_single_cpu_pytorchjob_and_horovod(capsys: pytest.CaptureFixture[str]) -> None:
    model = kubeflow_model(_manifest(capsys, "--kind", "pytorchjob", "--image", HVD_IMAGE, "--name", "hvd", "--",
                                     "--module", "trainers.digits_horovod"))
    assert list(model.spec.pytorch_replica_specs) == ["Master"]
    assert model.spec.nproc_per_node == "1"
    assert model.spec.pytorch_replica_specs["Master"].template.spec.containers[0].resources is None


def test_tfjob(capsys: pytest.CaptureFixture[str]) -> None:
    manifest = _manifest(capsys, "--kind", "tfjob", "--image", TF_IMAGE, "--workers", "3", "--ps", "2",
                         "--evaluators", "1", "--gpus", "1", "--backoff-limit", "5", "--", "--module", "m")
    model = kubeflow_model(manifest)
    specs = model.spec.tf_replica_specs
    assert {k: v.replicas for k, v in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 2, "Evaluator": 1}
    assert {v.restart_policy for v in specs.values()} == {"ExitCode"}
    assert {v.template.spec.containers[0].name for v in specs.values()} == {"tensorflow"}
    assert specs["PS"].template.spec.containers[0].resources is None  # servers get no GPUs
    assert specs["Evaluator"].template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert model.spec.run_policy.backoff_limit == 5
