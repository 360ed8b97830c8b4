"""Invalid combinations: one line naming the problem (never an argument's value), exit code 2."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.jobspecs.helpers import HVD_IMAGE, TF_IMAGE, TORCH_IMAGE, job, one_line_error

pytestmark = pytest.mark.jobs

GPU = ["--accelerator", "NVIDIA_TESLA_T4:1"]
RUN = ["--", "--module", "trainers.x"]
# name: (job vertex arguments, what the error line must say)
INVALID: dict[str, tuple[list[str], str]] = {
    "no workers": (["--image", TORCH_IMAGE, "--workers", "0", *RUN], "exactly one"),
    "reducers without GPUs": (["--image", TORCH_IMAGE, "--workers", "2", "--reduction-servers", "2", *RUN],
                              "needs GPU training pools"),
    "reducers with ps": (["--image", TF_IMAGE, "--workers", "2", "--ps", "1", "--reduction-servers", "2", *GPU, *RUN],
                         "ParameterServerStrategy"),
    "reducers with forced ps strategy": (["--image", TF_IMAGE, "--workers", "2", "--reduction-servers", "2", *GPU,
                                          "--", "--module", "m", "--strategy", "ParameterServerStrategy"],
                                         "ParameterServerStrategy"),
    "reducers on GPU machines": (["--image", TORCH_IMAGE, "--workers", "2", "--reduction-servers", "2", *GPU,
                                  "--reduction-server-machine-type", "g2-standard-4", *RUN], "no accelerators"),
    "reducers for one VM": (["--image", TORCH_IMAGE, "--reduction-servers", "2", *GPU, *RUN], "at least 2"),
    "reducers auto, bandwidth unknown": (["--image", TORCH_IMAGE, "--workers", "2", "--reduction-servers", "auto",
                                          *GPU, *RUN], "no documented bandwidth"),
    "reducers count": (["--image", TORCH_IMAGE, "--workers", "2", "--reduction-servers", "many", *GPU, *RUN],
                       "--reduction-servers"),
    "ps for pytorch": (["--image", TORCH_IMAGE, "--workers", "2", "--ps", "1", *RUN], "TensorFlow only"),
    "ps for horovod": (["--image", HVD_IMAGE, "--workers", "2", "--ps", "1", *RUN], "TensorFlow only"),
    "ps without workers": (["--image", TF_IMAGE, "--ps", "1", *RUN], "at least one worker"),
    "evaluators for pytorch": (["--image", TORCH_IMAGE, "--evaluators", "1", *RUN], "TensorFlow only"),
    "T4 count on N1": (["--image", TORCH_IMAGE, "--machine-type", "n1-standard-8", "--accelerator",
                        "NVIDIA_TESLA_T4:3", *RUN], "use 1, 2, 4"),
    "A100 count on A2": (["--image", TORCH_IMAGE, "--machine-type", "a2-highgpu-8g", "--accelerator",
                          "NVIDIA_TESLA_A100:4", *RUN], "exactly 8"),
    "L4 on N1": (["--image", TORCH_IMAGE, "--accelerator", "NVIDIA_L4:1", *RUN], "does not attach to N1"),
    "GPU on E2": (["--image", TORCH_IMAGE, "--machine-type", "e2-standard-8", *GPU, *RUN], "takes no GPUs"),
    "unknown accelerator": (["--image", TORCH_IMAGE, "--accelerator", "NVIDIA_GTX_1080:1", *RUN],
                            "unknown accelerator type"),
    "accelerator syntax": (["--image", TORCH_IMAGE, "--accelerator", "T4", *RUN], "TYPE:COUNT"),
    "framework unknown": (["--image", "gcr.io/p/my-trainer:v1", *RUN], "--framework"),
    "framework contradicts run": (["--image", TORCH_IMAGE, "--framework", "tensorflow", "--", "--framework",
                                   "pytorch"], "--framework"),
    "output dir not on GCS": (["--image", TORCH_IMAGE, "--base-output-dir", "/tmp/out", *RUN], "gs://"),
    "unknown option": (["--image", TORCH_IMAGE, "--replicas=3", *RUN], "--replicas"),
    # GPUs our CUDA 13 images cannot use (docs/images.md); K80 is past its end of support
    "V100 with pytorch": (["--image", TORCH_IMAGE, "--machine-type", "n1-standard-8", "--accelerator",
                           "NVIDIA_TESLA_V100:1", *RUN], "cannot run CUDA 13"),
    "P100 with horovod": (["--image", HVD_IMAGE, "--accelerator", "NVIDIA_TESLA_P100:1", *RUN], "cannot run CUDA 13"),
    "P4 with pytorch": (["--image", TORCH_IMAGE, "--accelerator", "NVIDIA_TESLA_P4:1", *RUN], "cannot run CUDA 13"),
    "K80": (["--image", TF_IMAGE, "--accelerator", "NVIDIA_TESLA_K80:1", *RUN], "end of support"),
    # machines
    "unknown A2 type": (["--image", TORCH_IMAGE, "--machine-type", "a2-highgpu-3g", *RUN], "unknown A2 machine type"),
    "unknown N1 type": (["--image", TORCH_IMAGE, "--machine-type", "n1-standard-3", *RUN], "unknown N1 machine type"),
    "TPU on N1": (["--image", TORCH_IMAGE, "--accelerator", "TPU_V3:8", *RUN], "no TPU runtime"),
    "TPU machine": (["--image", TORCH_IMAGE, "--machine-type", "cloud-tpu", *RUN], "no TPU runtime"),
    "gcloud's accelerator spelling": (["--image", TORCH_IMAGE, "--accelerator", "nvidia-tesla-t4:1", *RUN],
                                      "did you mean NVIDIA_TESLA_T4?"),
    # small error texts
    "framework choices": (["--image", "gcr.io/p/my-trainer:v1", *RUN], "--framework pytorch|"),
    "run option type": (["--image", TORCH_IMAGE, "--", "--module", "m", "--epochs", "x"],
                        "--epochs: expects a whole number >= 1"),
    "our option type": (["--image", TORCH_IMAGE, "--workers", "three", *RUN], "--workers: expects a whole number"),
    # scheduling, identity, network, resources
    "max-wait without flex-start": (["--image", TORCH_IMAGE, "--max-wait", "1h", *RUN], "give --flex-start"),
    "spot and flex-start": (["--image", TORCH_IMAGE, "--spot", "--flex-start", *RUN], "not allowed with"),
    "retries both ways": (["--image", TORCH_IMAGE, "--disable-retries", "--restart-job-on-worker-restart", *RUN],
                          "give one"),
    "timeout": (["--image", TORCH_IMAGE, "--timeout", "soon", *RUN], "expected a duration"),
    "network by project id": (["--image", TORCH_IMAGE, "--network", "projects/my-project/global/networks/n", *RUN],
                              "project number"),
    "ip range without network": (["--image", TORCH_IMAGE, "--reserved-ip-range", "r", *RUN], "give --network"),
    "tensorboard without sa": (["--image", TORCH_IMAGE, "--tensorboard", "projects/p/locations/l/tensorboards/1",
                                *RUN], "needs --service-account"),
    "service account": (["--image", TORCH_IMAGE, "--service-account", "me", *RUN], "service account e-mail"),
    "kms key region": (["--image", TORCH_IMAGE, "--kms-key", "projects/p/locations/europe-west4/keyRings/r/"
                        "cryptoKeys/k", *RUN], "must be in the job's region"),
    "label case": (["--image", TORCH_IMAGE, "--labels", "Team=ml", *RUN], "lowercase"),
    "label twice": (["--image", TORCH_IMAGE, "--labels", "a=1", "--labels", "a=2", *RUN], "more than once"),
    "env set by vertex": (["--image", TORCH_IMAGE, "--env", "AIP_MODEL_DIR=/x", *RUN], "set by the platform"),
    "env name": (["--image", TORCH_IMAGE, "--env", "1X=y", *RUN], "not an environment variable name"),
    "reservation": (["--image", TORCH_IMAGE, "--reservation", "Big Reservation", *RUN], "--reservation"),
    "persistent resource": (["--image", TORCH_IMAGE, "--persistent-resource-id", "Pool_1", *RUN], "lowercase"),
    "python has no ip ranges": (["--image", TORCH_IMAGE, "--network", "projects/1/global/networks/n",
                                 "--reserved-ip-range", "r", "--format", "python", *RUN], "no reserved IP ranges"),
    # what the framework's planner refuses at run time, in each pool (jobs/planned.py)
    "single-node strategy on two nodes": (["--image", TF_IMAGE, "--workers", "2", "--", "--module", "m",
                                           "--strategy", "MirroredStrategy"],
                                          "workerpool0 (the chief) at run time: --strategy: MirroredStrategy is "
                                          "single-node but there are 2 training nodes"),
    "another framework's flag": (["--image", TORCH_IMAGE, "--", "--module", "m", "--fusion-threshold", "64"],
                                 "--fusion-threshold: is a horovod option and this job runs pytorch"),
    "tensorflow processes per node": (["--image", TF_IMAGE, "--", "--module", "m", "--nproc-per-node", "2"],
                                      "TensorFlow runs one process per node"),
    "nonfinite skip with keras": (["--image", TF_IMAGE, "--", "--module", "m", "--on-nonfinite", "skip"],
                                  "--on-nonfinite: skip needs the PyTorch or Horovod hooks loop"),
    "env makes a torchrun process": (["--image", TORCH_IMAGE, "--env", "LOCAL_RANK=0", "--env", "GROUP_RANK=0",
                                      *RUN], "workerpool0 (the chief) at run time"),
    "bad restart count in env": (["--image", TORCH_IMAGE, "--env", "TRAINER_RESTART_COUNT=x", *RUN],
                                 "TRAINER_RESTART_COUNT: must be a whole number"),
    # issue 32: what the platform refuses (docs/jobs.md, "What is refused", with each rule's source)
    "flex-start on T4": (["--image", TORCH_IMAGE, "--flex-start", *GPU, *RUN],
                         "--flex-start (scheduling.strategy FLEX_START): it provisions L4, A100, H100, H200 and B200"),
    "flex-start without GPUs": (["--image", TORCH_IMAGE, "--flex-start", *RUN], "provisions GPU machines only"),
    "flex-start over 7 days": (["--image", TORCH_IMAGE, "--flex-start", "--machine-type", "g2-standard-8",
                                "--timeout", "8d", *RUN], "timeout may be at most 7 days"),
    "flex-start with reducers": (["--image", HVD_IMAGE, "--flex-start", "--workers", "2", "--machine-type",
                                  "g2-standard-8", "--reduction-servers", "1", *RUN],
                                 "same machine configuration in every pool, and workerpool2 is a Reduction Server"),
    "flex-start with other ps machines": (["--image", TF_IMAGE, "--flex-start", "--workers", "2", "--ps", "1",
                                           "--machine-type", "a2-highgpu-1g", "--ps-machine-type", "n1-highmem-8",
                                           *RUN], "workerpool2 is n1-highmem-8"),
    "flex-start with other evaluator machines": (["--image", TF_IMAGE, "--flex-start", "--workers", "2",
                                                  "--evaluators", "1", "--ps", "1", "--machine-type", "g2-standard-8",
                                                  "--ps-machine-type", "g2-standard-8", "--evaluator-machine-type",
                                                  "g2-standard-4", *RUN], "workerpool3 is g2-standard-4"),
    "flex-start with a reservation": (["--image", TORCH_IMAGE, "--flex-start", "--machine-type", "g2-standard-8",
                                       "--reservation", "projects/p/zones/us-central1-a/reservations/r", *RUN],
                                      "--flex-start VMs cannot consume a reservation"),
    "spot with a reservation": (["--image", TORCH_IMAGE, "--spot", "--reservation",
                                 "projects/p/zones/us-central1-a/reservations/r", *RUN],
                                "--spot VMs cannot consume a reservation"),
    "reservation by its short name": (["--image", TORCH_IMAGE, "--reservation", "my-reservation", *RUN],
                                      "the API takes the full resource name"),
    "reservation in another region": (["--image", TORCH_IMAGE, "--reservation",
                                       "projects/p/zones/europe-west4-a/reservations/r", *RUN],
                                      "must be in the job's region"),
    "A3 Ultra on pd-ssd": (["--image", TORCH_IMAGE, "--machine-type", "a3-ultragpu-8g", "--boot-disk-type", "pd-ssd",
                            *RUN], "boots from Hyperdisk only"),
    "A4 on pd-standard": (["--image", TORCH_IMAGE, "--machine-type", "a4-highgpu-8g", "--boot-disk-type",
                           "pd-standard", *RUN], "boots from Hyperdisk only"),
    "A4 evaluator on pd-ssd": (["--image", TF_IMAGE, "--workers", "2", "--ps", "1", "--evaluators", "1",
                                "--evaluator-machine-type", "a4-highgpu-8g", "--evaluator-boot-disk-type", "pd-ssd",
                                *RUN], "workerpool3 boot disk"),
    "N1 on Hyperdisk": (["--image", TORCH_IMAGE, "--boot-disk-type", "hyperdisk-balanced", *RUN],
                        "N1 takes no Hyperdisk"),
    "N1 vCPUs for one V100": (["--image", TF_IMAGE, "--machine-type", "n1-standard-16", "--accelerator",
                               "NVIDIA_TESLA_V100:1", *RUN], "1 x NVIDIA_TESLA_V100 allows at most 12 vCPUs"),
    "N1 memory for one V100": (["--image", TF_IMAGE, "--machine-type", "custom-12-81920", "--accelerator",
                                "NVIDIA_TESLA_V100:1", *RUN], "at most 78 GB of memory"),
    "N1 vCPUs for one T4": (["--image", TORCH_IMAGE, "--machine-type", "n1-standard-64", *GPU, *RUN],
                            "at most 48 vCPUs"),
    "A4X machine": (["--image", TORCH_IMAGE, "--machine-type", "a4x-highgpu-4g", *RUN], "Arm (NVIDIA Grace)"),
    "GB200": (["--image", TORCH_IMAGE, "--machine-type", "a4-highgpu-8g", "--accelerator", "NVIDIA_GB200:4", *RUN],
              "our images are built for x86-64"),
    "too many env values": (["--image", TORCH_IMAGE, *(f for i in range(101) for f in ("--env", f"V{i}=1")), *RUN],
                            "--env: 101 variables: a container takes at most 100"),
    # issue 32: the new options, malformed or contradictory
    "nfs without a network": (["--image", TORCH_IMAGE, "--nfs-mount", "10.0.0.2:/vol:data", *RUN],
                              "give --network (VPC peering) or --psc-network-attachment"),
    "nfs on a public address": (["--image", TORCH_IMAGE, "--network", "projects/1/global/networks/n", "--nfs-mount",
                                 "8.8.8.8:/vol:data", *RUN], "private address"),
    "nfs mount point": (["--image", TORCH_IMAGE, "--network", "projects/1/global/networks/n", "--nfs-mount",
                         "10.0.0.2:/vol:/mnt/data", *RUN], "MOUNT_POINT is a directory name"),
    "lustre syntax": (["--image", TORCH_IMAGE, "--lustre-mount", "10.0.0.3:lfs:scratch", *RUN],
                      "IP:VOLUME_HANDLE:FILESYSTEM:MOUNT_POINT"),
    "dns peering without psc": (["--image", TORCH_IMAGE, "--psc-dns-peering", "corp.=p/n", *RUN],
                                "give --psc-network-attachment"),
    "dns peering domain": (["--image", TORCH_IMAGE, "--psc-network-attachment", "a", "--psc-dns-peering",
                            "corp.example=p/n", *RUN], "ending with a dot"),
    "psc attachment region": (["--image", TORCH_IMAGE, "--psc-network-attachment",
                               "projects/p/regions/europe-west4/networkAttachments/a", *RUN], "serves its own region"),
    "experiment without project": (["--image", TORCH_IMAGE, "--experiment", "e", "--service-account",
                                    "sa@p.iam.gserviceaccount.com", *RUN], "give --project"),
    "experiment and tensorboard": (["--image", TORCH_IMAGE, "--experiment", "e", "--project", "p",
                                    "--service-account", "sa@p.iam.gserviceaccount.com", "--tensorboard",
                                    "projects/p/locations/us-central1/tensorboards/1", *RUN], "not with --tensorboard"),
    "experiment without service account": (["--image", TORCH_IMAGE, "--experiment", "e", "--project", "p", *RUN],
                                           "needs --service-account"),
    "experiment run alone": (["--image", TORCH_IMAGE, "--experiment-run", "r", *RUN], "give --experiment"),
    "evaluator machines without evaluators": (["--image", TF_IMAGE, "--evaluator-machine-type", "n1-standard-4",
                                               *RUN], "give --evaluators"),
    "evaluator accelerator": (["--image", TF_IMAGE, "--workers", "2", "--ps", "1", "--evaluators", "1",
                               "--evaluator-accelerator", "T4", *RUN], "--evaluator-accelerator: expected TYPE:COUNT"),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_vertex_job(capsys: pytest.CaptureFixture[str], name: str) -> None:
    argv, expected = INVALID[name]
    code, out, err = job(capsys, "vertex", *argv)
    assert expected in one_line_error(code, err)
    assert out == ""


def test_values_are_never_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    """A run option run does not know, or a bad value, is named without its value (it may be a secret)."""
    for run_args in (["--module", "m", "--api-key=s3cr3t-value"], ["--module", "m", "--epochs", "s3cr3t-value"],
                     ["--module", "m", "--strategy", "s3cr3t-value"]):
        code, _, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--", *run_args)
        line = one_line_error(code, err)
        assert "s3cr3t" not in line and "run args" in line


def test_undersized_reducers_warn(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--workers", "8", "--machine-type",
                         "a2-megagpu-16g", "--reduction-servers", "10", *RUN)
    assert code == 0 and out
    assert "entrypoint: warning: 10 reducers give 320 Gbps" in err and "25 would match" in err
    assert "carries the Reduction Server NCCL plugin" in err and "billed and idle" in err  # pytorch:v1, not -rs


@pytest.mark.parametrize(("argv", "expected"), [
    (["--machine-type", "n2-custom-8-16384"], "custom machine type (8 vCPUs, 16384 MB)"),
    (["--machine-type", "z9-standard-8"], "not in this tool's machine tables"),
    (["--machine-type", "g2-standard-8", "--image", TORCH_IMAGE.replace("pytorch:", "pytorch-cpu:")],
     "is a CPU image; the NVIDIA_L4 GPUs would sit idle"),
    (["--env", "WANDB_API_KEY=s3cr3t-value"], "WANDB_API_KEY: looks like a secret"),
])
def test_warnings(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    options = argv if "--image" in argv else ["--image", TORCH_IMAGE, *argv]
    code, out, err = job(capsys, "vertex", *options, *RUN)
    assert code == 0 and out and expected in err and "s3cr3t" not in err


def test_values_in_kubeflow_errors_are_never_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--env", "HF_TOKEN=s3cr3t-value"], ["--env-secret", "TOKEN=s3cr3t-value"]):
        code, _, err = job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, *argv, *RUN)
        assert "s3cr3t" not in one_line_error(code, err)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--kind", "tfjob", "--image", TORCH_IMAGE, *RUN], "use --kind pytorchjob"),
    (["--kind", "pytorchjob", "--image", TF_IMAGE, *RUN], "use --kind tfjob"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "2", "--ps", "1", *RUN], "TensorFlow only"),
    (["--kind", "pytorchjob", "--image", HVD_IMAGE, "--evaluators", "1", *RUN], "TensorFlow only"),
    (["--kind", "tfjob", "--image", TF_IMAGE, "--ps", "1", *RUN], "at least one worker"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--name", "My_Job", *RUN], "DNS-1035"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--name", "2024-run", *RUN], "DNS-1035"),
    (["--kind", "trainjob", "--image", TF_IMAGE, *RUN], "no TensorFlow runtime"),
    (["--kind", "trainjob", "--image", TORCH_IMAGE, "--runtime", "Torch_Distributed", *RUN], "--runtime"),
    (["--kind", "tfjob", "--image", TF_IMAGE, "--namespace", "ML", *RUN], "--namespace"),
    (["--kind", "trainjob", "--image", TORCH_IMAGE, "--backoff-limit", "2", *RUN], "a TrainJob has no such field"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--env", "HF_TOKEN=s3cr3t-value", *RUN], "--env-secret"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--env", "PET_NNODES=3", *RUN], "set by the operator"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--memory", "lots", *RUN], "Kubernetes quantity"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--toleration", "gpu=yes", *RUN], "KEY[=VALUE]:EFFECT"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--env-secret", "TOKEN=s3cr3t-value", *RUN], "SECRET:KEY"),
    (["--kind", "mpijob", "--image", TORCH_IMAGE, *RUN], "--kind"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "0", *RUN], "--workers"),
    # planned per replica type, with the operator's variables
    (["--kind", "tfjob", "--image", TF_IMAGE, "--workers", "2", "--ps", "1", "--", "--module", "m", "--strategy",
      "MultiWorkerMirroredStrategy"], "PS at run time: this replica is in the server pool"),
    (["--kind", "tfjob", "--image", TF_IMAGE, "--workers", "2", "--", "--module", "m", "--strategy",
      "OneDeviceStrategy"], "Chief at run time: --strategy: OneDeviceStrategy is single-node"),
    (["--kind", "trainjob", "--image", HVD_IMAGE, "--", "--module", "m", "--recovery", "restart"],
     "node 0 at run time: --recovery: is a pytorch option and this job runs horovod"),
    # issue 32: requests above limits are refused by the API server
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--memory", "64Gi", "--memory-limit", "32Gi", *RUN],
     "--memory/--memory-limit: the memory request is above its limit"),
    (["--kind", "tfjob", "--image", TF_IMAGE, "--cpu", "8", "--cpu-limit", "4000m", *RUN], "cpu request is above"),
    (["--kind", "tfjob", "--image", TF_IMAGE, "--workers", "2", "--ps", "1", "--memory-limit", "8Gi",
      "--role-resources", "ps:memory=16Gi", *RUN], "ps: the memory request is above its limit"),
    # the new options, malformed or contradictory
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--volume", "nfs:server:/data", *RUN], "expected pvc:CLAIM"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--volume", "gcs:gs://b:/data", *RUN], "no gs://"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--volume", "pvc:data:/dev/shm", *RUN], "at /dev/shm"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--volume", "pvc:data:/d:type=File", *RUN], "not an option"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--label", "Bad Key=x", *RUN], "--label"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--pod-label", "team=a b", *RUN], "a label value"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "2", "--min-available", "3", *RUN],
     "the gang would never start"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--role-resources", "ps:cpu=1", *RUN],
     "ps: not a replica type of this kind"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--role-resources", "worker:gpus=2", *RUN],
     "GPUs are one count for every training replica"),
    (["--kind", "tfjob", "--image", TF_IMAGE, "--role-node-selector", "chief:a", *RUN], "KEY=VALUE"),
    (["--kind", "trainjob", "--image", TORCH_IMAGE, "--scheduler-name", "volcano", *RUN],
     "a TrainJob's runtime patch cannot set it"),
    (["--kind", "trainjob", "--image", TORCH_IMAGE, "--min-available", "1", *RUN], "a TrainJob has no such field"),
    (["--kind", "trainjob", "--image", TORCH_IMAGE, "--role-resources", "worker:cpu=1", *RUN],
     "one replica type"),
])
def test_invalid_kubeflow_job(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    code, _, err = job(capsys, "kubeflow", *argv)
    assert expected in one_line_error(code, err)


def test_a_real_process_exits_2_with_one_line() -> None:
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "job", "vertex", "--image", TORCH_IMAGE, "--ps", "1", *RUN],
                          cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("argv", "expected"), [
    (["vertex", "--image", TORCH_IMAGE, "--framework"], "(choose --framework pytorch|tensorflow|horovod|jax)"),
    (["kubeflow", "--image", TORCH_IMAGE], "(choose --kind pytorchjob|tfjob|trainjob)"),
])
def test_a_missing_choice_lists_the_choices(capsys: pytest.CaptureFixture[str], argv: list[str],
                                            expected: str) -> None:
    code, _, err = job(capsys, *argv, *RUN)
    assert expected in one_line_error(code, err)


@pytest.mark.parametrize("machine", ["a3-ultragpu-8g", "a4-highgpu-8g"])
def test_reducers_on_rdma_machines_warn(capsys: pytest.CaptureFixture[str], machine: str) -> None:
    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--workers", "2", "--machine-type", machine,
                         "--reduction-servers", "2", *RUN)
    assert code == 0 and out
    assert f"entrypoint: warning: {machine}: reducers move the all-reduce off its RDMA NICs" in err
    code, out, err = job(capsys, "vertex", "--image", TORCH_IMAGE, "--workers", "2", "--machine-type",
                         "a3-megagpu-8g", "--reduction-servers", "2", *RUN)
    assert code == 0 and "RDMA NICs" not in err
