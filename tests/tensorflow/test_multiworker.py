"""MultiWorkerMirroredStrategy on emulated Vertex replicas, the same module on one node, and restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs.checkpoints import committed
from tests.conftest import PYTHON, subprocess_env
from tests.tensorflow.runs import (
    JOB_TIMEOUT,
    TOY,
    assert_loadable,
    leftovers,
    local_command,
    make_image_folder,
    run_args,
    run_job,
    summary,
    tail,
)

pytestmark = pytest.mark.tensorflow


def test_single_node_default_strategy(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = run_job([PYTHON, "-m", "entrypoint", *run_args("--module", TOY, "--job-dir", str(job))], tmp_path)
    assert proc.returncode == 0, tail(proc)
    result = summary(job / "model")
    assert result["strategy"] == "default" and result["replicas_in_sync"] == 1
    assert result["steps_per_replica"] == [32] and result["final_step"] == 32  # 256 examples / 16, 2 epochs
    assert [step for step, _ in committed(job / "checkpoints")] == [16, 32]
    assert_loadable(job / "model", features=8)


@pytest.mark.slow
def test_two_workers_train_the_same_steps_and_export_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_job(local_command(out, "--workers", "2", run=run_args("--module", TOY, "--hypertune-metric",
                                                                     "val_accuracy")), tmp_path)
    assert proc.returncode == 0, tail(proc)
    result = summary(out / "model")
    assert result["strategy"] == "MultiWorkerMirroredStrategy" and result["replicas_in_sync"] == 2
    assert result["global_batch_size"] == 32
    assert result["steps_per_replica"] == [16, 16]  # 256 examples / global batch 32 = 8 steps, 2 epochs
    assert (out / "model" / "saved_model.pb").is_file()
    assert [step for step, _ in committed(out / "checkpoints")] == [8, 16]
    assert leftovers(tmp_path) == []
    assert not list((out / "checkpoints" / "backup").glob("*"))  # BackupAndRestore removed its state
    metrics = {p.parent.parent.name for p in (out / ".replicas").glob("*/hypertune/output.metrics")}
    assert metrics == {"workerpool0-0"}
    assert_loadable(out / "model", features=8)


@pytest.mark.slow
def test_codelab_script_runs_unchanged_on_two_replicas(tmp_path: Path) -> None:
    images, job = make_image_folder(tmp_path / "images"), tmp_path / "job"
    script = Path(__file__).with_name("codelab_task.py")
    command = local_command(tmp_path / "out", "--workers", "2", run=run_args(
        "--script", str(script), "--", "--data-dir", str(images), "--output-dir", str(job)))
    proc = run_job(command, tmp_path)
    assert proc.returncode == 0, tail(proc)
    assert (job / "multi-machine-output" / "saved_model.pb").is_file()
    assert sorted(p.name for p in job.iterdir()) == ["multi-machine-output"]
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_restart_after_a_kill_resumes_from_the_backup(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = local_command(out, "--workers", "2", run=run_args("--module", TOY, "--epochs", "6"))
    first = subprocess.Popen(command, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + JOB_TIMEOUT
    while not committed(out / "checkpoints", warn=False) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, "training finished before it could be interrupted"
    os.killpg(first.pid, signal.SIGTERM)  # the emulator forwards it to every replica, like a preemption
    assert first.wait(timeout=60) == 128 + signal.SIGTERM
    assert not (out / "model" / "training_summary.json").exists()

    proc = run_job(command, tmp_path)
    assert proc.returncode == 0, tail(proc)
    result = summary(out / "model")
    assert result["start_epoch"] > 0 and result["start_step"] > 0
    assert result["final_step"] == 6 * 8
    assert result["steps_per_replica"][0] == result["steps_per_replica"][1] == 48 - result["start_step"]
    assert leftovers(tmp_path) == []


def test_a_worker_that_never_comes_ends_the_chief_after_the_timeout(tmp_path: Path) -> None:
    chief, worker = free_ports(2)
    tf_config = {"cluster": {"chief": [f"127.0.0.1:{chief}"], "worker": [f"127.0.0.1:{worker}"]},
                 "task": {"type": "chief", "index": 0}}
    started = time.monotonic()
    proc = run_job([PYTHON, "-m", "entrypoint", *run_args("--module", TOY, "--job-dir", str(tmp_path / "job"),
                                                          "--timeout", "5")],
                   tmp_path, env={"TF_CONFIG": json.dumps(tf_config)}, timeout=120)
    assert proc.returncode == 129, tail(proc)  # retryable, no hang: the start-up barrier names who never came
    assert f"worker[0] (127.0.0.1:{worker})" in proc.stderr.splitlines()[-1]
    assert time.monotonic() - started < 60
    assert not (tmp_path / "job" / "model").exists()
