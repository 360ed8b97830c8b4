"""Job specs, fifth step (issue 56): each defect the audit found, written as the platform takes it or refused in one
line, read back by the platforms' own types. docs/jobs.md cites each platform's rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.jobspecs.helpers import (
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
TAS = {"kueue.x-k8s.io/podset-required-topology": "cloud.google.com/gce-topology-block"}
GROUP = {"kueue.x-k8s.io/podset-group-name": "training-gang"}
GANG = ["--topology", "required:cloud.google.com/gce-topology-block", "--label", "kueue.x-k8s.io/queue-name=q",
        "--pod-affinity", "cloud.google.com/gce-topology-subblock", "--spread", "kubernetes.io/hostname",
        "--node-affinity", "cloud.google.com/gke-nodepool=a3-pool"]


def _manifest(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, Any], str]:
    code, out, err = job(capsys, "kubeflow", *argv)
    assert code == 0, err
    return dict(yaml.safe_load(out)), err


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    return one_line_error(*job(capsys, *argv)[::2])


def _templates(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    specs = manifest["spec"].get("tfReplicaSpecs") or manifest["spec"]["pytorchReplicaSpecs"]
    return {kind: spec["template"] for kind, spec in specs.items()}


def test_cpu_servers_and_evaluator_leave_the_gpu_gangs_placement(capsys: pytest.CaptureFixture[str]) -> None:
    """A CPU ps or evaluator with the GPU gang's Kueue topology, required pod affinity and DoNotSchedule spread would
    have to fit into the GPU block: Kueue never admits the job. Placement follows the role."""
    manifest, _ = _manifest(capsys, "--kind", "tfjob", "--image", TF_IMAGE, "--name", "t", "--workers", "3", "--ps",
                            "2", "--evaluators", "1", "--gpus", "8", "--role-resources", "evaluator:gpus=0", *GANG,
                            *RUN)
    kubeflow_model(manifest)
    templates = _templates(manifest)
    for kind in ("Chief", "Worker"):
        spec = templates[kind]["spec"]
        assert templates[kind]["metadata"]["annotations"] == {**TAS, **GROUP}
        term = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["labelSelector"] == {"matchLabels": {"training.kubeflow.org/job-name": "t"}, "matchExpressions": [
            {"key": "training.kubeflow.org/replica-type", "operator": "In", "values": ["chief", "worker"]}]}
        assert spec["topologySpreadConstraints"][0]["labelSelector"] == term["labelSelector"]
        assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for kind in ("PS", "Evaluator"):
        assert "metadata" not in templates[kind] and "affinity" not in templates[kind]["spec"], kind
        assert "topologySpreadConstraints" not in templates[kind]["spec"], kind


def test_a_role_gets_its_own_placement(capsys: pytest.CaptureFixture[str]) -> None:
    manifest, _ = _manifest(capsys, "--kind", "tfjob", "--image", TF_IMAGE, "--name", "t", "--workers", "2", "--ps",
                            "2", "--gpus", "8", *GANG, "--role-topology", "ps:preferred:topology.kubernetes.io/zone",
                            "--role-pod-anti-affinity", "ps:kubernetes.io/hostname", "--role-spread", "worker:none",
                            "--role-node-affinity", "ps:cloud.google.com/machine-family=n2,c3:preferred=50", *RUN)
    kubeflow_model(manifest)
    ps, worker = _templates(manifest)["PS"], _templates(manifest)["Worker"]
    assert ps["metadata"]["annotations"] == {"kueue.x-k8s.io/podset-preferred-topology": "topology.kubernetes.io/zone"}
    anti = ps["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["labelSelector"]["matchExpressions"][0]["values"] == ["ps"]  # the servers among themselves
    (preferred,) = ps["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == {"weight": 50, "preference": {"matchExpressions": [
        {"key": "cloud.google.com/machine-family", "operator": "In", "values": ["n2", "c3"]}]}}
    assert "topologySpreadConstraints" not in worker["spec"]  # ROLE:none
    assert worker["metadata"]["annotations"] == {**TAS, **GROUP}  # the same topology as the chief's: still one group
    assert worker["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"]["matchExpressions"][0]["values"] == ["worker"]  # its placement is its own now
    line = _error(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--role-topology", "ps:none",
                  *RUN)
    assert "--role-topology" in line and "ps" in line, line


@pytest.mark.parametrize(("workers", "group"), [(4, True), (1, False)])
def test_master_and_workers_are_one_kueue_podset_group(capsys: pytest.CaptureFixture[str], workers: int,
                                                       group: bool) -> None:
    """Kueue places each PodSet in a domain of its own; podset-group-name puts two in one ("exactly 2 pod sets", one
    with a single pod, the same topology)."""
    manifest, _ = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", str(workers),
                            "--gpus", "8", *GANG, *RUN)
    kubeflow_model(manifest)
    for template in _templates(manifest).values():
        assert template["metadata"]["annotations"] == ({**TAS, **GROUP} if group else TAS)


def test_a_gpu_evaluator_with_the_gangs_topology_is_not_in_the_group(capsys: pytest.CaptureFixture[str]) -> None:
    manifest, _ = _manifest(capsys, "--kind", "tfjob", "--image", TF_IMAGE, "--workers", "3", "--evaluators", "1",
                            "--gpus", "8", *GANG, *RUN)
    templates = _templates(manifest)
    assert templates["Evaluator"]["metadata"]["annotations"] == TAS  # a third PodSet: Kueue groups exactly two
    assert templates["Chief"]["metadata"]["annotations"] == {**TAS, **GROUP}


def test_a_gpu_less_tfjobs_servers_keep_the_node_selector_and_tolerations(capsys: pytest.CaptureFixture[str]) -> None:
    manifest, _ = _manifest(capsys, "--kind", "tfjob", "--image", TF_IMAGE, "--workers", "2", "--ps", "1",
                            "--node-selector", "pool=cpu-pool", "--toleration", "dedicated=ml:NoSchedule", *RUN)
    kubeflow_model(manifest)
    ps = _templates(manifest)["PS"]["spec"]
    assert ps["nodeSelector"] == {"pool": "cpu-pool"} and ps["tolerations"][0]["key"] == "dedicated"


@pytest.mark.parametrize(("argv", "flag"), [
    (["--memory", "16Gi", "--volume", "emptydir:memory:/scratch:size=20Gi"], "--volume /scratch"),
    (["--memory", "16Gi", "--shm-size", "8Gi", "--volume", "emptydir:memory:/scratch:size=10Gi"], "--shm-size"),
    (["--memory", "16Gi", "--role-resources", "worker:memory=4Gi", "--volume", "emptydir:memory:/s:size=6Gi"],
     "worker: "),
])
def test_memory_backed_volumes_must_fit_the_memory_limit(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                         flag: str) -> None:
    line = _error(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "2", *argv, *RUN)
    assert flag in line and "memory limit" in line, line
    _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--memory", "16Gi", "--shm-size", "8Gi",
              "--volume", "emptydir:memory:/scratch:size=8Gi", *RUN)


FABRIC = ["--node-fabric", "tcpxo", "--fabric-installer-image", "i", "--rxdm-image", "r", "--gpus", "8"]


@pytest.mark.parametrize(("argv", "flag"), [
    (["--volume", "pvc:data:/usr/local/nccl-plugin"], "--volume"),
    (["--volume", "pvc:data:/dev/aperture_devices/x"], "--volume"),
    (["--env-secret", "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY=s:k"], "--env-secret"),
    (["--topology", "required:cloud.google.com/gce-topology-block", "--pod-annotation",
      "kueue.x-k8s.io/podset-preferred-topology=cloud.google.com/gce-topology-block"], "--topology/--pod-annotation"),
])
def test_what_the_fabric_or_kueue_already_set_is_not_given_twice(capsys: pytest.CaptureFixture[str],
                                                                 argv: list[str], flag: str) -> None:
    line = _error(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, *FABRIC, *argv, *RUN)
    assert line.startswith(f"entrypoint: error: {flag}"), line


def test_two_kueue_topology_annotations_are_refused_without_the_option_too(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--pod-annotation",
                  "kueue.x-k8s.io/podset-required-topology=a", "--pod-annotation",
                  "kueue.x-k8s.io/podset-unconstrained-topology=true", *RUN)
    assert "two Kueue topology annotations" in line, line


def test_a_horovod_job_on_an_image_named_otherwise_runs_as_horovod_locally(capsys: pytest.CaptureFixture[str],
                                                                           tmp_path: Path) -> None:
    from entrypoint.local.specfile import spec_pools

    image = "us-central1-docker.pkg.dev/p/r/team-trainer:v3"
    code, out, err = job(capsys, "vertex", "--image", image, "--framework", "horovod", "--workers", "2", *RUN)
    assert code == 0 and "--framework horovod" in err, err
    pools = custom_job(out).job_spec.worker_pool_specs
    assert list(pools[0].container_spec.args) == ["--framework", "horovod", "--", "--module", "trainers.x"] or \
        "horovod" in list(pools[0].container_spec.args)
    spec = tmp_path / "job.json"
    spec.write_text(out)
    emulated = spec_pools(str(spec))
    assert {dict(p.env).get("TRAINER_FRAMEWORK") for p in emulated.pools if p.start} == {"horovod"}
    code, out, err = job(capsys, "vertex", "--image", image.replace("team-trainer", "horovod"), *RUN)
    assert "--framework" not in json.loads(out)["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"]


@pytest.mark.parametrize(("runtime", "limit", "longest"), [
    ("torch-distributed-with-cache", 41, "-dataset-initializer-0"), ("torch-distributed", 48, "-node-0-3-abcde")])
def test_a_trainjobs_name_fits_every_job_of_its_runtime(capsys: pytest.CaptureFixture[str], runtime: str,
                                                        limit: int, longest: str) -> None:
    """JobSet's webhook checks every replicated job's Job name (<name>-<job>-<index>) and the node job's pod names."""
    argv = ["kubeflow", "--kind", "trainjob", "--image", TORCH_IMAGE, "--workers", "4", "--runtime", runtime]
    manifest, _ = _manifest(capsys, *argv[1:], "--name", "n" * limit, *RUN)
    trainjob_model(manifest)
    line = _error(capsys, *argv, "--name", "n" * (limit + 1), *RUN)
    assert f"<name>{longest}" in line and f"at most {limit}" in line, line
    long_image = TORCH_IMAGE.replace("pytorch:v1", "pytorch-" + "x" * 60 + ":v1")
    named, _ = _manifest(capsys, *argv[1:3], "--image", long_image, *argv[5:], "--framework", "pytorch", *RUN)
    assert len(named["metadata"]["name"]) <= limit


def test_a_local_ssd_volume_and_a_contrary_node_selector_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    volume = ["--volume", "emptydir:local-ssd:/scratch"]
    line = _error(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, *volume, "--node-selector",
                  "cloud.google.com/gke-ephemeral-storage-local-ssd=false", *RUN)
    assert "--node-selector" in line and "local-ssd" in line, line
    manifest, _ = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, *volume, "--node-selector",
                            "cloud.google.com/gke-ephemeral-storage-local-ssd=true", *RUN)
    assert _templates(manifest)["Master"]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-ephemeral-storage-local-ssd": "true"}


@pytest.mark.parametrize(("argv", "flag"), [
    (["vertex", "--image", TORCH_IMAGE, "--labels", "ǅa=x"], "--labels"),  # a titlecase letter (Lt) is no \p{Ll}
    (["vertex", "--image", TORCH_IMAGE, "--labels", "ʰa=x"], "--labels"),  # a modifier letter (Lm) neither
    (["kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--label", "a..b/x=1"], "--label"),
    (["kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--pod-label", "a.-b/x=1"], "--pod-label"),
    (["vertex", "--image", TORCH_IMAGE, "--display-name", ""], "--display-name"),
])
def test_labels_and_names_are_judged_by_the_platforms_grammar(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                              flag: str) -> None:
    line = _error(capsys, *argv, *RUN)
    assert line.startswith(f"entrypoint: error: {flag}"), line


def test_international_label_characters_the_grammar_allows_pass(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--labels", "数据=x²,команда=ⅻ", *RUN)
    assert code == 0, err
    assert custom_job(out).labels == {"数据": "x²", "команда": "ⅻ"}


@pytest.mark.parametrize(("selector", "fabric"), [
    ("cloud.google.com/gke-accelerator=nvidia-h100-mega-80gb", "tcpxo"),
    ("cloud.google.com/gke-accelerator=nvidia-h200-141gb", "gib"),
    ("node.kubernetes.io/instance-type=a4-highgpu-8g", "gib"),
    ("cloud.google.com/gke-accelerator=nvidia-b200", "gib"),
    ("node.kubernetes.io/instance-type=a3-highgpu-8g", "tcpx")])
def test_fabric_nodes_without_node_fabric_get_a_warning_naming_it(capsys: pytest.CaptureFixture[str], selector: str,
                                                                  fabric: str) -> None:
    _, err = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--gpus", "8", "--node-selector",
                       selector, *RUN)
    assert f"without --node-fabric {fabric} NCCL runs over the general-purpose NIC" in err, err
    _, err = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--gpus", "8", "--node-selector",
                       "cloud.google.com/gke-accelerator=nvidia-l4", *RUN)
    assert "--node-fabric" not in err, err
    # A required node affinity In those nodes lands there too (among others: it may); a preferred one need not.
    affinity = selector.replace("=", "=nvidia-l4,")
    _, err = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--gpus", "8", "--node-affinity",
                       affinity, *RUN)
    assert f"--node-affinity selects nodes with GPUDirect ({fabric})" in err, err
    assert f"without --node-fabric {fabric} NCCL runs over the general-purpose NIC" in err, err
    for other in (f"{affinity}:preferred", selector.replace("=", "!=")):
        _, err = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--gpus", "8", "--node-affinity",
                           other, *RUN)
        assert "GPUDirect" not in err, (other, err)
    # A TrainJob refuses --node-fabric (its runtime patch cannot add the pieces): its warning names what its runtime
    # must carry instead.
    for chosen in ("--node-selector", "--node-affinity"):
        _, err = _manifest(capsys, "--kind", "trainjob", "--image", TORCH_IMAGE, "--gpus", "8", chosen, selector,
                           *RUN)
        assert f"{chosen} selects nodes with GPUDirect ({fabric}); a TrainJob cannot take --node-fabric" in err, err
        pieces = ("the RxDM sidecar (tcpx-daemon)" if fabric == "tcpx" else
                  "the NCCL plugin installer init container")
        assert f"runtime (torch-distributed) must carry {pieces}" in err, err
        assert "networking.gke.io/interfaces" in err and f"without --node-fabric {fabric}" not in err, err
        line = _error(capsys, "kubeflow", "--kind", "trainjob", "--image", TORCH_IMAGE, "--gpus", "8", chosen,
                      selector, "--node-fabric", fabric, "--fabric-installer-image", "i", "--rxdm-image", "r", *RUN)
        assert line.startswith("entrypoint: error: --node-fabric") and f"must carry {pieces}" in line, line


def test_node_affinity_in_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    affinity = ["--node-affinity", "cloud.google.com/gke-nodepool=a,b", "--node-affinity", "!example.com/broken",
                "--node-affinity", "example.com/generation>3:preferred=20"]
    manifest, _ = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, *affinity, *RUN)
    node = kubeflow_model(manifest).spec.pytorch_replica_specs["Master"].template.spec.affinity.node_affinity
    (term,) = node.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [(e.key, e.operator, e.values) for e in term.match_expressions] == [
        ("cloud.google.com/gke-nodepool", "In", ["a", "b"]), ("example.com/broken", "DoesNotExist", None)]
    (pref,) = node.preferred_during_scheduling_ignored_during_execution
    assert (pref.weight, pref.preference.match_expressions[0].operator) == (20, "Gt")
    trainjob, _ = _manifest(capsys, "--kind", "trainjob", "--image", TORCH_IMAGE, *affinity, *RUN)
    trainjob_model(trainjob)
    for bad in ("k>x", "k=", "!k=v", "k:preferred=0"):
        assert "--node-affinity" in _error(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE,
                                           "--node-affinity", bad, *RUN)


def test_kueue_slices(capsys: pytest.CaptureFixture[str]) -> None:
    """Each slice of PODS pods in one domain of the slice's level (podset-slice-required-topology, -slice-size);
    Kueue refuses a slice larger than its PodSet, and a group beside slices."""
    slicing = ["--topology", "required:cloud.google.com/gce-topology-block", "--topology-slice",
               "cloud.google.com/gce-topology-subblock:4", "--label", "kueue.x-k8s.io/queue-name=q"]
    manifest, _ = _manifest(capsys, "--kind", "trainjob", "--image", TORCH_IMAGE, "--workers", "16", *slicing, *RUN)
    trainjob_model(manifest)
    patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["template"]["spec"]["template"]["metadata"]["annotations"] == {
        **TAS, "kueue.x-k8s.io/podset-slice-required-topology": "cloud.google.com/gce-topology-subblock",
        "kueue.x-k8s.io/podset-slice-size": "4"}
    assert "multiple" in _error(capsys, "kubeflow", "--kind", "trainjob", "--image", TORCH_IMAGE, "--workers", "10",
                                *slicing, *RUN)
    manifest, err = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "9", *slicing,
                              *RUN)
    master, worker = _templates(manifest)["Master"], _templates(manifest)["Worker"]
    assert master["metadata"]["annotations"] == TAS  # one pod: no slice of 4, and no group beside a sliced PodSet
    assert worker["metadata"]["annotations"]["kueue.x-k8s.io/podset-slice-size"] == "4"
    assert "podset-group-name beside slices" in err, err


@pytest.mark.parametrize(("volume", "expected"), [
    ("gcs:bkt:/data:file-cache=100Gi", {"gke-gcsfuse/ephemeral-storage-limit": "105Gi",
                                      "gke-gcsfuse/ephemeral-storage-request": "105Gi"}),
    ("gcs:bkt:/data:file-cache=2Gi:cache=memory", {"gke-gcsfuse/memory-limit": "2304Mi",
                                                 "gke-gcsfuse/memory-request": "2304Mi"}),
    ("gcs:bkt:/data:file-cache=-1", {"gke-gcsfuse/ephemeral-storage-limit": "0"}),
    ("gcs:bkt:/data:file-cache=100Gi:cache=local-ssd", {}),  # a pod volume of its own, bounded by its sizeLimit
])
def test_the_cloud_storage_fuse_sidecar_is_sized_for_its_file_cache(capsys: pytest.CaptureFixture[str], volume: str,
                                                                    expected: dict[str, str]) -> None:
    manifest, _ = _manifest(capsys, "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--service-account", "sa",
                            "--volume", volume, *RUN)
    annotations = _templates(manifest)["Master"]["metadata"]["annotations"]
    assert annotations == {"gke-gcsfuse/volumes": "true", **expected}
    line = _error(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--service-account", "sa",
                  "--volume", "gcs:bkt:/data:file-cache=100Gi", "--pod-annotation",
                  "gke-gcsfuse/ephemeral-storage-limit=50Gi", *RUN)
    assert "below what the file cache holds" in line, line
