"""What only a GPU shows (skipped without one; `bench/gpu_check.sh` runs them on a lent GPU machine)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from tests.runs import Job, entrypoint, failure_text, summary

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
RUN = ["run", "--framework", "pytorch", "--module", "tests.pytorch.faults", "--log-every", "2", "--epochs", "2",
       "--data-workers", "2"]
# The suite's jobs see no GPU (tests/conftest.py hides them with an empty CUDA_VISIBLE_DEVICES): these must see one,
# or they train on the CPU and cannot meet what they guard.
GPU = {"CUDA_VISIBLE_DEVICES": "0"}


def test_a_job_preempted_on_a_gpu_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """The checkpoint is loaded onto the GPU, its random generator states with it: they must go back to the CPU
    ("RNG state must be a torch.ByteTensor" made every GPU job's resume fail, seen on an H200)."""
    args = [*RUN, "--job-dir", str(tmp_path), "--", "--step-sleep", "0.05"]
    job = Job(*args, env=GPU)
    try:
        job.wait_for_step(10)
        os.killpg(job.proc.pid, signal.SIGTERM)
        assert job.wait(120) == 143, job.output()[-3000:]
    finally:
        job.cleanup()
    step, path = checkpoints.committed(tmp_path / "checkpoints")[-1]
    saved = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    assert "cuda" in saved["rng"][0], "the preempted job did not train on the GPU"  # its CUDA generator was saved
    proc = entrypoint(*args, env=GPU, timeout=300)
    assert proc.returncode == 0, failure_text(proc)
    assert f"resumed from {path} at step {step}" in proc.stdout
    assert summary(tmp_path / "model")["device"].startswith("cuda"), summary(tmp_path / "model")["device"]
