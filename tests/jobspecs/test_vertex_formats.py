"""Every ``job vertex`` format, read back by google-cloud-aiplatform's own types (and gcloud's parsing rules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.jobspecs.helpers import (
    HVD_RS_IMAGE,
    TF_IMAGE,
    TF_RS_IMAGE,
    TORCH_IMAGE,
    custom_job,
    custom_job_spec,
    gcloud_command_job_spec,
    job,
    run_python_script,
    shell_argv,
)

pytestmark = pytest.mark.jobs

REDUCER = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
# name: (job vertex options, run args); each job is valid.
JOBS: dict[str, tuple[list[str], list[str]]] = {
    "single": (["--image", TORCH_IMAGE], ["--module", "trainers.digits_torch"]),
    "ddp-reducers-auto": (["--image", TORCH_IMAGE, "--workers", "8", "--machine-type", "a2-highgpu-8g",
                           "--reduction-servers", "auto"], ["--module", "trainers.digits_torch", "--epochs", "3"]),
    "tf-ps-evaluator": (["--image", TF_IMAGE, "--workers", "3", "--ps", "2", "--ps-machine-type", "n1-highmem-8",
                         "--evaluators", "1", "--accelerator", "NVIDIA_TESLA_T4:2", "--machine-type", "n1-standard-16"],
                        ["--module", "trainers.tabular_keras"]),
    "tf-evaluator-gap": (["--image", TF_IMAGE, "--workers", "2", "--evaluators", "1"],
                         ["--module", "trainers.flowers_keras"]),
    "horovod-a3-reducers": (["--image", HVD_RS_IMAGE, "--workers", "4", "--machine-type", "a3-highgpu-8g",
                             "--reduction-servers", "auto", "--region", "europe-west4"],
                            ["--module", "trainers.digits_horovod"]),
    "tf-v100-reducers": (["--image", TF_RS_IMAGE, "--workers", "5", "--machine-type", "n1-highmem-96",
                          "--accelerator", "NVIDIA_TESLA_V100:8", "--reduction-servers", "16"],
                         ["--module", "trainers.flowers_keras", "--strategy", "MultiWorkerMirroredStrategy"]),
    "settings": (["--image", TORCH_IMAGE, "--workers", "2", "--machine-type", "a2-highgpu-1g", "--spot",
                  "--timeout", "36h", "--restart-job-on-worker-restart", "--service-account",
                  "trainer@my-project.iam.gserviceaccount.com", "--network", "projects/12345/global/networks/vpc",
                  "--enable-web-access", "--labels", "team=ml,cost_center=a1", "--env", "HF_HOME=/tmp/hf",
                  "--boot-disk-type", "pd-standard", "--boot-disk-size", "200", "--kms-key",
                  "projects/p/locations/us-central1/keyRings/r/cryptoKeys/k", "--persistent-resource-id", "pool-1",
                  "--reservation", "any", "--base-output-dir", "gs://my-bucket/run"],
                 ["--module", "trainers.digits_torch"]),
    "flex-tensorboard": (["--image", TORCH_IMAGE, "--flex-start", "--max-wait", "2h", "--disable-retries",
                          "--tensorboard", "projects/p/locations/us-central1/tensorboards/123", "--service-account",
                          "sa@p.iam.gserviceaccount.com", "--machine-type", "g2-standard-8"],
                         ["--module", "trainers.digits_torch"]),
    "reservation-mounts": (["--image", TORCH_IMAGE, "--workers", "2", "--machine-type", "a2-highgpu-1g",
                            "--reservation", "projects/p/zones/us-central1-a/reservations/r1", "--network",
                            "projects/12345/global/networks/vpc", "--nfs-mount", "10.0.0.2:/vol1:data",
                            "--lustre-mount", "10.0.0.3:p/us-central1-a/l1:lfs:scratch", "--enable-dashboard-access"],
                           ["--module", "trainers.digits_torch"]),
    "psc-experiment-evaluator": (["--image", TF_IMAGE, "--workers", "2", "--ps", "1", "--evaluators", "1",
                                  "--machine-type",
                                  "n1-standard-8", "--accelerator", "NVIDIA_TESLA_T4:1", "--evaluator-machine-type",
                                  "n1-highmem-8", "--evaluator-boot-disk-size", "50", "--psc-network-attachment",
                                  "att1", "--psc-dns-peering", "corp.example.=host-proj/vpc1", "--experiment", "my-exp",
                                  "--experiment-run", "run-1", "--project", "my-project", "--service-account",
                                  "sa@p.iam.gserviceaccount.com", "--base-output-dir", "gs://my-bucket/tf"],
                                 ["--module", "trainers.tabular_keras"]),
    "a4-flex-start": (["--image", TORCH_IMAGE, "--workers", "2", "--machine-type", "a4-highgpu-8g", "--flex-start",
                       "--timeout", "7d"], ["--module", "trainers.digits_torch"]),
    "user-args-commas": (["--image", TORCH_IMAGE, "--workers", "2", "--display-name", "digits, tuned",
                          "--base-output-dir", "gs://my-bucket/digits"],
                         ["--module", "trainers.digits_torch", "--", "--layers=64,32", "--name", "a b", "--"]),
}


def _render(capsys: pytest.CaptureFixture[str], name: str, fmt: str) -> tuple[int, str, str]:
    options, run_args = JOBS[name]
    return job(capsys, "vertex", *options, "--format", fmt, "--", *run_args)


def _rest(capsys: pytest.CaptureFixture[str], name: str) -> dict[str, Any]:
    code, out, err = _render(capsys, name, "json")
    assert code == 0, err
    return dict(json.loads(out))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_json_is_a_custom_job_the_api_accepts(capsys: pytest.CaptureFixture[str], name: str) -> None:
    rest = _rest(capsys, name)
    parsed = custom_job(json.dumps(rest))
    options, run_args = JOBS[name]
    pools = parsed.job_spec.worker_pool_specs
    assert pools[0].replica_count == 1
    assert list(pools[0].container_spec.args) == run_args  # the run args, their own '--' included, untouched
    assert pools[0].container_spec.image_uri == options[1]
    workers = int(options[options.index("--workers") + 1]) if "--workers" in options else 1
    assert (pools[1].replica_count if len(pools) > 1 else 0) == workers - 1


def test_pool_layout(capsys: pytest.CaptureFixture[str]) -> None:
    """Pools by position: reducers in 2 on Google's image without accelerators or args; gaps are {}."""
    pools = _rest(capsys, "ddp-reducers-auto")["jobSpec"]["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 7, 25]
    assert pools[0]["machineSpec"] == {"machineType": "a2-highgpu-8g", "acceleratorType": "NVIDIA_TESLA_A100",
                                       "acceleratorCount": 8}
    assert pools[2] == {"machineSpec": {"machineType": "n1-highcpu-16"}, "replicaCount": 25,
                        "containerSpec": {"imageUri": REDUCER}}
    gap = _rest(capsys, "tf-evaluator-gap")["jobSpec"]["workerPoolSpecs"]
    assert [bool(p) for p in gap] == [True, True, False, True]
    tf = _rest(capsys, "tf-ps-evaluator")["jobSpec"]["workerPoolSpecs"]
    assert tf[2]["machineSpec"] == {"machineType": "n1-highmem-8"}  # servers get no GPUs
    assert tf[3]["machineSpec"]["acceleratorCount"] == 2
    europe = _rest(capsys, "horovod-a3-reducers")["jobSpec"]["workerPoolSpecs"][2]
    assert europe["containerSpec"]["imageUri"].startswith("europe-docker.pkg.dev/")
    assert europe["replicaCount"] == 25  # 4 x 200 Gbps general-purpose / 32, not 4 x 1000 / 32 = 125


def test_base_output_dir(capsys: pytest.CaptureFixture[str]) -> None:
    rest = _rest(capsys, "user-args-commas")
    assert rest["displayName"] == "digits, tuned"
    assert custom_job(json.dumps(rest)).job_spec.base_output_directory.output_uri_prefix == "gs://my-bucket/digits"


@pytest.mark.parametrize("name", sorted(set(JOBS) - {"tf-evaluator-gap"}))
def test_gcloud_config_is_the_json_job_spec(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = _render(capsys, name, "gcloud-config")
    assert code == 0, err
    assert out.startswith("# gcloud ") and " ai custom-jobs create " in out.splitlines()[0]
    doc = yaml.safe_load(out)
    custom_job_spec(doc)  # strict: camelCase fields of CustomJobSpec only
    assert doc == _rest(capsys, name)["jobSpec"]


def test_gcloud_config_refuses_a_skipped_pool(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _render(capsys, "tf-evaluator-gap", "gcloud-config")
    assert "workerpool2" in err and "gcloud-command" in err
    assert code == 2


@pytest.mark.parametrize("name", sorted(set(JOBS) - {"user-args-commas", "settings", "flex-tensorboard",
                                                    "reservation-mounts", "psc-experiment-evaluator",
                                                    "a4-flex-start"}))
def test_gcloud_command_builds_the_json_job_spec(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 name: str) -> None:
    """bash runs the command; what gcloud gets, split as gcloud splits it, is the JSON format's job spec."""
    code, out, err = _render(capsys, name, "gcloud-command")
    assert code == 0, err
    head, spec = gcloud_command_job_spec(shell_argv(out, tmp_path))
    assert head == ["gcloud", "ai", "custom-jobs", "create"]
    expected = _rest(capsys, name)["jobSpec"]
    if "reducers" in name:
        assert "every pool, the reducers' too" in err  # gcloud's --args reach the reducers as well
        spec["workerPoolSpecs"][2]["containerSpec"].pop("args")
    assert spec == expected
    custom_job_spec(spec)


def test_gcloud_command_keeps_commas_and_separators(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    options, run_args = JOBS["user-args-commas"]
    options = [o for o in options if not o.startswith("gs://") and o != "--base-output-dir"]
    code, out, err = job(capsys, "vertex", *options, "--format", "gcloud-command", "--", *run_args)
    assert code == 0, err
    argv = shell_argv(out, tmp_path)
    _, spec = gcloud_command_job_spec(argv)
    assert spec["workerPoolSpecs"][0]["containerSpec"]["args"] == run_args
    assert "--display-name=digits, tuned" in argv


def test_gcloud_command_has_no_base_output_dir(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _render(capsys, "user-args-commas", "gcloud-command")
    assert code == 2 and "--base-output-dir" in err


@pytest.mark.parametrize("name", sorted(JOBS))
def test_python_builds_the_same_custom_job(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                           name: str) -> None:
    """Run the script with the real SDK (credentials faked, the API call caught): it creates the JSON job, the same
    base output directory included (none without --base-output-dir, though the SDK always makes one up)."""
    code, out, err = _render(capsys, name, "python")
    assert code == 0, err
    (made,) = run_python_script(out, monkeypatch, "create_custom_job", "custom_job")
    expected = custom_job(json.dumps(_rest(capsys, name)))
    assert made.display_name == expected.display_name
    assert made.job_spec == expected.job_spec
    assert dict(made.labels) == dict(expected.labels)
    assert made.encryption_spec == expected.encryption_spec


def test_settings_are_the_apis_fields(capsys: pytest.CaptureFixture[str]) -> None:
    """Scheduling, identity, network, labels, env, disk, CMEK, reservations: read back by aiplatform_v1's types."""
    parsed = custom_job(json.dumps(_rest(capsys, "settings")))
    spec = parsed.job_spec
    assert spec.scheduling.strategy.name == "SPOT" and spec.scheduling.restart_job_on_worker_restart
    assert spec.scheduling.timeout.total_seconds() == 36 * 3600
    assert spec.service_account == "trainer@my-project.iam.gserviceaccount.com"
    assert spec.network == "projects/12345/global/networks/vpc" and spec.enable_web_access
    assert spec.persistent_resource_id == "pool-1"
    assert dict(parsed.labels) == {"team": "ml", "cost_center": "a1"}
    assert parsed.encryption_spec.kms_key_name.endswith("/cryptoKeys/k")
    for pool in spec.worker_pool_specs:
        assert [(e.name, e.value) for e in pool.container_spec.env] == [("HF_HOME", "/tmp/hf")]
        assert (pool.disk_spec.boot_disk_type, pool.disk_spec.boot_disk_size_gb) == ("pd-standard", 200)
        assert pool.machine_spec.reservation_affinity.reservation_affinity_type.name == "ANY_RESERVATION"
    flex = custom_job(json.dumps(_rest(capsys, "flex-tensorboard"))).job_spec
    assert flex.scheduling.strategy.name == "FLEX_START" and flex.scheduling.disable_retries
    assert flex.scheduling.max_wait_duration.total_seconds() == 7200
    assert flex.tensorboard.endswith("/tensorboards/123")


def test_reservations_mounts_and_dashboard_are_the_apis_fields(capsys: pytest.CaptureFixture[str]) -> None:
    """A reservation by its full name, NFS and Lustre mounts in every pool of ours, the dashboard: aiplatform_v1."""
    spec = custom_job(json.dumps(_rest(capsys, "reservation-mounts"))).job_spec
    assert spec.enable_dashboard_access
    for pool in spec.worker_pool_specs:
        affinity = pool.machine_spec.reservation_affinity
        assert (affinity.reservation_affinity_type.name, affinity.key, list(affinity.values)) == (
            "SPECIFIC_RESERVATION", "compute.googleapis.com/reservation-name",
            ["projects/p/zones/us-central1-a/reservations/r1"])
        assert [(m.server, m.path, m.mount_point) for m in pool.nfs_mounts] == [("10.0.0.2", "/vol1", "data")]
        assert [(m.instance_ip, m.volume_handle, m.filesystem, m.mount_point) for m in pool.lustre_mounts] == [
            ("10.0.0.3", "p/us-central1-a/l1", "lfs", "scratch")]


def test_psc_experiments_and_the_evaluators_machines(capsys: pytest.CaptureFixture[str]) -> None:
    """pscInterfaceConfig, experiment and experimentRun by their full names, workerpool3 on machines of its own."""
    spec = custom_job(json.dumps(_rest(capsys, "psc-experiment-evaluator"))).job_spec
    assert spec.psc_interface_config.network_attachment == "att1"
    (peering,) = spec.psc_interface_config.dns_peering_configs
    assert (peering.domain, peering.target_project, peering.target_network) == ("corp.example.", "host-proj", "vpc1")
    context = "projects/my-project/locations/us-central1/metadataStores/default/contexts/"
    assert (spec.experiment, spec.experiment_run) == (context + "my-exp", context + "my-exp-run-1")
    chief, _, evaluator = (spec.worker_pool_specs[i] for i in (0, 1, 3))
    assert (chief.machine_spec.machine_type, chief.machine_spec.accelerator_count) == ("n1-standard-8", 1)
    assert (evaluator.machine_spec.machine_type, evaluator.machine_spec.accelerator_count) == ("n1-highmem-8", 0)
    assert evaluator.disk_spec.boot_disk_size_gb == 50 and not chief.disk_spec.boot_disk_size_gb


def test_a4_boots_from_hyperdisk_under_flex_start(capsys: pytest.CaptureFixture[str]) -> None:
    """A4 boots from Hyperdisk only: its pools say so (a note tells); flex-start's 7 days are allowed."""
    code, out, err = _render(capsys, "a4-flex-start", "json")
    assert code == 0 and "a4-highgpu-8g boots from hyperdisk-balanced only" in err
    spec = custom_job(out).job_spec
    assert {p.disk_spec.boot_disk_type for p in spec.worker_pool_specs} == {"hyperdisk-balanced"}
    assert spec.scheduling.timeout.total_seconds() == 7 * 24 * 3600


def test_settings_in_gcloud_config_and_its_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The CustomJobSpec fields in the file; labels and the KMS key (CustomJob's own) as flags in its first line."""
    code, out, err = _render(capsys, "settings", "gcloud-config")
    assert code == 0, err
    doc = yaml.safe_load(out)
    custom_job_spec(doc)
    assert doc == _rest(capsys, "settings")["jobSpec"]
    first = out.splitlines()[0]
    assert "--labels=team=a1" not in first and "--labels=team=ml,cost_center=a1" in first
    assert "--kms-key=projects/p/locations/us-central1/keyRings/r/cryptoKeys/k" in first


def test_gcloud_command_refuses_what_it_has_no_flag_for(capsys: pytest.CaptureFixture[str]) -> None:
    for name, field in (("settings", "--env"), ("flex-tensorboard", "--tensorboard"),
                        ("reservation-mounts", "--nfs-mount/--lustre-mount"),
                        ("psc-experiment-evaluator", "--psc-network-attachment, --experiment"),
                        ("a4-flex-start", "(diskSpec)")):
        code, out, err = _render(capsys, name, "gcloud-command")
        assert code == 2 and out == "" and "has no flag for" in err and "--format gcloud-config" in err
        assert field in err, name


def test_gcloud_config_of_a_psc_job_uses_gcloud_beta(capsys: pytest.CaptureFixture[str]) -> None:
    """gcloud's GA messages do not know pscInterfaceConfig; beta's do."""
    code, out, _ = _render(capsys, "psc-experiment-evaluator", "gcloud-config")
    assert code == 0 and out.startswith("# gcloud beta ai custom-jobs create ")


def test_gcloud_command_identity_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Service account, network, web access, labels, persistent resource and KMS key are gcloud flags."""
    options = ["--image", TORCH_IMAGE, "--service-account", "sa@p.iam.gserviceaccount.com", "--network",
               "projects/1/global/networks/n", "--enable-web-access", "--enable-dashboard-access", "--labels", "a=b",
               "--labels", "c=d", "--persistent-resource-id", "pr", "--kms-key",
               "projects/p/locations/us-central1/keyRings/r/cryptoKeys/k"]
    code, out, err = job(capsys, "vertex", *options, "--format", "gcloud-command", "--", "--module", "m")
    assert code == 0, err
    argv = shell_argv(out, tmp_path)
    code, rest, err = job(capsys, "vertex", *options, "--", "--module", "m")
    expected = json.loads(rest)
    head, spec = gcloud_command_job_spec(argv)
    assert spec == expected["jobSpec"]
    # --persistent-resource-id is GA from gcloud 472.0.0 only; beta has it on every release that knows the field
    assert head == ["gcloud", "beta", "ai", "custom-jobs", "create"]
    assert "--labels=a=b,c=d" in argv
    assert f"--kms-key={expected['encryptionSpec']['kmsKeyName']}" in argv


def test_a3_ultra_keeps_its_own_hyperdisk_default(capsys: pytest.CaptureFixture[str]) -> None:
    """DiskSpec's default on A3 Ultra is hyperdisk-balanced: nothing is written, so gcloud-command can say the job."""
    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--machine-type", "a3-ultragpu-8g", "--",
                         "--module", "m")
    assert code == 0 and "diskSpec" not in out and "boots from" not in err
    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--machine-type", "a3-ultragpu-8g", "--format",
                         "gcloud-command", "--", "--module", "m")
    assert code == 0, err
