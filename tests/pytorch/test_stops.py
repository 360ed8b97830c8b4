"""A stop in every phase of the PyTorch hooks loop, with the platform's SIGKILL at the grace period: the newest trained
step is committed (the next attempt loses none), the exit says what was committed, and the job that went through the
stops ends with the weights of the same job never stopped.

Each stop comes at a random moment of its phase (the seed is in the failure message), counted from the line the phase
prints as it starts (``tests/pytorch/faults.py``), never after a fixed sleep from the job's start. The chains and the
stops themselves are ``bench/stops.py``'s, which runs more of them (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from bench import stops
from bench.stops import Stop
from entrypoint.outputs import checkpoints
from tests.metadata import FakeMetadata
from tests.references import faults_digest, reference
from tests.runs import Job, entrypoint, failure_records, failure_text, last_line, summary, vanish, wait_gone

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
FAULTS = ["--framework", "pytorch", "--module", "tests.pytorch.faults", "--log-every", "1", "--timeout", "120"]


def seeded() -> tuple[int, random.Random]:
    seed = random.randrange(1 << 30)
    return seed, random.Random(seed)


def assert_committed(chain: list[Stop], seed: int) -> None:
    """Every stop said, before the platform's kill, that it committed the newest step it trained; none lost one."""
    for stop in chain:
        where = f"seed {seed}: {stop.topology}, {stop.phase} at +{stop.delay} s:\n" + "\n".join(stop.lines[-30:])
        assert stop.ok, where
        assert "preempted on" in stop.last_line and "not committed" not in stop.last_line, where
        if stop.phase == "export":
            assert f"the checkpoint of the final step {stop.committed} is committed" in stop.last_line, where
        elif stop.trained:
            assert f"ckpt-{stop.committed:08d} committed" in stop.last_line, where
        else:
            assert "nothing trained in this attempt, so nothing to commit" in stop.last_line, where


def test_a_stop_in_each_phase_of_one_process_commits_its_newest_step_and_the_job_ends_exactly(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    expected = faults_digest(tmp_path_factory, world=1)
    seed, rng = seeded()
    chain, digest = stops.chain("one process", rng, tmp_path, print)
    assert [s.phase for s in chain] == [p.name for p in stops.PHASES]
    assert_committed(chain, seed)
    assert digest == expected, f"seed {seed}"


@pytest.mark.parametrize("topology", ["local --workers 2", "node of 2 processes"])
def test_a_stop_while_evaluating_or_waiting_for_a_batch_with_two_processes_commits_the_step_every_rank_trained(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, topology: str) -> None:
    expected = faults_digest(tmp_path_factory, world=2)
    seed, rng = seeded()
    phases = {p.name: p for p in stops.phases(topology)}  # bench/stops.py stops both in every phase
    names = ("loader wait", "evaluation") if topology.startswith("local") else \
        ("loader wait, rank 1 only", "evaluation", "export")
    chain, digest = stops.chain(topology, rng, tmp_path, print, tuple(phases[n] for n in names))
    assert_committed(chain, seed)
    assert digest == expected, f"seed {seed}"


@pytest.mark.parametrize("workers", [1, 2])
def test_the_platforms_notice_during_an_evaluation_commits_the_trained_step_before_the_kill(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, workers: int) -> None:
    expected = faults_digest(tmp_path_factory, world=workers)
    seed, rng = seeded()
    run = ["run", *FAULTS, "--grace-period", "10"]
    args = [*run, "--job-dir", str(tmp_path)] if workers == 1 else \
        ["local", "--workers", "2", "--output-dir", str(tmp_path), "--restart-policy", "never", "--", *run]
    with FakeMetadata() as metadata:
        job = Job(*args, "--", "--eval-sleep", "0.4", env={"GCE_METADATA_HOST": metadata.host})
        try:
            job.wait_for("evaluating slowly")
            time.sleep(rng.uniform(0.0, 1.5))
            metadata.values["instance/preempted"] = "TRUE"  # every node's server says so: one VM per replica here
            committed = job.wait_for(r"advance notice from the platform: .*: checkpoint of step (\d+) committed")
            os.killpg(job.proc.pid, signal.SIGKILL)  # the platform's kill: no signal to save on
            assert wait_gone(job.marker) == []
        finally:
            job.cleanup()
    step = int(committed.group(1))
    assert step == job.last_step() == 88 // (2 * workers), f"seed {seed}"  # the epoch's end: its evaluation ran
    assert checkpoints.committed(tmp_path / "checkpoints", warn=False)[-1][0] == step
    proc = entrypoint(*args)
    assert proc.returncode == 0, failure_text(proc)
    assert f"at step {step}" in proc.stdout and summary(tmp_path / "model")["param_digests"][0] == expected


def test_a_node_of_one_process_ends_within_its_grace_period_and_says_nothing_newer_was_committed(
        tmp_path: Path) -> None:
    job = Job("run", *FAULTS, "--job-dir", str(tmp_path), "--grace-period", "4", "--", "--step-sleep", "0.05",
              "--save-sleep", "60")  # a checkpoint write longer than the grace period
    try:
        job.wait_for_step(6)
        sent = job.send(signal.SIGTERM)
        assert job.wait(30) == 143
        took = time.monotonic() - sent
    finally:
        job.cleanup()
    assert took < 4 + 3, took  # it ended itself (less its record's margin), the interpreter's exit included
    (record,) = failure_records(tmp_path)
    assert record["class"] == "preempted_uncommitted" and record["exit_code"] == 143, record
    assert record["step"] == job.last_step() and record["phase"] == "saving before stopping", record
    line = last_line(job)
    assert "stopped by SIGTERM: its grace period ran out while saving before stopping; step " in line, line
    assert "was not committed: the restart starts from the first step (no checkpoint is committed), losing" in line


@pytest.mark.parametrize("policy", ["never", "job"])
def test_a_survivor_waiting_for_its_lost_peers_replacement_commits_when_it_is_stopped(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, policy: str) -> None:
    expected = faults_digest(tmp_path_factory, world=2)
    job = Job("local", "--workers", "2", "--output-dir", str(tmp_path), "--restart-policy", policy, "--", "run",
              *FAULTS, "--grace-period", "10", "--", "--step-sleep", "0.05")
    try:
        job.wait_for_step(8)
        vanish(job, "workerpool1-0")  # its VM is gone: the chief waits for a replacement (survivors keep training)
        # never: local stops the job at once (SIGTERM); job: local stops every replica to restart them all
        stopped = job.wait_for(r"\[workerpool0-0\] .*stopped by SIGTERM while .* after step \d+: checkpoint "
                               r"\S*ckpt-(\d+) committed")
        code = job.wait(300)
    finally:
        job.cleanup()
    step = int(stopped.group(1))
    assert step >= 8 and checkpoints.is_committed(checkpoints.checkpoint_path(tmp_path / "checkpoints", step))
    records = {r["replica"]: r for r in failure_records(tmp_path)}
    assert records["workerpool0-0"]["class"] == "preempted", records
    if policy == "never":
        assert code == 137, job.output()[-3000:]  # the lost worker is the job's root cause
        return
    assert code == 0, job.output()[-3000:]
    assert f"resumed from step {step} (0 steps" in job.output()  # the restart lost nothing past the commit
    assert summary(tmp_path / "model")["param_digests"] == [expected, expected]


def test_a_live_evaluation_and_a_slow_read_making_progress_are_not_hangs(tmp_path: Path) -> None:
    # --hang-timeout 3: an evaluation of 12 batches of 0.4 s and a batch read 32 samples x 0.15 s both last longer
    proc = entrypoint("run", *FAULTS, "--job-dir", str(tmp_path / "live"), "--hang-timeout", "3", "--epochs", "1",
                      "--", "--eval-sleep", "0.4", "--slow-read-at", "5", "--read-sleep", "0.15")
    assert proc.returncode == 0, failure_text(proc)
    # the same read blocked in one sample is a hang, named with the phase it stalled in
    args = ["run", *FAULTS, "--job-dir", str(tmp_path / "hung"), "--hang-timeout", "3", "--epochs", "1", "--",
            "--slow-read-at", "5", "--read-block", "30"]
    first, second = entrypoint(*args), entrypoint(*args)
    assert (first.returncode, second.returncode) == (129, 129), failure_text(first)
    assert "stalled after step 5 while waiting for the next batch" in last_line(first), last_line(first)
    assert "raise" not in last_line(first)
    assert "the same at each of the 2 attempts so far: raise --hang-timeout (now 3 s) if waiting for the next batch " \
        "takes longer" in last_line(second), last_line(second)
    phases = [json.loads(p.read_text())["phase"] for p in sorted((tmp_path / "hung" / "failures").glob("*.json"))]
    assert phases == ["waiting for the next batch", "waiting for the next batch"]


def sharded_digest(factory: pytest.TempPathFactory) -> str:
    """The final weights' digest of the faults module on a node of 2 processes under FSDP, never stopped (FSDP's
    reduce-scatter rounds as DDP's all-reduce does not: ``faults_digest`` is not its reference)."""
    def args(out: Path) -> list[str]:
        return ["run", *FAULTS, "--nproc-per-node", "2", "--strategy", "fsdp", "--job-dir", str(out)]

    out = reference(factory, "faults-fsdp-node-of-2", args).out
    return str(json.loads((out / "model" / "training_summary.json").read_text())["param_digests"][0])


def test_a_sharded_model_stopped_while_its_ranks_wait_for_a_batch_commits_every_shard_of_the_step_every_rank_trained(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    expected = sharded_digest(tmp_path_factory)
    seed, rng = seeded()
    phases = {p.name: p for p in stops.phases("node of 2 processes")}
    # Both ranks wait for their batch (they meet at once); then rank 1 alone, while rank 0 is blocked in the next
    # step's all-gather, waiting for it: rank 1 wakes it, and they commit the step both trained on a group that works.
    waits = (phases["loader wait"], phases["loader wait, rank 1 only"])
    chain, digest = stops.chain("node of 2 processes", rng, tmp_path, print, waits, flags=("--strategy", "fsdp"))
    assert_committed(chain, seed)
    for stop in chain:  # every rank wrote its shards of the step both trained (the rerun prunes them later)
        said = f"checkpoint ckpt-{stop.trained:08d} committed (sharded over 2 ranks)"
        assert any(said in line for line in stop.lines), f"seed {seed}: {stop.phase}:\n" + "\n".join(stop.lines[-30:])
    assert digest == expected, f"seed {seed}"  # the rerun resumed from the last commit and ended exactly
