"""``job kubeflow``: PyTorchJob/TFJob (training SDK) and TrainJob (Trainer v2 API) manifests read by their models."""

from __future__ import annotations

import pytest
import yaml

from tests.jobspecs.helpers import HVD_IMAGE, TF_IMAGE, TORCH_IMAGE, job, kubeflow_model, trainjob_model

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


POD_OPTIONS = ["--gpus", "8", "--cpu", "90", "--memory", "1000Gi", "--shm-size", "64Gi", "--node-selector",
               "cloud.google.com/gke-accelerator=nvidia-h100-80gb", "--toleration", "nvidia.com/gpu=present:NoSchedule",
               "--toleration", "dedicated:NoExecute", "--env", "NCCL_DEBUG=WARN", "--env-secret",
               "WANDB_API_KEY=wandb:key", "--service-account", "trainer", "--image-pull-secret", "registry"]


def test_pod_options(capsys: pytest.CaptureFixture[str]) -> None:
    """Requests and limits, /dev/shm in memory, placement, env (a Secret's too), identity; in every replica."""
    manifest = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "2", *POD_OPTIONS,
                         "--clean-pod-policy", "All", "--ttl-seconds-after-finished", "600", "--active-deadline",
                         "86400", "--backoff-limit", "5", "--", *RUN)
    model = kubeflow_model(manifest)
    policy = model.spec.run_policy
    assert (policy.clean_pod_policy, policy.ttl_seconds_after_finished, policy.active_deadline_seconds,
            policy.backoff_limit) == ("All", 600, 86400, 5)
    for replica in model.spec.pytorch_replica_specs.values():
        pod = replica.template.spec
        (container,) = pod.containers
        assert container.resources.requests == {"cpu": "90", "memory": "1000Gi"}
        assert container.resources.limits == {"memory": "1000Gi", "nvidia.com/gpu": "8"}
        (volume,) = pod.volumes
        assert (volume.empty_dir.medium, volume.empty_dir.size_limit) == ("Memory", "64Gi")
        assert [(m.name, m.mount_path) for m in container.volume_mounts] == [(volume.name, "/dev/shm")]
        assert pod.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
        assert [(t.key, t.operator, t.value, t.effect) for t in pod.tolerations] == [
            ("nvidia.com/gpu", "Equal", "present", "NoSchedule"), ("dedicated", "Exists", None, "NoExecute")]
        assert [(e.name, e.value) for e in container.env] == [("NCCL_DEBUG", "WARN"), ("WANDB_API_KEY", None)]
        assert container.env[1].value_from.secret_key_ref.name == "wandb"
        assert pod.service_account_name == "trainer"
        assert [s.name for s in pod.image_pull_secrets] == ["registry"]


def test_manifest_says_which_operator_reads_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = job(capsys, "kubeflow", "--kind", "tfjob", "--image", TF_IMAGE, "--", "--module", "m")
    assert code == 0
    assert out.startswith("# Kubeflow Training Operator v1.5.0 or later: restartPolicy ExitCode retries exit codes")
    assert "backoffLimit does not bound" in out


def test_names_start_with_a_letter(capsys: pytest.CaptureFixture[str]) -> None:
    """The operators want DNS-1035 names: an image named 3d-pytorch gets job-3d-pytorch."""
    manifest = _manifest(capsys, "--kind", "pytorchjob", "--image", "gcr.io/p/3d-pytorch:v1", "--framework",
                         "pytorch", "--", *RUN)
    assert kubeflow_model(manifest).metadata.name == "job-3d-pytorch"


def test_trainjob(capsys: pytest.CaptureFixture[str]) -> None:
    """Trainer v2: the torch runtime's PET_* drive our entrypoint; pod details go into a runtime patch."""
    manifest = _manifest(capsys, "--kind", "trainjob", "--image", HVD_IMAGE, "--workers", "4", *POD_OPTIONS,
                         "--namespace", "ml", "--active-deadline", "3600", "--", "--module", "trainers.digits_horovod")
    model = trainjob_model(manifest)
    assert (model.api_version, model.kind, model.metadata.name) == ("trainer.kubeflow.org/v1alpha1", "TrainJob",
                                                                   "horovod-job")
    spec = model.spec
    assert (spec.runtime_ref.name, spec.runtime_ref.kind) == ("torch-distributed", "ClusterTrainingRuntime")
    trainer = spec.trainer
    assert (trainer.image, trainer.args, trainer.num_nodes, trainer.num_proc_per_node) == (
        HVD_IMAGE, ["--module", "trainers.digits_horovod"], 4, 8)
    assert trainer.resources_per_node.limits["nvidia.com/gpu"].actual_instance == "8"  # a Quantity
    assert [e.name for e in trainer.env] == ["NCCL_DEBUG", "WANDB_API_KEY"]
    assert spec.active_deadline_seconds == 3600
    (patch,) = spec.runtime_patches
    (node,) = patch.training_runtime_spec.template.spec.replicated_jobs
    pod = node.template.spec.template.spec
    assert node.name == "node" and pod.service_account_name == "trainer"
    assert pod.volumes[0].empty_dir.medium == "Memory"
    assert [(c.name, c.volume_mounts[0].mount_path) for c in pod.containers] == [("node", "/dev/shm")]
    assert pod.node_selector and len(pod.tolerations) == 2 and pod.image_pull_secrets[0].name == "registry"


def test_minimal_trainjob_has_no_patch(capsys: pytest.CaptureFixture[str]) -> None:
    manifest = _manifest(capsys, "--kind", "trainjob", "--image", TORCH_IMAGE, "--shm-size", "0", "--", *RUN)
    model = trainjob_model(manifest)
    assert model.spec.runtime_patches is None and model.spec.trainer.num_proc_per_node == 1
