"""Smaller faults of issue 33, each with real processes: what the user sees is true and nothing outlives the job.

A malformed credentials file is named; a directory as ``--script`` says so; ``local --trial ../..`` cannot write
outside ``--output-dir``; SIGTERM at the start-up barrier leaves a record and a last line; a user's child that
ignores SIGTERM does not outlive ``local``; two ``local`` runs on one output dir seconds apart each name their own
root cause.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint.failures.records import FailureRecord, store_record
from entrypoint.lifecycle.startup.ports import free_ports
from tests.runs import Job, entrypoint, failure_records, failure_text, last_line, wait_gone

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
HERE = Path(__file__).resolve().parent


def test_a_malformed_credentials_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "key.json"
    bad.write_text("{not json")
    system_tmp = tmp_path / "tmp"
    system_tmp.mkdir()
    proc = entrypoint("run", "--framework", "pytorch", "--job-dir", "gs://trainer-test-bucket/job", "--module",
                      "tests.pytorch.faults", "--epochs", "1",
                      env={"GOOGLE_APPLICATION_CREDENTIALS": str(bad), "TMPDIR": str(system_tmp)}, timeout=120)
    line = last_line(proc)
    assert proc.returncode == 73, failure_text(proc)
    # the key file is named by its variable (a credentials variable's value is redacted like any secret's)
    assert "GOOGLE_APPLICATION_CREDENTIALS names cannot be used" in line and "not a valid json file" in line, line
    assert "no Application Default Credentials found" not in line and str(bad) not in line, line


def test_a_directory_as_script_says_it_is_a_directory(tmp_path: Path) -> None:
    proc = entrypoint("run", "--framework", "pytorch", "--job-dir", str(tmp_path / "job"), "--script", str(tmp_path))
    line = last_line(proc)
    assert proc.returncode == 2, failure_text(proc)
    assert "is a directory" in line and "does not exist" not in line, line


@pytest.mark.parametrize("trial", ["../..", "a/b", ".."])
def test_local_trial_cannot_write_outside_the_output_dir(tmp_path: Path, trial: str) -> None:
    output = tmp_path / "a" / "b" / "out"
    output.mkdir(parents=True)
    proc = entrypoint("local", "--workers", "1", "--trial", trial, "--output-dir", str(output), "--restart-policy",
                      "never", "--", "run", "--framework", "pytorch", "--module", "no_such_module_here")
    assert proc.returncode == 2, failure_text(proc)
    assert "--trial" in last_line(proc), last_line(proc)
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and output not in p.parents]
    assert outside == [], f"written outside --output-dir {output}: {[str(p) for p in outside]}"


def test_sigterm_at_the_start_up_barrier_leaves_a_record_and_a_last_line(tmp_path: Path) -> None:
    chief, worker = free_ports(2)
    cluster = {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]}
    spec = {"cluster": cluster, "environment": "cloud", "task": {"type": "workerpool0", "index": 0}}
    job = Job("run", "--framework", "pytorch", "--timeout", "60", "--job-dir", str(tmp_path), "--module",
              "tests.pytorch.faults", env={"CLUSTER_SPEC": json.dumps(spec)})  # the worker never comes
    try:
        job.wait_for(r"waiting for 1 of 1 peers")
        job.send(signal.SIGTERM)
        code = job.wait(30)
        assert code == 143, job.output()[-2000:]
        line = last_line(job)
        assert "preempted" in line and "start-up barrier" in line and "(exit 143" in line, job.output()[-2000:]
        assert [r["class"] for r in failure_records(tmp_path)] == ["preempted"]
    finally:
        job.cleanup()


@pytest.mark.parametrize("session", ["same-group", "new-session"])
def test_a_users_child_ignoring_sigterm_does_not_outlive_local(tmp_path: Path, session: str) -> None:
    user_args = ["--", "--new-session"] if session == "new-session" else []
    job = Job("local", "--workers", "1", "--output-dir", str(tmp_path), "--restart-policy", "never", "--", "run",
              "--framework", "pytorch", "--grace-period", "2", "--script", str(HERE / "child_ignoring_sigterm.py"),
              *user_args)
    try:
        job.wait_for(r"child ready, ignoring SIGTERM")
        job.send(signal.SIGTERM)
        try:
            job.wait(2 + 5 + 10)
        except subprocess.TimeoutExpired:
            raise AssertionError(job.output()[-2000:]) from None
        left = wait_gone(job.marker, timeout=10)
        assert left == [], f"still alive after local ended: {left}\n{job.output()[-2000:]}"
    finally:
        job.cleanup()



def test_a_local_run_ignores_the_records_of_a_run_before_it(tmp_path: Path) -> None:
    """Records are read with some clock skew allowed (a peer's clock may be behind ours), so a previous run's record
    written seconds before could pass for this run's. One present before ``local`` started is never this run's root
    cause. Here it was written half a second before ``local`` is launched: within the skew allowed of its start."""
    earlier = FailureRecord(replica="workerpool0-0", rank=None, host="elsewhere", failure_class="config", exit_code=2,
                            message="--module: the previous run's failure", pid=1, time=time.time() - 0.5)
    assert store_record(str(tmp_path), earlier) is not None
    proc = entrypoint("local", "--workers", "1", "--output-dir", str(tmp_path), "--restart-policy", "never", "--",
                      "run", "--framework", "pytorch", "--module", "no_such_module_second")
    assert proc.returncode == 2, failure_text(proc)
    assert "no_such_module_second" in last_line(proc), last_line(proc)
