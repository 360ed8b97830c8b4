"""Preemption: SIGTERM once the log shows a step; the job saves that step, exits 143, and the rerun resumes there."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from entrypoint.failures.records import read_records
from entrypoint.options import DEFAULT_GRACE_PERIOD
from entrypoint.outputs.checkpoints import committed, read_marker
from tests.conftest import PYTHON, ROOT
from tests.tensorflow.runs import (
    JOB_TIMEOUT,
    SLOW,
    Stopped,
    leftovers,
    local_command,
    processes_with,
    run_args,
    run_job,
    stop_at_step,
    summary,
    tail,
)

pytestmark = pytest.mark.tensorflow
# Seconds from SIGTERM to the job's exit: within the grace period before the platform's SIGKILL (which would make the
# exit 137, not 143), plus the launcher's own teardown. Quiet, the examples take 1.2-7.2 s; under load much longer.
SIGNAL_TO_EXIT = DEFAULT_GRACE_PERIOD + 10


def test_private_tf_keras_and_tensorflow_names_still_work(tmp_path: Path) -> None:
    """The private names entrypoint/tensorflow/preemption.py relies on, exercised in a fresh process."""
    probe = Path(__file__).with_name("preemption_probe.py")
    proc = run_job([PYTHON, str(probe), str(tmp_path)], ROOT)
    assert proc.returncode == 0, tail(proc)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(seen["names"].values()), seen["names"]
    assert seen["stop_code"] == 143 and seen["stop_class"] == "preempted"
    assert f"at step {seen['stopped_step']}: checkpoint committed" in seen["stop_message"]
    assert seen["newest_committed"] == seen["stopped_step"] == 6  # one worker: at the batch the signal came after
    assert seen["marker"]["stopped_by"] == "SIGTERM on node-0" and seen["marker"]["batch"] == 6
    assert seen["resumed_at"] == seen["stopped_step"]  # mid-epoch, at the very step
    assert seen["final_step"] == seen["expected_steps"] and seen["second_fit_error"] is None


def marker_args(tmp_path: Path) -> tuple[str, list[str]]:
    """A word unique to this test, passed to the slow module so every replica's command line carries it."""
    marker = f"tf-preempt-{os.getpid()}-{tmp_path.name}"
    return marker, ["--", "--marker", marker]


def assert_stopped_and_resumable(stopped: Stopped, checkpoint_dir: Path, job_dir: Path, replicas: set[str],
                                 marker: str) -> int:
    """143 within the target; the newest committed step covers the log; every replica recorded the preemption."""
    assert stopped.code == 143, stopped.output[-5000:]
    assert stopped.seconds < SIGNAL_TO_EXIT, f"{stopped.seconds:.1f} s from SIGTERM to exit"
    step, path = committed(checkpoint_dir)[-1]
    assert step >= stopped.last_logged > 0
    assert read_marker(path)["stopped_by"].startswith("SIGTERM")
    records = read_records(str(job_dir), 0)
    assert {r.replica for r in records} == replicas
    assert all(r.failure_class == "preempted" and r.exit_code == 143 for r in records), records
    assert re.search(rf"stopped by SIGTERM on [-\w]+ at step {step}: checkpoint committed", records[0].message)
    assert not (job_dir / "model" / "training_summary.json").exists()
    assert no_process_left(marker)
    took = re.search(r"checkpoint committed \(([\d.]+) s after the signal\)", stopped.output)
    print(f"figure: {len(replicas)} worker(s), SIGTERM to every one mid-epoch: committed "
          f"{took.group(1) if took else '?'} s (the first to commit), exited {stopped.seconds:.1f} s after it")
    return step


def no_process_left(marker: str, wait: float = 10.0) -> bool:
    """True once no process carries ``marker`` (the test's own never does)."""
    deadline = time.monotonic() + wait
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not processes_with(marker)


@pytest.mark.slow
def test_sigterm_on_one_node_commits_that_step_and_the_rerun_resumes_there(tmp_path: Path) -> None:
    job = tmp_path / "job"
    marker, user = marker_args(tmp_path)
    command = [PYTHON, "-m", "entrypoint", *run_args("--module", SLOW, "--job-dir", str(job), "--log-every", "2"),
               *user]
    stopped = stop_at_step(command, tmp_path, 40)  # epoch 2 of 4, 32 steps each
    step = assert_stopped_and_resumable(stopped, job / "checkpoints", job, {"node-0"}, marker)

    proc = run_job(command, tmp_path)
    assert proc.returncode == 0, tail(proc)
    result = summary(job / "model")
    assert result["start_step"] == step and result["final_step"] == 4 * 32
    assert result["steps_per_replica"] == [4 * 32 - step]
    assert not list((job / "checkpoints" / "backup").glob("*"))


@pytest.mark.slow
def test_sigterm_under_two_workers_commits_the_agreed_step_and_the_rerun_resumes_there(tmp_path: Path) -> None:
    out = tmp_path / "out"
    marker, user = marker_args(tmp_path)
    command = local_command(out, "--workers", "2", run=run_args("--module", SLOW, "--log-every", "1", *user))
    stopped = stop_at_step(command, tmp_path, 20)  # epoch 2 of 4, 16 steps each (global batch 32)
    step = assert_stopped_and_resumable(stopped, out / "checkpoints", out, {"workerpool0-0", "workerpool1-0"},
                                        marker)
    assert leftovers(tmp_path) == []

    proc = run_job(command, tmp_path)
    assert proc.returncode == 0, tail(proc)
    result = summary(out / "model")
    assert result["start_step"] == step and result["final_step"] == 4 * 16
    assert result["steps_per_replica"] == [4 * 16 - step] * 2
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_parameter_servers_and_the_evaluator_stop_at_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    marker, user = marker_args(tmp_path)
    command = local_command(out, "--workers", "2", "--ps", "1", "--evaluators", "1",
                            run=run_args("--module", SLOW, "--log-every", "2", *user))
    stopped = stop_at_step(command, tmp_path, 10, timeout=JOB_TIMEOUT)
    assert stopped.code == 143, stopped.output[-5000:]
    assert stopped.seconds < SIGNAL_TO_EXIT, f"{stopped.seconds:.1f} s from SIGTERM to exit"
    records = {r.replica: r for r in read_records(str(out), 0)}
    assert set(records) == {"workerpool0-0", "workerpool1-0", "workerpool2-0", "workerpool3-0"}
    assert all(r.failure_class == "preempted" and r.exit_code == 143 for r in records.values()), records
    assert "ParameterServerStrategy" in records["workerpool0-0"].message
    assert "nothing to save" in records["workerpool3-0"].message
    assert no_process_left(marker)
