"""Preemption, restarts and dying parents with real PyTorch processes: nothing lost, nothing left running.

Signals are sent when the job's own output shows a given step, never after a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs import checkpoints
from tests.references import faults_digest
from tests.runs import Job, entrypoint, failure_records, failure_text, last_line, processes_with, summary, wait_gone

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
FAULTS = ["--module", "tests.pytorch.faults", "--log-every", "2"]
SLOW = ["--", "--step-sleep", "0.05"]


def run_args(job_dir: Path, *extra: str) -> list[str]:
    return ["run", "--framework", "pytorch", "--timeout", "60", "--job-dir", str(job_dir), *FAULTS, *extra]


def local_args(output: Path, *extra: str) -> list[str]:
    """Two replicas that stay down when stopped (``--restart-policy never``: these tests look at the stop itself)."""
    return ["local", "--workers", "2", "--output-dir", str(output), "--restart-policy", "never", "--", "run",
            "--framework", "pytorch", "--timeout", "60", *FAULTS, *extra]


def newest_step(checkpoint_dir: Path) -> int:
    found = checkpoints.committed(checkpoint_dir, warn=False)
    return found[-1][0] if found else 0


def replica_pid(marker: str, replica: str) -> int:
    """The pid of an emulated replica's own ``python -m entrypoint run`` process."""
    for pid in processes_with(marker):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"TRAINER_REPLICA={replica}".encode() in environ and b"run" in cmdline.split(b"\0"):
            return pid
    raise AssertionError(f"no process for replica {replica}")


def assert_stopped_and_resumes(job: Job, job_dir: Path, resume: list[str], signalled_at: float) -> int:
    """Exit 143 within the platform's 30 s grace period, a checkpoint at or past the last logged step, and a restart
    that resumes there."""
    assert job.wait(60) == 143, job.output()[-3000:]
    assert time.monotonic() - signalled_at < 30
    assert wait_gone(job.marker) == []
    step = newest_step(job_dir / "checkpoints")
    assert step >= job.last_step() > 0
    records = failure_records(job_dir)
    assert records and {r["class"] for r in records} == {"preempted"} and records[0]["exit_code"] == 143
    assert "preempted" in last_line(job)
    rerun = entrypoint(*resume)
    assert rerun.returncode == 0, failure_text(rerun)
    assert f"resumed from {checkpoints.checkpoint_path(job_dir / 'checkpoints', step)} at step {step}" in rerun.stdout
    assert f"was preempted at step {step}: resumed from step {step} (0 steps" in rerun.stdout  # not "losing"
    result = summary(job_dir / "model")
    assert result["start_step"] == step and result["final_step"] == result["expected_steps"]
    assert [r["cause"] for r in result["recoveries"]] == ["preempted"]
    return step


def test_sigterm_on_one_node_commits_the_exact_step_and_the_restart_resumes_exactly(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    expected = faults_digest(tmp_path_factory, world=1)
    job_dir = tmp_path / "job"
    job = Job(*run_args(job_dir, *SLOW))
    try:
        job.wait_for_step(12)  # mid-epoch: 44 steps per epoch
        sent = job.send(signal.SIGTERM)
        assert_stopped_and_resumes(job, job_dir, run_args(job_dir, *SLOW), sent)
    finally:
        job.cleanup()
    assert summary(job_dir / "model")["param_digests"][0] == expected


def test_sigterm_reaching_one_replica_stops_both_at_the_same_step(tmp_path: Path,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    expected = faults_digest(tmp_path_factory, world=2)
    out = tmp_path / "job"
    job = Job(*local_args(out, *SLOW))
    try:
        job.wait_for_step(8)  # mid-epoch: 22 steps per epoch with 2 replicas
        sent = time.monotonic()
        os.kill(replica_pid(job.marker, "workerpool1-0"), signal.SIGTERM)  # only the worker was preempted
        assert_stopped_and_resumes(job, out, local_args(out, *SLOW), sent)
    finally:
        job.cleanup()
    result = summary(out / "model")
    assert result["param_digests"] == [expected, expected]


@pytest.mark.parametrize("world", [1, 2])
def test_killed_at_an_epoch_boundary_the_restart_resumes_exactly(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, world: int) -> None:
    expected = faults_digest(tmp_path_factory, world)
    out = tmp_path / "job"
    args = run_args(out, *SLOW) if world == 1 else local_args(out, *SLOW)
    job = Job(*args)
    try:
        steps = 44 if world == 1 else 22
        job.wait_for(f"checkpoint ckpt-{steps:08d} committed")
        os.killpg(job.proc.pid, signal.SIGKILL)  # no warning at all: only the committed epoch survives
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    assert newest_step(out / "checkpoints") == steps
    proc = entrypoint(*args)
    assert proc.returncode == 0, failure_text(proc)
    result = summary(out / "model")
    assert result["start_step"] == steps and result["param_digests"][0] == expected


def test_a_killed_node_takes_its_workers_with_it_and_the_chief_reports_the_lost_peer(tmp_path: Path) -> None:
    chief, worker = free_ports(2)
    cluster = {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]}

    def node(pool: str) -> Job:
        spec = {"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": 0}}
        return Job(*run_args(tmp_path, "--nproc-per-node", "2", "--timeout", "30", *SLOW),
                   env={"CLUSTER_SPEC": json.dumps(spec)})

    nodes = [node("workerpool0"), node("workerpool1")]
    try:
        nodes[0].wait_for_step(6)
        assert len(nodes[1].left()) >= 3  # the node's entrypoint (torch's agent) and its 2 workers
        os.kill(nodes[1].proc.pid, signal.SIGKILL)
        assert wait_gone(nodes[1].marker, timeout=10) == []  # its workers died with it
        assert nodes[0].wait(60) == 129
        assert "peer_lost" in last_line(nodes[0])
        assert wait_gone(nodes[0].marker) == []
    finally:
        for job in nodes:
            job.cleanup()


def test_local_ends_within_the_grace_period_when_user_code_ignores_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', "
                      "flush=True)\ntime.sleep(600)\n")
    job = Job("local", "--workers", "2", "--output-dir", str(tmp_path), "--", "run", "--framework", "pytorch",
              "--grace-period", "2", "--script", str(script))
    try:
        job.wait_for(r"\[workerpool1-0\] ready")
        job.wait_for(r"\[workerpool0-0\] ready")
        sent = job.send(signal.SIGTERM)
        assert job.wait(60) == 143
        assert time.monotonic() - sent < 30  # the 600 s sleep was cut short: the replicas' 2 s grace, local's margin
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()


def test_a_corrupt_newest_checkpoint_is_skipped_and_resume_from_it_fails_loudly(tmp_path: Path) -> None:
    proc = entrypoint(*run_args(tmp_path, "--epochs", "1", "--checkpoint-every", "10"))
    assert proc.returncode == 0, failure_text(proc)
    found = checkpoints.committed(tmp_path / "checkpoints")
    (older_step, older), (_, newest) = found[-2], found[-1]
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated after its commit
    proc = entrypoint(*run_args(tmp_path / "other", "--resume-from", str(newest)))
    assert proc.returncode == 2, failure_text(proc)  # named explicitly: no fallback, a loud error
    assert "--resume-from" in last_line(proc) and "does not load" in last_line(proc)
    proc = entrypoint(*run_args(tmp_path, "--epochs", "2", "--checkpoint-every", "10"))
    assert proc.returncode == 0, failure_text(proc)
    assert f"checkpoint {newest} does not load" in proc.stdout
    assert f"resumed from {older} at step {older_step}" in proc.stdout


def test_a_hook_that_exits_early_is_a_failure_of_the_users_code(tmp_path: Path) -> None:
    proc = entrypoint(*run_args(tmp_path, "--", "--fault", "exit"))
    assert proc.returncode == 1, failure_text(proc)
    assert "user_code" in last_line(proc) and "sys.exit(0)" in last_line(proc)
    assert not (tmp_path / "model" / "training_summary.json").exists()


def test_a_script_polling_the_context_api_saves_and_its_exit_code_passes_through(tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    job = Job("run", "--framework", "pytorch", "--job-dir", str(tmp_path), "--script", "tests/pytorch/polite_script.py",
              "--", str(saved))
    try:
        job.wait_for(r"script step 5")
        sent = job.send(signal.SIGTERM)
        assert job.wait(60) == 143
        assert time.monotonic() - sent < 30  # the script stopped at its next poll, within the grace period
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    assert json.loads(saved.read_text())["step"] >= 5
    assert [r["class"] for r in failure_records(tmp_path)] == ["preempted"]
