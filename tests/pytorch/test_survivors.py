"""Survivors keep training (the PyTorch hooks loop across nodes, ``--recovery in-place``, the default): a lost
worker's replacement joins the live group and is healed from rank 0; the survivors keep their processes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from tests.runs import Job, entrypoint, failure_records, failure_text, last_line, replica_group, summary, wait_gone

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
RUN = ["--module", "tests.pytorch.faults", "--log-every", "2", "--checkpoint-every", "5", "--timeout", "120"]


def local_args(output: Path, run: list[str], *local: str) -> list[str]:
    return ["local", "--workers", "3", "--output-dir", str(output), *local, "--", "run", "--framework", "pytorch",
            *run]




def batches(output: Path) -> dict[str, list[str]]:
    """Every rank's batches in the order it trained them, a batch retried after a failure counted once."""
    seen = {}
    for record in sorted((output / "batches").glob("rank*.txt")):
        digests = record.read_text().split()
        seen[record.stem] = [d for i, d in enumerate(digests) if i == 0 or d != digests[i - 1]]
    return seen


def test_a_lost_worker_is_replaced_in_place_and_training_continues_as_uninterrupted(tmp_path: Path) -> None:
    """World 3: the same global batches in the same order, the replicas in sync, and the final weights those of an
    uninterrupted run up to float rounding: the first step after re-forming sums the gradients of three ranks
    in another order (a new DDP buckets them as DDP always does at first; an uninterrupted run has rebuilt its
    buckets by then), and a sum of three floats depends on its order; with two ranks it would not."""
    run = [*RUN, "--", "--step-sleep", "0.1", "--record-batches"]
    reference = entrypoint(*local_args(tmp_path / "reference", run), timeout=600)
    assert reference.returncode == 0, failure_text(reference)
    expected = summary(tmp_path / "reference" / "model")["param_digests"]
    out = tmp_path / "job"
    job = Job(*local_args(out, run))
    try:
        job.wait_for_step(8)
        survivors = {name: replica_group(job, name) for name in ("workerpool0-0", "workerpool1-0")}
        os.killpg(replica_group(job, "workerpool1-1"), signal.SIGKILL)
        killed = time.monotonic()
        job.wait_for(r"\[workerpool0-0\] .*group re-formed with 3 replicas at step \d+, healed rank 2 from rank 0")
        reformed = time.monotonic() - killed
        for name, pid in survivors.items():
            assert replica_group(job, name) == pid, f"{name} was restarted"  # the survivors kept their processes
        assert job.wait(300) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    output = job.output()
    assert "[workerpool0-0#1]" not in output and "[workerpool1-0#1]" not in output
    assert "[workerpool1-1#1]" in output and "joined the group (generation 1)" in output
    result = summary(out / "model")
    assert len(set(result["param_digests"])) == 1 and len(result["param_digests"]) == len(expected)
    assert batches(out) == batches(tmp_path / "reference"), "another sequence of global batches"
    mine, theirs = torch.load(out / "model" / "state_dict.pt"), torch.load(tmp_path / "reference" / "model" /
                                                                             "state_dict.pt")
    assert all(torch.allclose(mine[k], theirs[k], rtol=0, atol=1e-6) for k in theirs)
    (lost,) = result["recoveries"]
    assert lost["how"] == "in_place" and lost["replica"] == "workerpool1-1"
    assert lost["lost_steps"] <= 1 and lost["resumed_from_step"] >= 8
    assert reformed < 90, f"re-forming took {reformed:.0f} s"


def test_a_replacement_with_another_model_is_refused_and_the_job_falls_back_to_its_checkpoint(
        tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job(*local_args(out, [*RUN, "--", "--step-sleep", "0.1", "--hidden-on-restart", "64"]))
    try:
        job.wait_for_step(8)
        os.killpg(replica_group(job, "workerpool1-1"), signal.SIGKILL)
        job.wait_for(r"the replacement of workerpool1-1 was refused: it has model parameters")
        assert job.wait(420) == 0, job.output()[-4000:]  # every replica restarted from the checkpoint, then trained
    finally:
        job.cleanup()
    output = job.output()
    assert "back to the newest checkpoint" in output
    assert "recovered after losing" in output


def test_a_replacement_that_never_comes_sends_the_survivors_back_to_the_checkpoint(tmp_path: Path) -> None:
    # Three nodes and no supervisor: nothing restarts the lost one, and nothing stops the survivors (a supervisor's
    # SIGTERM would end their wait at once with a commit: test_stops.py).
    out = tmp_path / "job"
    ports = free_ports(3)
    cluster = {"workerpool0": [f"127.0.0.1:{ports[0]}"], "workerpool1": [f"127.0.0.1:{p}" for p in ports[1:]]}

    def node(pool: str, index: int) -> Job:
        spec = {"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": index}}
        return Job("run", "--framework", "pytorch", *RUN, "--timeout", "8", "--job-dir", str(out), "--",
                   "--step-sleep", "0.1", env={"CLUSTER_SPEC": json.dumps(spec)})

    nodes = [node("workerpool0", 0), node("workerpool1", 0), node("workerpool1", 1)]
    try:
        nodes[0].wait_for_step(6)
        os.killpg(nodes[2].proc.pid, signal.SIGKILL)
        assert [job.wait(180) for job in nodes[:2]] == [129, 129], nodes[0].output()[-3000:]
    finally:
        for job in nodes:
            job.cleanup()
    # The consequence's line is clipped to its last-line length; its record keeps the whole message.
    messages = [record["message"] for record in failure_records(out)]
    assert any("gave up after 8 s (--timeout) waiting for workerpool1-1" in m for m in messages), \
        nodes[0].output()[-3000:]
    assert "workerpool1-1" in last_line(nodes[0])
