"""Jobs the platform would refuse or run differently than written: refused here in one line, or written as meant.

Each test is one rule of the platform's (docs/jobs.md cites it): the names an operator derives from the job's, the
regions a job's resources must share, the placement a CPU replica must not inherit, the local run of a spec.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.jobspecs.helpers import (
    HVD_IMAGE,
    TF_IMAGE,
    TORCH_IMAGE,
    custom_job,
    job,
    kubeflow_model,
    one_line_error,
    trainjob_model,
)

pytestmark = pytest.mark.jobs

RUN = ["--", "--module", "trainers.x"]


def _manifest(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code, out, err = job(capsys, "kubeflow", *argv)
    assert code == 0, err
    return dict(yaml.safe_load(out))


@pytest.mark.parametrize(("argv", "longest"), [
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "2", "--name", "a" * 63], "master-0"),
    (["--kind", "tfjob", "--image", TF_IMAGE, "--workers", "2", "--evaluators", "1", "--name", "t" * 52],
     "evaluator-0"),
    (["--kind", "trainjob", "--image", TORCH_IMAGE, "--workers", "4", "--name", "n" * 49], "node-0-3"),
    (["--kind", "trainjob", "--image", TORCH_IMAGE, "--workers", "12", "--name", "n" * 48], "node-0-11"),
])
def test_names_the_operator_derives_must_fit_63(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                longest: str) -> None:
    code, _, err = job(capsys, "kubeflow", *argv, *RUN)
    line = one_line_error(code, err)
    assert "--name" in line and "at most 63" in line and f"<name>-{longest}" in line, line


@pytest.mark.parametrize(("argv", "limit"), [
    (["--kind", "pytorchjob", "--workers", "2"], 63 - len("-master-0")),
    (["--kind", "tfjob", "--workers", "2", "--evaluators", "1"], 63 - len("-evaluator-0")),
    (["--kind", "trainjob", "--workers", "4"], 48),
    (["--kind", "trainjob", "--workers", "12"], 47),
])
def test_names_at_the_limit_pass_and_default_names_fit(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                       limit: int) -> None:
    image = TF_IMAGE if "tfjob" in argv else TORCH_IMAGE
    assert _manifest(capsys, *argv, "--image", image, "--name", "b" * limit, *RUN)
    code, _, err = job(capsys, "kubeflow", *argv, "--image", image, "--name", "b" * (limit + 1), *RUN)
    one_line_error(code, err)
    long_image = TORCH_IMAGE.replace("pytorch:v1", "pytorch-" + "x" * 60 + ":v1")
    name = _manifest(capsys, *argv, "--image", long_image, "--framework", "tensorflow" if "tfjob" in argv
                     else "pytorch", *RUN)["metadata"]
    assert isinstance(name, dict) and len(name["name"]) <= limit and name["name"][0].isalpha(), name


SA = ["--service-account", "sa@p.iam.gserviceaccount.com"]


def test_a_tensorboard_in_another_region_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    board = ["--tensorboard", "projects/p/locations/europe-west4/tensorboards/1", *SA]
    line = one_line_error(*job(capsys, "vertex", "--image", TORCH_IMAGE, *board, *RUN)[::2])
    assert "--tensorboard" in line and "europe-west4" in line and "us-central1" in line, line
    code, _, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--region", "europe-west4", *board, *RUN)
    assert code == 0, err


@pytest.mark.parametrize(("image", "args", "framework"), [
    (HVD_IMAGE, ["--module", "m"], "horovod"),
    (TF_IMAGE, ["--module", "m"], "tensorflow"),
    (TORCH_IMAGE.replace("pytorch:v1", "pytorch-cpu:v1"), ["--module", "m"], "pytorch"),
    (TORCH_IMAGE, ["--framework", "horovod", "--module", "m"], "horovod"),  # the args' own, as job vertex reads it
])
def test_local_spec_runs_the_framework_of_the_spec(tmp_path: Path, image: str, args: list[str],
                                                   framework: str) -> None:
    """The image sets TRAINER_FRAMEWORK: each replica of local --spec gets it, beneath the pool's own env."""
    from entrypoint.local.specfile import spec_pools

    pool = {"machineSpec": {"machineType": "n1-standard-4"}, "containerSpec": {"imageUri": image, "args": args}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"workerPoolSpecs": [pool, {**pool, "replicaCount": 1}]}))
    local = spec_pools(str(path))
    assert [dict(p.env).get("TRAINER_FRAMEWORK") for p in local.pools] == [framework, framework]
    with_env = {**pool["containerSpec"], "env": [{"name": "TRAINER_FRAMEWORK", "value": "pytorch"}]}
    path.write_text(json.dumps({"workerPoolSpecs": [{**pool, "containerSpec": with_env}]}))
    if "--framework" not in args:  # the pool's own env is above the image's, as in the container
        assert dict(spec_pools(str(path)).pools[0].env)["TRAINER_FRAMEWORK"] == "pytorch"


def test_a_cpu_evaluator_leaves_the_gpu_placement(capsys: pytest.CaptureFixture[str]) -> None:
    """gpus=0 for the evaluator drops the GPU node selector and toleration, as for parameter servers."""
    gpu = ["--kind", "tfjob", "--image", TF_IMAGE, "--workers", "2", "--evaluators", "1", "--gpus", "1",
           "--node-selector", "cloud.google.com/gke-accelerator=nvidia-l4", "--toleration",
           "nvidia.com/gpu=present:NoSchedule"]
    specs = _manifest(capsys, *gpu, "--role-resources", "evaluator:gpus=0,cpu=4", *RUN)["spec"]["tfReplicaSpecs"]
    evaluator, worker = specs["Evaluator"]["template"]["spec"], specs["Worker"]["template"]["spec"]
    assert "nodeSelector" not in evaluator and "tolerations" not in evaluator, evaluator
    assert "nvidia.com/gpu" not in evaluator["containers"][0]["resources"].get("limits", {})
    assert worker["nodeSelector"] and worker["tolerations"]
    own = _manifest(capsys, *gpu, "--role-resources", "evaluator:gpus=0", "--role-node-selector",
                    "evaluator:pool=cpu", *RUN)["spec"]["tfReplicaSpecs"]["Evaluator"]["template"]["spec"]
    assert own["nodeSelector"] == {"pool": "cpu"} and "tolerations" not in own
    kept = _manifest(capsys, *gpu, *RUN)["spec"]["tfReplicaSpecs"]["Evaluator"]["template"]["spec"]
    assert kept["nodeSelector"] and kept["tolerations"]  # a GPU evaluator keeps the GPU placement


def test_international_labels(capsys: pytest.CaptureFixture[str]) -> None:
    """Lowercase letters of any script (a script without case counts): the API's "International characters are
    allowed"; an uppercase letter of any script is refused."""
    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--labels", "team=数据,команда=ml-1,ζ=", *RUN)
    assert code == 0, err
    assert dict(custom_job(out).labels) == {"team": "数据", "команда": "ml-1", "ζ": ""}
    for bad in ("Team=x", "team=Данные", "_team=x", "数据=" + "x" * 65):
        line = one_line_error(*job(capsys, "vertex", "--image", TORCH_IMAGE, "--labels", bad, *RUN)[::2])
        assert "--labels" in line, line


def test_gcs_mount_options_with_colons(capsys: pytest.CaptureFixture[str]) -> None:
    """GKE's Cloud Storage FUSE mount options are written file-cache:max-size-mb:-1: mount-options= takes the rest."""
    options = "implicit-dirs,file-cache:max-size-mb:-1,metadata-cache:ttl-secs:-1"
    manifest = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--service-account", "ksa",
                         "--volume", f"gcs:my-bucket:/data:ro:mount-options={options}", *RUN)
    (volume,) = [v for v in kubeflow_model(manifest).spec.pytorch_replica_specs["Master"].template.spec.volumes
                 if v.csi is not None]
    assert volume.csi.volume_attributes == {"bucketName": "my-bucket", "mountOptions": options}
    assert volume.csi.read_only is True
    for bad in ("gcs:my-bucket:/data:mount-options=a b", "pvc:claim:/data:mount-options=x"):
        line = one_line_error(*job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--volume",
                                   bad, *RUN)[::2])
        assert "mount-options" in line, line


def test_the_gcloud_config_header_keeps_a_display_name_with_a_newline(capsys: pytest.CaptureFixture[str]) -> None:
    """The header is one comment line whose --display-name, run by bash, is the json format's displayName."""
    name = "run 7\nlr=0.1 'best'"
    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--display-name", name, "--format",
                         "gcloud-config", *RUN)
    assert code == 0, err
    header = out.splitlines()[0]
    assert header.startswith("# gcloud ai custom-jobs create ") and yaml.safe_load(out)["workerPoolSpecs"]
    command = header[len("# "):].replace("--config=THIS_FILE", "")
    words = subprocess.run(["bash", "-c", f"printf '%s\\0' {command[len('gcloud ai custom-jobs create '):]}"],
                           capture_output=True, text=True, check=True).stdout.split("\0")
    assert f"--display-name={name}" in words
    assert json.loads(job(capsys, "vertex", "--image", TORCH_IMAGE, "--display-name", name, *RUN)[1])[
        "displayName"] == name


@pytest.mark.parametrize("region", ["us-centrall", "eu-west4", "us-central1-a", "US-CENTRAL1", "europe"])
def test_a_region_that_cannot_be_one_is_refused(capsys: pytest.CaptureFixture[str], region: str) -> None:
    line = one_line_error(*job(capsys, "vertex", "--image", TORCH_IMAGE, "--region", region, *RUN)[::2])
    assert line.startswith("entrypoint: error: --region: expected a Google Cloud region"), line


@pytest.mark.parametrize("region", ["us-central1", "europe-west4", "asia-southeast1", "northamerica-northeast2",
                                    "me-central2", "australia-southeast1", "africa-south1", "us-east5"])
def test_regions_pass(capsys: pytest.CaptureFixture[str], region: str) -> None:
    assert job(capsys, "vertex", "--image", TORCH_IMAGE, "--region", region, "--format", "python", *RUN)[0] == 0


@pytest.mark.parametrize(("argv", "expected"), [
    (["--memory", "32Gi", "--shm-size", "64Gi"], "above the memory limit"),
    (["--memory", "64Gi", "--memory-limit", "32Gi", "--shm-size", "48Gi"], "requests cannot exceed"),
    (["--memory", "16Gi", "--memory-limit", "32Gi", "--shm-size", "48Gi"], "above the memory limit"),
    (["--shm-size", "500m"], "fraction"),
    (["--shm-size", "0.5"], "fraction"),
    (["--memory", "64Gi", "--shm-size", "16Gi", "--role-resources", "ps:memory=8Gi"], "ps: is above the memory limit"),
])
def test_shm_size_must_fit_the_memory_limit_in_whole_bytes(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                           expected: str) -> None:
    code, _, err = job(capsys, "kubeflow", "--kind", "tfjob", "--image", TF_IMAGE, "--workers", "2", "--ps", "1",
                       *argv, *RUN)
    assert expected in one_line_error(code, err)


def test_shm_size_within_the_limit_and_per_role(capsys: pytest.CaptureFixture[str]) -> None:
    specs = _manifest(capsys, "--kind", "tfjob", "--image", TF_IMAGE, "--workers", "2", "--ps", "1", "--memory",
                      "64Gi", "--shm-size", "1.5Gi", "--role-resources", "ps:memory=8Gi,shm-size=2Gi",
                      *RUN)["spec"]["tfReplicaSpecs"]
    sizes = {k: v["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] for k, v in specs.items()}
    assert sizes == {"Chief": "1.5Gi", "Worker": "1.5Gi", "PS": "2Gi"}


def test_local_spec_says_the_shares_are_not_mounted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """nfsMounts / lustreMounts: one line names /mnt/nfs/<mountPoint> and /mnt/lustre/<mountPoint> as this machine's."""
    from entrypoint.local.specfile import spec_pools

    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--workers", "2", "--network",
                         "projects/1/global/networks/vpc", "--nfs-mount", "10.0.0.2:/exports/data:data",
                         "--lustre-mount", "10.0.0.3:lfs-handle:lfs:scratch", *RUN)
    assert code == 0, err
    (tmp_path / "spec.json").write_text(out)
    spec_pools(str(tmp_path / "spec.json"))
    lines = [line for line in capsys.readouterr().out.splitlines() if "not mounted here" in line]
    assert lines == ["[local] not mounted here: /mnt/nfs/data, /mnt/lustre/scratch (the job's NFS and Lustre "
                     "shares); the replicas read and write this machine's directories at those paths, where they "
                     "exist"], lines


def test_a_categorical_parameter_with_a_scale_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    study = ["--hypertune-metric", "accuracy", "--goal", "maximize", "--max-trials", "4"]
    for scale in ("linear", "log", "reverse-log"):
        line = one_line_error(*job(capsys, "vertex-tuning", "--image", TORCH_IMAGE, *study, "--param-categorical",
                                   f"opt=adam,sgd:{scale}", *RUN)[::2])
        assert "--param-categorical" in line and "no scale" in line, line
    code, out, err = job(capsys, "vertex-tuning", "--image", TORCH_IMAGE, *study, "--param-categorical",
                         "act=relu,x:y", *RUN)
    assert code == 0, err
    assert json.loads(out)["studySpec"]["parameters"][0]["categoricalValueSpec"]["values"] == ["relu", "x:y"]


def test_parameter_servers_have_their_own_boot_disk(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = job(capsys, "vertex", "--image", TF_IMAGE, "--workers", "2", "--ps", "2", "--boot-disk-size",
                         "150", "--ps-boot-disk-type", "pd-standard", "--ps-boot-disk-size", "500", *RUN)
    assert code == 0, err
    pools = custom_job(out).job_spec.worker_pool_specs
    assert [(p.disk_spec.boot_disk_type, p.disk_spec.boot_disk_size_gb) for p in pools] == [
        ("", 150), ("", 150), ("pd-standard", 500)]
    for argv in (["--ps-boot-disk-size", "100"], ["--ps", "1", "--ps-boot-disk-size", "0"]):
        line = one_line_error(*job(capsys, "vertex", "--image", TF_IMAGE, "--workers", "2", *argv, *RUN)[::2])
        assert "--ps-boot-disk" in line, line


def test_scratch_volumes_and_the_gcs_file_cache(capsys: pytest.CaptureFixture[str]) -> None:
    """emptydir on memory or Local SSD (the pods then select Local SSD nodes); a bucket's file cache, on its own
    gke-gcsfuse-cache volume; read back by the training SDK's and Trainer's models."""
    volumes = ["--volume", "emptydir:local-ssd:/scratch:size=375Gi", "--volume", "emptydir:memory:/fast:size=8Gi",
               "--volume", "gcs:my-bucket:/data:ro:file-cache=200Gi:cache=memory:mount-options=implicit-dirs",
               "--service-account", "ksa", "--node-selector", "pool=a3"]
    manifest = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "2", *volumes, *RUN)
    pod = kubeflow_model(manifest).spec.pytorch_replica_specs["Worker"].template.spec
    assert pod.node_selector == {"pool": "a3", "cloud.google.com/gke-ephemeral-storage-local-ssd": "true"}
    by_name = {v.name: v for v in pod.volumes}
    assert by_name["emptydir-0"].empty_dir.size_limit == "375Gi" and by_name["emptydir-0"].empty_dir.medium is None
    assert (by_name["emptydir-1"].empty_dir.medium, by_name["emptydir-1"].empty_dir.size_limit) == ("Memory", "8Gi")
    assert by_name["gcs-2"].csi.volume_attributes == {"bucketName": "my-bucket", "mountOptions": "implicit-dirs",
                                                       "fileCacheCapacity": "200Gi"}
    assert by_name["gke-gcsfuse-cache"].empty_dir.medium == "Memory"
    assert [m.mount_path for m in pod.containers[0].volume_mounts] == ["/dev/shm", "/scratch", "/fast", "/data"]
    trainjob = _manifest(capsys, "--kind", "trainjob", "--image", TORCH_IMAGE, *volumes, *RUN)
    trainjob_model(trainjob)
    (patch,) = trainjob["spec"]["runtimePatches"]
    pod_patch = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"]
    assert pod_patch["nodeSelector"]["cloud.google.com/gke-ephemeral-storage-local-ssd"] == "true"


@pytest.mark.parametrize(("volume", "expected"), [
    ("emptydir:ssd:/scratch", "the medium is one of"),
    ("emptydir:memory:/scratch:ro", "not an option here"),
    ("emptydir:memory:/scratch:size=1.5x", "not an option here"),
    ("gcs:my-bucket:/data:cache=memory", "off until :file-cache"),
    ("gcs:my-bucket:/data:file-cache=10Gi:cache=disk", "not an option here"),
])
def test_invalid_scratch_and_cache_volumes(capsys: pytest.CaptureFixture[str], volume: str, expected: str) -> None:
    line = one_line_error(*job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--volume",
                               volume, *RUN)[::2])
    assert expected in line, line


PLACEMENT = ["--topology", "required:cloud.google.com/gce-topology-block", "--pod-anti-affinity",
             "kubernetes.io/hostname", "--pod-affinity", "cloud.google.com/gce-topology-subblock:preferred",
             "--label", "kueue.x-k8s.io/queue-name=a3-queue"]


def test_gang_placement_in_a_pytorchjob(capsys: pytest.CaptureFixture[str]) -> None:
    """A 16-node A3 gang: Kueue's topology annotation on every replica type, Master and Worker one PodSet group (one
    domain), the job's pods selected by training-operator's job-name label for anti-affinity, affinity and spread;
    read back by the training SDK."""
    code, out, err = job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--name", "gang",
                         "--workers", "16", "--gpus", "8", *PLACEMENT, "--spread", "topology.kubernetes.io/zone:2",
                         *RUN)
    assert code == 0 and "warning" not in err, err
    replicas = kubeflow_model(yaml.safe_load(out)).spec.pytorch_replica_specs
    for replica in replicas.values():
        template = replica.template
        assert template.metadata.annotations == {
            "kueue.x-k8s.io/podset-required-topology": "cloud.google.com/gce-topology-block",
            "kueue.x-k8s.io/podset-group-name": "training-gang"}
        anti = template.spec.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution
        assert [(t.topology_key, t.label_selector.match_labels) for t in anti] == [
            ("kubernetes.io/hostname", {"training.kubeflow.org/job-name": "gang"})]
        (near,) = template.spec.affinity.pod_affinity.preferred_during_scheduling_ignored_during_execution
        assert (near.weight, near.pod_affinity_term.topology_key) == (100, "cloud.google.com/gce-topology-subblock")
        (spread,) = template.spec.topology_spread_constraints
        assert (spread.max_skew, spread.topology_key, spread.when_unsatisfiable) == (
            2, "topology.kubernetes.io/zone", "DoNotSchedule")


def test_gang_placement_in_a_trainjob(capsys: pytest.CaptureFixture[str]) -> None:
    """A TrainJob's nodes are one PodSet: the annotation and the affinity go into the runtime patch, selecting the
    JobSet's pods; topology spread has no field in Trainer's PodSpecPatch and is refused."""
    manifest = _manifest(capsys, "--kind", "trainjob", "--image", TORCH_IMAGE, "--name", "gang", "--workers", "16",
                         "--gpus", "8", *PLACEMENT, *RUN)
    trainjob_model(manifest)
    (patch,) = manifest["spec"]["runtimePatches"]
    template = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": "cloud.google.com/gce-topology-block"}
    anti = template["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["labelSelector"] == {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "gang"}}
    line = one_line_error(*job(capsys, "kubeflow", "--kind", "trainjob", "--image", TORCH_IMAGE, "--spread",
                               "kubernetes.io/hostname", *RUN)[::2])
    assert "--spread" in line and "PodSpecPatch" in line, line


@pytest.mark.parametrize(("argv", "expected"), [
    (["--topology", "block"], "required:NODE_LABEL"),
    (["--topology", "exact:cloud.google.com/gce-topology-block"], "required:NODE_LABEL"),
    (["--topology", "required:not a label"], "node label key"),
    (["--spread", "kubernetes.io/hostname:0"], "MAX_SKEW >= 1"),
    (["--spread", "kubernetes.io/hostname:1:Never"], "DoNotSchedule|ScheduleAnyway"),
    (["--spread", "a", "--spread", "a:2"], "one constraint per topology key"),
    (["--pod-affinity", "kubernetes.io/hostname", "--pod-anti-affinity", "kubernetes.io/hostname"],
     "no second pod"),
])
def test_invalid_placement(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    line = one_line_error(*job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, *argv, *RUN)[::2])
    assert expected in line, line


def test_topology_without_a_kueue_queue_warns(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--topology",
                       "preferred:cloud.google.com/gce-topology-block", *RUN)
    assert code == 0 and "give --label kueue.x-k8s.io/queue-name=QUEUE" in err, err
