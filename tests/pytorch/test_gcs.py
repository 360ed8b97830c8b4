"""gs:// outputs without a FUSE mount: real jobs writing through gcsfs to a real GCS JSON API server.

The server is gcp-storage-emulator on 127.0.0.1 (data on disk, so it can be stopped and started again);
the jobs reach it through ``STORAGE_EMULATOR_HOST``. Nothing here mocks gcsfs.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from entrypoint.outputs.storage import RemotePath
from tests.conftest import ROOT, skip_unless_installed
from tests.gcs import BUCKET, Emulator, gs_dir
from tests.runs import Job, entrypoint, failure_text, last_line, wait_gone

pytest.importorskip("torch")
skip_unless_installed("gcsfs", "gcp_storage_emulator")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
FAULTS = ["--module", "tests.pytorch.faults", "--log-every", "2"]
SLOW = ["--", "--step-sleep", "0.05"]





def local_args(output: str, *extra: str) -> list[str]:
    return ["local", "--workers", "2", "--output-dir", output, "--restart-policy", "never", "--", "run",
            "--framework", "pytorch", "--timeout", "60", *FAULTS, *extra]


def run_args(job_dir: str, *extra: str) -> list[str]:
    return ["run", "--framework", "pytorch", "--timeout", "60", "--job-dir", job_dir, *FAULTS, *extra]


def steps(checkpoint_dir: str) -> list[int]:
    return [step for step, _ in checkpoints.committed(checkpoint_dir, warn=False)]


def summary(model_dir: str) -> dict[str, object]:
    import json

    data: dict[str, object] = json.loads(RemotePath(f"{model_dir}/training_summary.json").read_text())
    return data


def test_two_replicas_write_checkpoints_the_model_and_the_summary_to_gcs(
        emulator: Emulator, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    out = gs_dir(request)
    proc = entrypoint(*local_args(out), env={**emulator.env, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, failure_text(proc)
    assert f"outputs: job dir {out} (Cloud Storage through gcsfs, the GCS emulator at {emulator.host})" in proc.stdout
    assert steps(f"{out}/checkpoints") == [22, 44]
    for _step, path in checkpoints.committed(f"{out}/checkpoints"):
        checkpoints.verify(path)
    assert sorted(p.name for p in RemotePath(f"{out}/model").iterdir()) == [
        "model.pt", "state_dict.pt", "training_summary.json"]
    result = summary(f"{out}/model")
    assert result["world_size"] == 2 and result["final_step"] == 44
    digests = result["param_digests"]
    assert isinstance(digests, list) and len(set(digests)) == 1
    assert any(p.name.startswith("events.out.tfevents") for p in RemotePath(f"{out}/logs").iterdir())
    assert not RemotePath(f"{out}/failures").exists()
    assert not (ROOT / "gs:").exists() and not (ROOT / "outputs").exists()  # nothing written locally instead


def test_sigterm_mid_training_then_the_restart_resumes_from_gcs(
        emulator: Emulator, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    out = gs_dir(request)
    env = {**emulator.env, "TMPDIR": str(tmp_path)}
    job = Job(*local_args(out, *SLOW), env=env)
    try:
        job.wait_for_step(8)  # mid-epoch: 22 steps per epoch with 2 replicas
        job.send(signal.SIGTERM)
        assert job.wait(90) == 143, job.output()[-3000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    assert "preempted" in last_line(job)
    step = steps(f"{out}/checkpoints")[-1]
    assert step >= job.last_step() > 0
    records = [p for p in RemotePath(f"{out}/failures").glob("*.json")]
    assert records, "the preemption records went to the bucket"
    rerun = entrypoint(*local_args(out, *SLOW), env=env)
    assert rerun.returncode == 0, failure_text(rerun)
    assert f"resumed from {out}/checkpoints/ckpt-{step:08d} at step {step}" in rerun.stdout
    result = summary(f"{out}/model")
    assert result["start_step"] == step and result["final_step"] == result["expected_steps"] == 44


def test_a_truncated_object_in_the_newest_checkpoint_falls_back_to_the_older_one(
        emulator: Emulator, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    job_dir = gs_dir(request)
    env = {**emulator.env, "TMPDIR": str(tmp_path)}
    args = run_args(job_dir, "--epochs", "1", "--checkpoint-every", "10")
    proc = entrypoint(*args, env=env)
    assert proc.returncode == 0, failure_text(proc)
    found = checkpoints.committed(f"{job_dir}/checkpoints")
    (older_step, older), (_newest_step, newest) = found[-2], found[-1]
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # the object was cut short after its commit
    rerun = entrypoint(*args, env=env)
    assert rerun.returncode == 0, failure_text(rerun)
    assert f"checkpoint {newest} does not load" in rerun.stdout + rerun.stderr
    assert f"resumed from {older} at step {older_step}" in rerun.stdout
    assert summary(f"{job_dir}/model")["start_step"] == older_step


def test_the_store_going_away_mid_upload_is_a_retryable_failure_and_nothing_committed_is_lost(
        emulator: Emulator, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    job_dir = gs_dir(request)
    job = Job(*run_args(job_dir, "--checkpoint-every", "2", "--keep-checkpoints", "100", *SLOW),
              env={**emulator.env, "TMPDIR": str(tmp_path)})
    try:
        job.wait_for("checkpoint ckpt-00000006 committed")
        emulator.stop()
        stopped = time.monotonic()
        assert job.wait(240) == 197, job.output()[-3000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    line = last_line(job)
    assert line.startswith("entrypoint: error: storage_unavailable") and "retryable" in line, line
    assert f"gs://{BUCKET} unreachable" in line and "the user's code" not in line
    assert time.monotonic() - stopped < 200
    (fallback,) = (tmp_path / "trainer-failures").glob("*.json")  # the bucket could not take the record
    assert '"class": "storage_unavailable"' in fallback.read_text()
    emulator.start()
    committed = steps(f"{job_dir}/checkpoints")
    assert committed[:3] == [2, 4, 6]
    for _step, path in checkpoints.committed(f"{job_dir}/checkpoints"):
        checkpoints.verify(path)  # every committed checkpoint is whole
