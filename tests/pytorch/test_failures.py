"""The failure contract with real PyTorch processes: every exit-code row, the record, the last line, no secrets.

docs/EXIT_CODES.md is the table these tests walk: 1, 2, 73, 74, 129 (peer lost, frozen, missing, hang),
137, 196; 143 and 130 are in test_preemption.py and test_pytorch_jobs.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from tests.runs import Job, entrypoint, failure_records, failure_text, last_line, wait_gone

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
RECORD_KEYS = {"schema_version", "replica", "rank", "host", "pid", "exit_code", "class", "retryable", "message",
               "traceback", "time", "time_utc"}
CANARIES = {"WANDB_API_KEY": "canary-wandb-1f2e", "AWS_SECRET_ACCESS_KEY": "canary-aws-9c8d"}


def run_args(job_dir: Path, *extra: str) -> list[str]:
    return ["run", "--framework", "pytorch", "--job-dir", str(job_dir), "--module", "tests.pytorch.faults",
            "--log-every", "2", *extra]


def two_nodes(*pools: str) -> dict[str, dict[str, str]]:
    """A hand-made Vertex CLUSTER_SPEC per pool on free local ports."""
    chief, worker = free_ports(2)
    cluster = {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]}
    return {pool: {"CLUSTER_SPEC": json.dumps({"cluster": cluster, "environment": "cloud",
                                               "task": {"type": pool, "index": 0}})} for pool in pools}


@contextlib.contextmanager
def mounted(kind: str, target: Path) -> Iterator[Path]:
    """A read-only bind mount or a tiny tmpfs at ``target`` (skip where this machine cannot mount)."""
    target.mkdir(parents=True, exist_ok=True)
    command = (["mount", "--bind", "-o", "ro", str(target), str(target)] if kind == "ro"
               else ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(target)])
    if os.geteuid() != 0 or subprocess.run(command, capture_output=True).returncode != 0:
        pytest.skip(f"cannot mount a {kind} file system here")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=False)


def test_user_error_record_last_line_and_no_secret_anywhere(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    job_canary = "canary-job-7a6b"
    spec = {"cluster": {"workerpool0": [f"127.0.0.1:{port}"]}, "environment": "cloud",
            "task": {"type": "workerpool0", "index": 0}, "job": {"args": [f"--api-key={job_canary}"]}}
    env = {**CANARIES, "CLUSTER_SPEC": json.dumps(spec)}
    proc = entrypoint(*run_args(tmp_path, "--", "--fault", "raise", "--api-token", "canary-arg-3d4c"), env=env)
    assert proc.returncode == 1, failure_text(proc)
    (record,) = failure_records(tmp_path)
    assert set(record) >= RECORD_KEYS
    assert (record["class"], record["exit_code"], record["retryable"], record["replica"], record["rank"]) == (
        "user_code", 1, False, "workerpool0-0", 0)
    assert "ValueError: cannot reach the tracker" in record["message"] and "compute_loss" in record["traceback"]
    line = last_line(proc)
    assert line.startswith("entrypoint: error: user_code on workerpool0-0, rank 0, host ")
    assert line.endswith("(exit 1, permanent)") and "ValueError" in line
    secrets = [*CANARIES.values(), job_canary, "canary-arg-3d4c"]
    texts = [proc.stdout, proc.stderr] + [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    leaks = [s for s in secrets for t in texts if s in t]
    assert leaks == [], leaks


def test_a_frozen_peer_is_lost_within_the_timeout(tmp_path: Path) -> None:
    specs = two_nodes("workerpool0", "workerpool1")
    # --recovery restart: the detection alone is timed here (in place, the survivor would then also wait up to
    # --timeout for a replacement that a frozen peer never gets; docs/recovery.md)
    nodes = [Job(*run_args(tmp_path / pool, "--timeout", "10", "--recovery", "restart", "--", "--step-sleep", "0.05"),
                 env=env) for pool, env in specs.items()]
    try:
        nodes[0].wait_for_step(6)
        os.kill(nodes[1].proc.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        assert nodes[0].wait(60) == 129, nodes[0].output()[-3000:]
        # --timeout 10 s and the survivor's exit, with room for a loaded machine (gloo's own wait would be 30 min)
        assert time.monotonic() - frozen < 10 + 30
        # The heartbeats name the frozen peer, not the address and port gloo gives.
        line = last_line(nodes[0])
        assert line.startswith("entrypoint: error: peer_lost on workerpool1-0, rank 1"), line
        assert "stopped responding" in line
        records = failure_records(tmp_path / "workerpool0")
        assert all(r["retryable"] for r in records)
        assert {(r["replica"], r.get("reported_by")) for r in records} == {
            ("workerpool1-0", "workerpool0-0 (rank 0)"), ("workerpool0-0", None)}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(nodes[1].proc.pid, signal.SIGCONT)
        for job in nodes:
            job.cleanup()


@pytest.mark.parametrize("present", ["workerpool0", "workerpool1"])
def test_a_missing_peer_is_named_while_waiting_and_the_timeout_holds(tmp_path: Path, present: str) -> None:
    env = two_nodes(present)[present]
    absent = json.loads(env["CLUSTER_SPEC"])["cluster"]["workerpool1" if present == "workerpool0" else "workerpool0"]
    waiting = "waiting for 1 of 1 peers: workerpool1[0]" if present == "workerpool0" else (
        "waiting for the chief workerpool0[0]")
    job = Job(*run_args(tmp_path, "--timeout", "10"), env=env)
    try:
        # Timed from the wait's first line, not from the start: imports under load are not the wait's.
        job.wait_for(re.escape(waiting) + r".*left of --timeout 10", timeout=120)
        seen = time.monotonic()
        assert job.wait(120) == 129, job.output()[-3000:]
        waited = time.monotonic() - seen
    finally:
        job.cleanup()
    # The wait ends at --timeout (the line comes after its first try), not at the default of 300 s.
    assert 10 - 2 <= waited < 10 + 30, job.output()[-3000:]
    assert "gave up after 10 s (--timeout) waiting for" in last_line(job) and absent[0] in last_line(job)


def test_an_unresolvable_chief_host_is_retryable(tmp_path: Path) -> None:
    spec = {"cluster": {"workerpool0": ["no-such-host.invalid:2222"], "workerpool1": ["127.0.0.1:2223"]},
            "environment": "cloud", "task": {"type": "workerpool1", "index": 0}}
    proc = entrypoint(*run_args(tmp_path, "--timeout", "4"), env={"CLUSTER_SPEC": json.dumps(spec)})
    assert proc.returncode == 196, failure_text(proc)
    assert "does not resolve yet" in proc.stdout
    assert last_line(proc).startswith("entrypoint: error: host_unresolvable on workerpool1-0")


def test_a_stalled_rank_dumps_its_stacks_and_fails_retryable(tmp_path: Path) -> None:
    # The step clock starts once the first step is over (the start-up before it has --startup-timeout); 20 s between
    # two steps leaves a loaded machine room (docs/testing.md).
    proc = entrypoint(*run_args(tmp_path, "--hang-timeout", "20", "--", "--fault", "hang", "--at-step", "5"))
    assert proc.returncode == 129, failure_text(proc)
    assert "most recent call first" in proc.stderr and "compute_loss" in proc.stderr  # faulthandler's dump
    (record,) = failure_records(tmp_path)
    assert record["class"] == "hang" and "stalled after step 4 while in a training step" in record["message"]
    assert "hang on " in last_line(proc)


def test_a_read_only_output_directory_fails_before_training(tmp_path: Path) -> None:
    with mounted("ro", tmp_path / "readonly") as readonly:
        proc = entrypoint(*run_args(tmp_path, "--model-dir", str(readonly / "model")))
    assert proc.returncode == 73, failure_text(proc)
    assert "epoch 1/" not in proc.stdout  # found before any training time was spent
    (record,) = failure_records(tmp_path)
    assert record["class"] == "output_not_writable" and str(readonly / "model") in record["message"]
    assert last_line(proc).endswith("(exit 73, permanent)")


def test_a_full_disk_fails_clearly_and_leaves_no_partial_checkpoint(tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "small") as small:
        proc = entrypoint(*run_args(tmp_path, "--checkpoint-dir", str(small), "--", "--hidden", "2048"))
        left = sorted(p.name for p in small.iterdir())
    assert proc.returncode == 74, failure_text(proc)
    assert left == []  # the torn checkpoint was removed, not left filling the disk
    (record,) = failure_records(tmp_path)
    assert record["class"] == "disk_full" and "no space left on device" in record["message"]
    assert str(small) in last_line(proc) and last_line(proc).endswith("(exit 74, permanent)")


def test_a_replica_killed_from_outside_is_the_root_cause(tmp_path: Path) -> None:
    job = Job("local", "--workers", "2", "--output-dir", str(tmp_path), "--restart-policy", "never", "--",
              *run_args(tmp_path, "--timeout", "30", "--", "--step-sleep", "0.05"))
    try:
        job.wait_for_step(4)
        victim = next(pid for pid in job.left() if b"workerpool1-0" in Path(f"/proc/{pid}/environ").read_bytes()
                      and pid != job.proc.pid)
        os.kill(victim, signal.SIGKILL)  # e.g. the out-of-memory killer
        assert job.wait(90) == 137, job.output()[-3000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    assert last_line(job).startswith("entrypoint: error: signal on workerpool1-0") and "SIGKILL" in last_line(job)
    assert "stopping the others" in job.output()


def test_large_options_reach_every_worker_whole(tmp_path: Path) -> None:
    blob_a, blob_b = "a" * 70_000, "b" * 70_000
    proc = entrypoint(*run_args(tmp_path, "--nproc-per-node", "2", "--epochs", "1", "--", "--blob-a", blob_a,
                                "--blob-b", blob_b))
    assert proc.returncode == 0, failure_text(proc)
    assert json.loads((tmp_path / "model" / "blobs.json").read_text()) == {"a": 70_000, "b": 70_000}


def test_a_rejected_user_argument_is_named_by_its_flag_only(tmp_path: Path) -> None:
    proc = entrypoint(*run_args(tmp_path, "--", "--lr", "canary-not-a-number"))
    assert proc.returncode == 2, failure_text(proc)
    assert "argument --lr" in last_line(proc)
    assert "canary-not-a-number" not in proc.stdout + proc.stderr


def test_a_peer_that_failed_on_its_own_is_not_called_lost(tmp_path: Path) -> None:
    """The worker raises: its process ends with its own record, and its liveness port then refuses the chief at once.
    The chief ends as that failure's consequence, naming it; no verdict calls the worker lost (it was not)."""
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--restart-policy", "never", "--",
                      *run_args(tmp_path, "--timeout", "30", "--recovery", "restart", "--", "--fault", "raise",
                                "--fault-replica", "workerpool1-0", "--at-step", "4", "--step-sleep", "0.05"),
                      timeout=300)
    assert proc.returncode == 1, failure_text(proc)
    records = failure_records(tmp_path)
    assert [r for r in records if r.get("reported_by")] == [], records  # no peer_lost verdict on its behalf
    assert [(r["replica"], r["class"]) for r in records if r["replica"] == "workerpool1-0"] == [
        ("workerpool1-0", "user_code")], records
    lost = [r["message"] for r in records if r["class"] == "peer_lost"]  # the chief's (unless local's stop came first)
    assert all("workerpool1-0 (rank 1, host " in m and "ended on its own failure (user_code: ValueError" in m
               for m in lost), lost
    assert last_line(proc).startswith("entrypoint: error: user_code on workerpool1-0, rank 1, ")
