"""What real jobs do, and nothing is lost or hangs unbounded: preemption with DataLoader workers, an evaluation set
smaller than the world, and a stall while a rank builds its datasets (alone, or with its peers waiting for it)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from entrypoint.outputs import checkpoints
from tests.conftest import ROOT
from tests.runs import Job, failure_records, wait_gone

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
FAULTS = ["--module", "tests.pytorch.faults", "--log-every", "2"]
LOADER = ["--data-workers", "2", "--", "--step-sleep", "0.05"]


def run_args(job_dir: Path, *extra: str) -> list[str]:
    return ["run", "--framework", "pytorch", "--timeout", "30", "--grace-period", "10", "--job-dir", str(job_dir),
            *FAULTS, *extra]


def local_args(output: Path, *extra: str) -> list[str]:
    return ["local", "--workers", "2", "--output-dir", str(output), "--restart-policy", "never", "--", "run",
            "--framework", "pytorch", "--timeout", "30", "--grace-period", "10", *FAULTS, *extra]


def error_line(job: Job) -> str:
    lines = [line for line in job.lines if "entrypoint: error:" in line]
    return lines[-1] if lines else ""


def ended_within(job: Job, seconds: float) -> bool:
    try:
        job.proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def assert_preempted_with_committed_step(job: Job, job_dir: Path) -> None:
    code, line = job.wait(90), ""
    line = error_line(job)
    assert code == 143, f"exit {code}; last line: {line}\n{job.output()[-2500:]}"
    assert wait_gone(job.marker) == []
    match = re.search(r"at step (\d+)", line)
    assert match and "preempted" in line, line
    path = checkpoints.checkpoint_path(job_dir / "checkpoints", int(match.group(1)))
    assert checkpoints.is_committed(path), f"{path} not committed:\n{job.output()[-2000:]}"
    checkpoints.verify(path)
    assert {r["class"] for r in failure_records(job_dir)} == {"preempted"}


def test_sigterm_to_the_process_group_with_loader_workers_commits_the_step_and_exits_143(tmp_path: Path) -> None:
    job = Job(*run_args(tmp_path, *LOADER))
    try:
        job.wait_for_step(6)
        os.killpg(job.proc.pid, signal.SIGTERM)  # as tini -g delivers it: the loader workers get it too
        assert_preempted_with_committed_step(job, tmp_path)
    finally:
        job.cleanup()


def test_sigterm_to_local_with_loader_workers_commits_the_step_and_exits_143(tmp_path: Path) -> None:
    job = Job(*local_args(tmp_path, *LOADER))
    try:
        job.wait_for_step(6)
        job.send(signal.SIGTERM)  # local forwards it to every replica's process group
        assert_preempted_with_committed_step(job, tmp_path)
    finally:
        job.cleanup()


def test_an_evaluation_set_smaller_than_the_world_is_evaluated_without_a_lost_peer(tmp_path: Path) -> None:
    job = Job(*local_args(tmp_path, "--epochs", "1", "--recovery", "in-place", "--", "--eval-samples", "1"))
    try:
        assert job.wait(240) == 0, job.output()[-3000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    assert "re-forming the group" not in job.output()
    assert re.search(r"epoch 1/1 eval .*accuracy=", job.output())


def test_a_hang_in_build_datasets_is_caught_by_the_hang_timeout(tmp_path: Path) -> None:
    job = Job(*run_args(tmp_path, "--hang-timeout", "10", "--", "--fault", "hang-building"))
    try:
        job.wait_for(r"build_datasets: sleeping forever")
        assert ended_within(job, 10 + 25), f"build_datasets hangs past --hang-timeout 10:\n{job.output()[-2000:]}"
        line = error_line(job)
        assert job.wait(10) == 129 and "hang" in line and "building the datasets" in line, line
        assert [r["class"] for r in failure_records(tmp_path)] == ["hang"]
    finally:
        job.cleanup()


@pytest.mark.parametrize("where", ["before-the-start-up-barrier", "while-building-its-datasets"])
def test_a_worker_that_never_arrives_is_named_by_the_chiefs_timeout(tmp_path: Path, where: str) -> None:
    env = {"TEST_HANG_REPLICA": "workerpool1-0"}
    fault: list[str] = ["--", "--fault", "hang-building", "--fault-replica", "workerpool1-0"]
    hanging = r"\[workerpool1-0\] build_datasets: sleeping"
    if where == "before-the-start-up-barrier":
        env["PYTHONPATH"] = f"{ROOT / 'tests' / 'pytorch' / 'hang_before_barrier'}{os.pathsep}{ROOT}"
        fault, hanging = [], r"\[workerpool1-0\] hanging before the barrier"
    job = Job(*local_args(tmp_path, "--timeout", "10", "--hang-timeout", "0", *fault), env=env)
    try:
        job.wait_for(hanging)
        assert ended_within(job, 10 + 60), f"still waiting 70 s after the worker hung:\n{job.output()[-2000:]}"
        job.wait(30)
        line = error_line(job)
        assert "workerpool1" in line, f"the last line does not name the worker waited for: {line}"
    finally:
        job.cleanup()
