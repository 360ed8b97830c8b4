"""What real jobs do, and nothing is lost or hangs unbounded: preemption with DataLoader workers, an evaluation set
smaller than the world, a start-up slower than --hang-timeout (it trains) or than --startup-timeout (it ends, naming
the phase), and a stall while a rank builds its datasets with its peers waiting for it."""

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
    return ["run", "--framework", "pytorch", "--timeout", "30", "--job-dir", str(job_dir),
            *FAULTS, *extra]


def local_args(output: Path, *extra: str) -> list[str]:
    return ["local", "--workers", "2", "--output-dir", str(output), "--restart-policy", "never", "--", "run",
            "--framework", "pytorch", "--timeout", "30", *FAULTS, *extra]


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


def test_a_start_up_past_the_startup_timeout_ends_permanently_naming_the_phase_and_the_flag(tmp_path: Path) -> None:
    # --hang-timeout 1 would have fired at once while building (it did, as a retryable hang): it starts at the first
    # step now. The start-up clock starts with the loop: 20 s leaves a loaded machine room to reach build_model.
    job = Job(*run_args(tmp_path, "--startup-timeout", "20", "--hang-timeout", "1", "--", "--build-sleep", "3600"))
    try:
        job.wait_for(r"build_model: sleeping")
        assert ended_within(job, 20 + 60), f"build_model sleeps past --startup-timeout 20:\n{job.output()[-2000:]}"
        assert job.wait(10) == 124, job.output()[-3000:]
    finally:
        job.cleanup()
    line = error_line(job)
    assert line.startswith("entrypoint: error: startup_timeout on "), line
    assert "still building the model (build_model) after 20 s (--startup-timeout); raise --startup-timeout if this " \
        "start is expected to be slow" in line and line.endswith("(exit 124, permanent)"), line
    assert re.search(r"line \d+ in build_model", job.output()), job.output()[-3000:]  # every stack was dumped
    assert [r["class"] for r in failure_records(tmp_path)] == ["startup_timeout"]


def test_a_start_up_slower_than_the_hang_timeout_trains_to_the_end(tmp_path: Path) -> None:
    # build_model takes 25 s, longer than --hang-timeout 20 (which once covered building and ended the job 129 at every
    # attempt) and well within --startup-timeout: the step clock starts at the first step.
    job = Job(*run_args(tmp_path, "--epochs", "1", "--hang-timeout", "20", "--startup-timeout", "600", "--",
                        "--build-sleep", "25"))
    try:
        assert job.wait(300) == 0, job.output()[-3000:]
    finally:
        job.cleanup()
    assert "build_model: sleeping 25 s" in job.output() and failure_records(tmp_path) == []


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
