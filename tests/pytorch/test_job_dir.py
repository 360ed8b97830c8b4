"""Nothing lost to what real jobs do with a job dir (issue 33): restarts, reruns, a second job, a bad checkpoint.

A job warm-started with ``--resume-from`` and restarted with the same arguments resumes from its own newest
checkpoint; a second live job on the same job dir is refused at once; a rerun with other arguments says which
ones differ; retention after a fall-back keeps the rewritten good checkpoint. Real processes, torch on CPU.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.jobdir.lease import LEASE, Holder
from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs import checkpoints
from tests.runs import Job, assert_restarted_in_place, entrypoint, failure_text, last_line, summary, vanish, wait_gone

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
DIFFERS = re.compile(r"differ|different|changed|mismatch|not the same", re.IGNORECASE)


def run_args(job_dir: Path, *extra: str) -> list[str]:
    """``run`` of one process with short timeouts."""
    return ["run", "--framework", "pytorch", "--timeout", "30", "--job-dir", str(job_dir),
            "--module", "tests.pytorch.faults", "--log-every", "2", *extra]


def newest_step(checkpoint_dir: Path) -> int:
    found = checkpoints.committed(checkpoint_dir, warn=False)
    return found[-1][0] if found else 0


def test_a_restarted_warm_started_job_resumes_from_its_own_newest_checkpoint(tmp_path: Path) -> None:
    source = tmp_path / "source"
    proc = entrypoint(*run_args(source, "--epochs", "1", "--checkpoint-every", "10", "--keep-checkpoints", "5"))
    assert proc.returncode == 0, failure_text(proc)
    warm = checkpoints.checkpoint_path(source / "checkpoints", 10)
    assert checkpoints.is_committed(warm)

    job_dir = tmp_path / "job"
    args = run_args(job_dir, "--epochs", "1", "--resume-from", str(warm), "--checkpoint-every", "10",
                    "--keep-checkpoints", "2", "--", "--step-sleep", "0.05")
    job = Job(*args)
    try:
        job.wait_for("checkpoint ckpt-00000020 committed")
        job.wait_for_step(24)
        job.send(signal.SIGTERM)
        assert job.wait(60) == 143, job.output()[-3000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    stopped = newest_step(job_dir / "checkpoints")
    assert stopped >= 24

    rerun = entrypoint(*args)  # the platform restarts the job with the same arguments
    assert rerun.returncode == 0, failure_text(rerun)
    own = checkpoints.checkpoint_path(job_dir / "checkpoints", stopped)
    resumed = [line for line in rerun.stdout.splitlines() if "resumed from" in line or "training lost" in line]
    assert f"resumed from {own} at step {stopped}" in rerun.stdout, \
        f"expected a resume from {own} at step {stopped}, got:\n" + "\n".join(resumed)
    assert "steps of training lost" not in rerun.stdout, rerun.stdout[-3000:]
    assert checkpoints.is_committed(own) or newest_step(job_dir / "checkpoints") > stopped
    assert summary(job_dir / "model")["start_step"] == stopped


def test_a_second_job_on_a_live_jobs_job_dir_is_refused_at_once(tmp_path: Path) -> None:
    first = Job(*run_args(tmp_path, "--epochs", "1", "--checkpoint-every", "4", "--", "--step-sleep", "0.15"))
    try:
        first.wait_for("checkpoint ckpt-00000004 committed")
        second = entrypoint(*run_args(tmp_path, "--epochs", "1", "--checkpoint-every", "4", "--", "--lr", "0.01",
                                      "--hidden", "128"), timeout=120)
        assert first.proc.poll() is None, "the first job ended before the second one was answered"
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert second.returncode == 2, f"the second job ran on the live job's dir:\n{failure_text(second)}"
        # At once: a holder on this host is alive or not by its pid, never watched for the lease's staleness (a
        # wall clock would also count this process's start, which is what a loaded machine makes slow).
        assert "watching up to" not in second.stdout + second.stderr, failure_text(second)
        assert lines and str(tmp_path) in lines[-1] and re.search(r"in use by another live job", lines[-1]), lines[-1:]
        assert "training" not in second.stdout.lower(), second.stdout[-2000:]  # refused before training
        assert first.wait(120) == 0, first.output()[-3000:]
        assert wait_gone(first.marker) == []
    finally:
        first.cleanup()
    result = summary(tmp_path / "model")
    assert result["start_step"] == 0 and result["final_step"] == result["expected_steps"] == 44, result


@pytest.mark.parametrize("processes", [1, 2])
def test_a_job_whose_job_dir_another_job_took_over_stops_writing_there(tmp_path: Path, processes: int) -> None:
    """Another job takes the lease over while this one trains (as a takeover after STALE, or a second job with the
    same identity, would): this job commits nothing more there, writes no summary or export, ends its training
    processes and exits 2, its last line naming the job dir and the new holder; the lease stays the new holder's."""
    job = Job(*run_args(tmp_path, "--epochs", "5", "--checkpoint-every", "4", "--nproc-per-node", str(processes),
                        "--", "--step-sleep", "0.1"))
    try:
        job.wait_for("checkpoint ckpt-00000004 committed")
        other = Holder("o" * 32, "vertex:another:2222:-", "another-host", 4242, 0, time.time(), pidns="pid:[1]",
                       boot="b")
        taken = time.time()
        other.write(tmp_path / LEASE)
        assert job.wait(120) == 2, job.output()[-3000:]
        assert wait_gone(job.marker) == [], "the job's training processes outlived it"
    finally:
        job.cleanup()
    line = last_line(job)
    assert str(tmp_path) in line and "was taken over by another job (pid 4242 on host another-host" in line, line
    late = [path for _step, path in checkpoints.committed(tmp_path / "checkpoints", warn=False)
            if json.loads((path / checkpoints.MARKER).read_text())["committed_at"] > taken]
    assert late == [], f"committed after the takeover: {late}"
    assert not (tmp_path / "model" / "training_summary.json").exists()
    assert not list((tmp_path / "model").glob("*.safetensors")) and not list((tmp_path / "model").glob("*.pt"))
    assert not list((tmp_path / "failures").glob("*.json")), "the displaced job recorded its failure in the dir"
    assert Holder.read(tmp_path / LEASE) == other


def test_a_worker_of_a_job_refused_its_job_dir_records_its_failure_elsewhere(tmp_path: Path) -> None:
    """A refused duplicate's worker on another node waits for its chief in vain and fails (peer_lost at --timeout):
    another job's lease is in the dir, so its record goes to its own temp dir, not into that job's failures/."""
    job_dir, temp = tmp_path / "job", tmp_path / "tmp"
    job_dir.mkdir()
    temp.mkdir()
    Holder("o" * 32, "vertex:127.0.0.1:1:-", "another-host", 4242, 0, time.time(), pidns="pid:[1]",
           boot="b").write(job_dir / LEASE)
    chief, worker = free_ports(2)
    cluster = {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]}
    spec = json.dumps({"cluster": cluster, "environment": "cloud", "task": {"type": "workerpool1", "index": 0}})
    proc = entrypoint(*run_args(job_dir, "--timeout", "5"), env={"CLUSTER_SPEC": spec, "TMPDIR": str(temp)},
                      timeout=120)
    assert proc.returncode == 129, failure_text(proc)
    assert not list((job_dir / "failures").glob("*.json")), "the worker recorded its failure in another job's dir"
    assert list((temp / "trainer-refused" / "failures").glob("*.json")), failure_text(proc)


def local_args(output: Path, *extra: str) -> list[str]:
    return ["local", "--workers", "2", "--output-dir", str(output), "--", "run", "--framework", "pytorch",
            "--timeout", "60", "--module", "tests.pytorch.faults", "--log-every", "2", *extra]


def test_a_refused_duplicate_under_local_writes_nothing_into_the_live_jobs_dir(tmp_path: Path) -> None:
    """A second ``local`` on a live ``local`` job's output dir is refused and writes nothing there: the live job's
    failures/ stays empty of its records, and the live job, losing a worker afterwards, restarts it in place (its
    root cause is never the duplicate's configuration error)."""
    live = Job(*local_args(tmp_path, "--epochs", "2", "--checkpoint-every", "10", "--", "--step-sleep", "0.1"))
    try:
        live.wait_for(r"\[workerpool0-0\].*checkpoint ckpt-00000010 committed")
        record = (tmp_path / "job.json").read_text()
        duplicate = entrypoint(*local_args(tmp_path, "--epochs", "1"), timeout=180)
        assert duplicate.returncode == 2, failure_text(duplicate)
        assert "in use by another live job" in last_line(duplicate) and str(tmp_path) in last_line(duplicate)
        assert not list((tmp_path / "failures").glob("*.json")), "the refused job wrote failure records there"
        assert (tmp_path / "job.json").read_text() == record  # nor its arguments
        vanish(live, "workerpool1-0")
        assert_restarted_in_place(live, "workerpool1-0")
    finally:
        live.cleanup()


@pytest.mark.parametrize(("first", "again", "changed"), [
    (["--epochs", "2"], ["--epochs", "1"], "--epochs"),
    ([], ["--", "--lr", "0.01"], "--lr"),
])
def test_a_rerun_of_a_finished_job_with_other_arguments_says_so(tmp_path: Path, first: list[str], again: list[str],
                                                                 changed: str) -> None:
    base = ["--epochs", "1"]
    proc = entrypoint(*run_args(tmp_path, *base, *first))
    assert proc.returncode == 0, failure_text(proc)
    rerun = entrypoint(*run_args(tmp_path, *base, *again))
    assert rerun.returncode == 0, failure_text(rerun)
    said = [line for line in (rerun.stdout + "\n" + rerun.stderr).splitlines()
            if changed in line and DIFFERS.search(line)]
    assert said, f"the rerun with {' '.join(again)} did not say its arguments differ\n{failure_text(rerun)}"
    assert "finished" in said[0], said[0]  # and that it resumes a job that had finished
    if changed == "--lr":
        assert "optimizer" in said[0], said[0]  # the checkpoint's optimizer state (its learning rate) wins
    again_same = entrypoint(*run_args(tmp_path, *base, *again))  # the same arguments again: nothing to say
    assert again_same.returncode == 0, failure_text(again_same)
    assert not [line for line in again_same.stdout.splitlines() if DIFFERS.search(line) and changed in line]


def test_retention_after_a_fallback_keeps_the_rewritten_checkpoint_without_a_false_warning(tmp_path: Path) -> None:
    args = ["--checkpoint-every", "10", "--keep-checkpoints", "3"]
    proc = entrypoint(*run_args(tmp_path, "--epochs", "1", *args))
    assert proc.returncode == 0, failure_text(proc)
    assert [s for s, _ in checkpoints.committed(tmp_path / "checkpoints", warn=False)] == [30, 40, 44]
    newest = checkpoints.checkpoint_path(tmp_path / "checkpoints", 44)
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # the newest is corrupt: the rerun falls back to ckpt-40
    rerun = entrypoint(*run_args(tmp_path, "--epochs", "2", *args))
    assert rerun.returncode == 0, failure_text(rerun)
    assert f"checkpoint {newest} does not load" in rerun.stdout
    assert "checkpoint ckpt-00000044 committed" in rerun.stdout  # rewritten, good, at the end of epoch 1
    false = [line for line in rerun.stdout.splitlines() if "deleting checkpoint" in line and "does not load" in line]
    assert not false, "retention deleted the rewritten (good) checkpoint as one that does not load:\n" + \
        "\n".join(false)
