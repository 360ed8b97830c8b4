"""TensorFlow and gs:// without Vertex's FUSE mount: real jobs, real TensorFlow, a real GCS JSON API server.

TensorFlow writes local staging directories and the storage seam (gcsfs) mirrors them to the bucket
(entrypoint/outputs/staging.py): TensorFlow's own GCS file system has its endpoint compiled in, so it never sees
the emulator. The server is gcp-storage-emulator on 127.0.0.1 (tests/gcs.py); nothing here mocks gcsfs.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.storage import RemotePath
from tests.conftest import ROOT, skip_unless_installed
from tests.gcs import BUCKET, Emulator, gs_dir
from tests.runs import Job, entrypoint, failure_text, last_line, wait_gone
from tests.tensorflow.runs import SLOW, TOY, assert_loadable, run_args

skip_unless_installed("tensorflow", "gcsfs", "gcp_storage_emulator")
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]





def two_workers(output: str, *extra: str, evaluators: int = 0) -> list[str]:
    return ["local", "--workers", "2", "--evaluators", str(evaluators), "--output-dir", output,
            "--restart-policy", "never", "--", *run_args(*extra)]


def steps(checkpoint_dir: str) -> list[int]:
    return [step for step, _ in checkpoints.committed(checkpoint_dir, warn=False)]


def summary(model_dir: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(RemotePath(f"{model_dir}/training_summary.json").read_text())
    return data


def staging_left(root: Path) -> list[Path]:
    return [p for p in root.rglob("trainer-staging-*")]


def test_two_workers_and_an_evaluator_write_checkpoints_the_export_and_tensorboard_to_gcs(
        emulator: Emulator, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    out = gs_dir(request)
    proc = entrypoint(*two_workers(out, "--module", TOY, evaluators=1), env={**emulator.env, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, failure_text(proc)
    assert f"outputs: job dir {out} (Cloud Storage through gcsfs, the GCS emulator at {emulator.host})" in proc.stdout
    assert steps(f"{out}/checkpoints") == [8, 16]  # 2 epochs of 256 examples, global batch 32
    for _step, path in checkpoints.committed(f"{out}/checkpoints"):
        checkpoints.verify(path)
        assert checkpoints.read_marker(path)["framework"] == "tensorflow"
    assert not RemotePath(f"{out}/checkpoints/backup").exists()  # deleted after fit, as tf-keras deletes its own
    assert RemotePath(f"{out}/checkpoints/TRAINING_DONE").is_file()
    model = RemotePath(f"{out}/model")
    names = {storage.relative(p, model) for p in model.rglob("*")}
    assert {"saved_model.pb", "training_summary.json", "variables/variables.index"} <= names, names
    result = summary(f"{out}/model")
    assert result["world_size"] == 2 and result["final_step"] == 16 and result["start_step"] == 0
    blocked = result["checkpoint_blocked_seconds"]
    assert isinstance(blocked, float) and 0 < blocked == result["checkpoint_write_seconds"] < result["seconds"]
    exported = tmp_path / "exported"
    storage.download_tree(model, exported)
    assert_loadable(exported, 8)
    events = [p for p in RemotePath(f"{out}/logs").rglob("*") if p.name.startswith("events.out.tfevents")]
    assert {p.parent.name for p in events} == {"train", "validation", "eval"}, events
    evaluated = [json.loads(line) for line in RemotePath(f"{out}/logs/eval/metrics.jsonl").read_text().splitlines()]
    assert evaluated and evaluated[-1]["step"] == 16 and "accuracy" in evaluated[-1], evaluated  # the final one
    assert not RemotePath(f"{out}/failures").exists()
    assert not (ROOT / "gs:").exists() and not (ROOT / "outputs").exists()  # nothing written locally instead
    assert staging_left(tmp_path) == []


def test_sigterm_mid_epoch_then_the_rerun_resumes_from_gcs_at_that_step(
        emulator: Emulator, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    out = gs_dir(request)
    env = {**emulator.env, "TMPDIR": str(tmp_path)}
    args = two_workers(out, "--module", SLOW, "--log-every", "1")  # 4 epochs of 16 steps (global batch 32)
    job = Job(*args, env=env)
    try:
        job.wait_for_step(20)  # epoch 2
        job.send(signal.SIGTERM)
        assert job.wait(90) == 143, job.output()[-3000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    assert "preempted" in last_line(job)
    step = steps(f"{out}/checkpoints")[-1]
    assert step >= job.last_step() > 16 and step % 16, step  # mid-epoch
    newest = checkpoints.committed(f"{out}/checkpoints")[-1][1]
    checkpoints.verify(newest)
    assert checkpoints.read_marker(newest)["stopped_by"].startswith("SIGTERM")
    assert RemotePath(f"{out}/checkpoints/backup/chief/checkpoint").is_file()  # the mid-epoch state, on the bucket
    assert list(RemotePath(f"{out}/failures").glob("*.json")), "the preemption records went to the bucket"
    assert staging_left(tmp_path) == []

    rerun = entrypoint(*args, env=env)  # new replicas, new disks: everything comes from the bucket
    assert rerun.returncode == 0, failure_text(rerun)
    assert f"resumed from {out}/checkpoints/ckpt-{step:08d} at step {step}" in rerun.stdout
    result = summary(f"{out}/model")
    assert result["start_step"] == step and result["final_step"] == result["expected_steps"] == 4 * 16
    assert result["steps_per_replica"] == [4 * 16 - step] * 2  # mid-epoch: the backup's batch, not the epoch start
    assert not RemotePath(f"{out}/checkpoints/backup").exists()


def test_the_store_going_away_mid_job_is_a_retryable_failure_and_nothing_committed_is_lost(
        emulator: Emulator, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    job_dir = gs_dir(request)
    job = Job(*run_args("--module", SLOW, "--job-dir", job_dir, "--keep-checkpoints", "100", "--log-every", "4"),
              env={**emulator.env, "TMPDIR": str(tmp_path)})
    try:
        job.wait_for(f"committed {job_dir}/checkpoints/ckpt-00000032")  # epoch 1 of 4 (32 steps each)
        emulator.stop()
        stopped = time.monotonic()
        assert job.wait(240) == 197, job.output()[-3000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    seconds = time.monotonic() - stopped
    line = last_line(job)
    assert line.startswith("entrypoint: error: storage_unavailable") and "retryable" in line, line
    assert f"gs://{BUCKET} unreachable" in line and "the user's code" not in line
    assert seconds < 100, f"{seconds:.0f} s from the store going away to the exit"
    (fallback,) = (tmp_path / "trainer-failures").glob("*.json")  # the bucket could not take the record
    assert '"class": "storage_unavailable"' in fallback.read_text()
    assert staging_left(tmp_path) == []
    emulator.start()
    committed = steps(f"{job_dir}/checkpoints")
    assert committed[:1] == [32], committed
    for _step, path in checkpoints.committed(f"{job_dir}/checkpoints"):
        checkpoints.verify(path)  # every committed checkpoint is whole
