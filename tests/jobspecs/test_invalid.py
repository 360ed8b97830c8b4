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


@pytest.mark.parametrize(("argv", "expected"), [
    (["--kind", "tfjob", "--image", TORCH_IMAGE, *RUN], "use --kind pytorchjob"),
    (["--kind", "pytorchjob", "--image", TF_IMAGE, *RUN], "use --kind tfjob"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "2", "--ps", "1", *RUN], "TensorFlow only"),
    (["--kind", "pytorchjob", "--image", HVD_IMAGE, "--evaluators", "1", *RUN], "TensorFlow only"),
    (["--kind", "tfjob", "--image", TF_IMAGE, "--ps", "1", *RUN], "at least one worker"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--name", "My_Job", *RUN], "DNS-1123"),
    (["--kind", "mpijob", "--image", TORCH_IMAGE, *RUN], "--kind"),
    (["--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "0", *RUN], "--workers"),
])
def test_invalid_kubeflow_job(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    code, _, err = job(capsys, "kubeflow", *argv)
    assert expected in one_line_error(code, err)


def test_a_real_process_exits_2_with_one_line() -> None:
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "job", "vertex", "--image", TORCH_IMAGE, "--ps", "1", *RUN],
                          cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
