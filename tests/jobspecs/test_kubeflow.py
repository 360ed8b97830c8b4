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


# issue 32: volumes, labels and annotations, gang scheduling and priority, per-role resources and placement; read
# back losslessly by the training SDK's models (Kubernetes' own V1PodSpec, V1Volume, ... inside) and Trainer v2's
VOLUMES = ["--volume", "pvc:train-data:/data:ro", "--volume", "hostpath:/mnt/disks/ssd0:/scratch:type=Directory",
           "--volume", "gcs:my-bucket:/gcs:mount-options=implicit-dirs,only-dir=x", "--service-account", "trainer"]
META = ["--label", "kueue.x-k8s.io/queue-name=team-a", "--annotation", "owner=ml", "--pod-label", "app=trainer",
        "--pod-annotation", "sidecar.istio.io/inject=false"]


def test_volumes_metadata_and_gang_scheduling(capsys: pytest.CaptureFixture[str]) -> None:
    manifest = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "3", "--gpus", "2",
                         *VOLUMES, *META, "--scheduler-name", "volcano", "--priority-class", "high",
                         "--min-available", "3", "--scheduling-queue", "gpu", "--schedule-timeout", "600",
                         "--suspend", "--", *RUN)
    model = kubeflow_model(manifest)
    assert model.metadata.labels == {"kueue.x-k8s.io/queue-name": "team-a"}  # Kueue reads the job's labels
    assert model.metadata.annotations == {"owner": "ml"}
    policy = model.spec.run_policy
    assert policy.suspend is True
    sp = policy.scheduling_policy
    assert (sp.min_available, sp.queue, sp.priority_class, sp.schedule_timeout_seconds) == (3, "gpu", "high", 600)
    for replica in model.spec.pytorch_replica_specs.values():
        template = replica.template
        assert template.metadata.labels == {"app": "trainer"}
        assert template.metadata.annotations == {"gke-gcsfuse/volumes": "true", "sidecar.istio.io/inject": "false"}
        pod = template.spec
        assert (pod.scheduler_name, pod.priority_class_name, pod.service_account_name) == ("volcano", "high",
                                                                                           "trainer")
        shm, pvc, host, gcs = pod.volumes
        assert shm.empty_dir.medium == "Memory"
        assert (pvc.persistent_volume_claim.claim_name, pvc.persistent_volume_claim.read_only) == ("train-data", True)
        assert (host.host_path.path, host.host_path.type) == ("/mnt/disks/ssd0", "Directory")
        assert (gcs.csi.driver, gcs.csi.volume_attributes) == (
            "gcsfuse.csi.storage.gke.io", {"bucketName": "my-bucket", "mountOptions": "implicit-dirs,only-dir=x"})
        (container,) = pod.containers
        assert [(m.name, m.mount_path, m.read_only) for m in container.volume_mounts] == [
            ("dshm", "/dev/shm", None), (pvc.name, "/data", True), (host.name, "/scratch", None),
            (gcs.name, "/gcs", None)]


def test_parameter_servers_stay_off_the_gpu_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    """A TFJob's ps get neither GPUs nor the GPU node selector and tolerations; roles get their own resources."""
    manifest = _manifest(capsys, "--kind", "tfjob", "--image", TF_IMAGE, "--workers", "2", "--ps", "2",
                         "--evaluators", "1", "--gpus", "1", "--cpu", "8", "--memory", "32Gi",
                         "--node-selector", "cloud.google.com/gke-accelerator=nvidia-l4",
                         "--toleration", "nvidia.com/gpu=present:NoSchedule",
                         "--role-resources", "ps:cpu=4,memory=16Gi", "--role-node-selector", "ps:pool=cpu",
                         "--role-resources", "evaluator:gpus=0,memory=8Gi", "--role-toleration",
                         "evaluator:spot:NoSchedule", "--", "--module", "m")
    specs = kubeflow_model(manifest).spec.tf_replica_specs
    ps, evaluator, chief = specs["PS"].template.spec, specs["Evaluator"].template.spec, specs["Chief"].template.spec
    assert ps.node_selector == {"pool": "cpu"} and ps.tolerations is None
    assert ps.containers[0].resources.requests == {"cpu": "4", "memory": "16Gi"}
    assert ps.containers[0].resources.limits == {"memory": "16Gi"}  # no GPUs
    assert evaluator.node_selector is None  # a CPU evaluator leaves the GPU placement, as the ps do
    assert [t.key for t in evaluator.tolerations] == ["spot"]
    assert evaluator.containers[0].resources.limits == {"memory": "8Gi"}
    assert chief.containers[0].resources.limits == {"memory": "32Gi", "nvidia.com/gpu": "1"}
    assert [t.key for t in chief.tolerations] == ["nvidia.com/gpu"]


def test_headers_name_the_operator_version_the_manifest_needs(capsys: pytest.CaptureFixture[str]) -> None:
    """nprocPerNode and runPolicy.suspend came with training-operator v1.7.0; ExitCode's retries with v1.5.0."""
    code, out, _ = job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--", *RUN)
    assert code == 0 and out.startswith("# Kubeflow Training Operator v1.7.0 or later (nprocPerNode); ")
    code, out, _ = job(capsys, "kubeflow", "--kind", "tfjob", "--image", TF_IMAGE, "--suspend", "--", *RUN)
    assert code == 0 and out.startswith("# Kubeflow Training Operator v1.7.0 or later (runPolicy.suspend); ")


def test_trainjob_metadata_volumes_and_suspend(capsys: pytest.CaptureFixture[str]) -> None:
    """A TrainJob: labels, annotations, suspend its own; the pods' metadata and volumes in the runtime patch."""
    manifest = _manifest(capsys, "--kind", "trainjob", "--image", TORCH_IMAGE, *VOLUMES, *META, "--suspend",
                         "--shm-size", "0", "--", *RUN)
    model = trainjob_model(manifest)
    assert model.metadata.labels == {"kueue.x-k8s.io/queue-name": "team-a"} and model.spec.suspend is True
    (patch,) = model.spec.runtime_patches
    (node,) = patch.training_runtime_spec.template.spec.replicated_jobs
    template = node.template.spec.template
    assert template.metadata.annotations == {"gke-gcsfuse/volumes": "true", "sidecar.istio.io/inject": "false"}
    assert [v.name for v in template.spec.volumes] == ["pvc-0", "hostpath-1", "gcs-2"]
    (container,) = template.spec.containers
    assert [m.mount_path for m in container.volume_mounts] == ["/data", "/scratch", "/gcs"]
