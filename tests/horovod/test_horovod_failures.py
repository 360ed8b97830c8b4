"""Preemption and lost peers with real Horovod processes (launched without ssh): same contract as PyTorch."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs import checkpoints
from tests.runs import Job, entrypoint, failure_records, failure_text, last_line, summary, wait_gone

pytest.importorskip("horovod.torch")
pytestmark = [pytest.mark.horovod, pytest.mark.slow]


def run_args(*extra: str) -> list[str]:
    return ["run", "--framework", "horovod", "--module", "tests.pytorch.faults", "--log-every", "2", *extra]


@pytest.mark.parametrize("where", ["one node", "local"])
def test_sigterm_stops_every_rank_at_one_step_and_the_restart_resumes_there(tmp_path: Path, where: str) -> None:
    run = run_args("--timeout", "60", "--job-dir", str(tmp_path), "--", "--step-sleep", "0.05")
    args = run if where == "one node" else ["local", "--workers", "2", "--output-dir", str(tmp_path), "--", *run]
    job = Job(*args)
    try:
        job.wait_for_step(6)
        sent = job.send(signal.SIGTERM)
        assert job.wait(60) == 143, job.output()[-3000:]
        assert time.monotonic() - sent < 30  # within the platform's 30 s grace period
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    step = checkpoints.committed(tmp_path / "checkpoints", warn=False)[-1][0]
    assert step >= job.last_step()
    assert {r["class"] for r in failure_records(tmp_path)} == {"preempted"}
    rerun = entrypoint(*args)
    assert rerun.returncode == 0, failure_text(rerun)
    result = summary(tmp_path / "model")
    assert result["start_step"] == step and result["final_step"] == result["expected_steps"]
    assert len(set(result["param_digests"])) == 1


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_lost_peer_is_retryable_on_the_survivor(tmp_path: Path, how: str) -> None:
    chief, worker = free_ports(2)
    cluster = {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]}
    nodes = []
    for pool in ("workerpool0", "workerpool1"):
        spec = {"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": 0}}
        nodes.append(Job(*run_args("--job-dir", str(tmp_path / pool), "--timeout", "30", "--hang-timeout", "10",
                                   "--", "--step-sleep", "0.05"), env={"CLUSTER_SPEC": json.dumps(spec)}))
    try:
        nodes[0].wait_for_step(6)
        victims = [p for p in nodes[1].left() if p != nodes[1].proc.pid]  # the node's Horovod process
        for pid in victims:
            os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        lost = time.monotonic()
        assert nodes[0].wait(90) == 129, nodes[0].output()[-3000:]
        # named by --hang-timeout (10 s; Horovod's collectives never time out), with slack for a loaded machine
        assert time.monotonic() - lost < 60
        expected = "peer_lost" if how == "killed" else "hang"
        # the survivor's verdict names the culprit: the replica whose heartbeat stopped, not the survivor itself
        line = last_line(nodes[0])
        assert line.startswith(f"entrypoint: error: {expected} on workerpool1-0"), line
        assert "stopped responding" in line and "(exit 129, retryable)" in line
    finally:
        for pid in nodes[1].left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for job in nodes:
            job.cleanup()


def test_a_stop_while_waiting_for_a_batch_or_evaluating_commits_the_newest_step_over_horovod(tmp_path: Path) -> None:
    """The hooks loop Horovod shares with PyTorch: a slow batch on every rank or on rank 1 alone, and the evaluation, do
    not hold a stop (``bench/stops.py``'s chain, ``--framework horovod`` on a node of two processes)."""
    from bench import stops

    seed = random.randrange(1 << 30)
    phases = {p.name: p for p in stops.phases("node of 2 processes")}
    only = (phases["loader wait"], phases["loader wait, rank 1 only"], phases["evaluation"])
    chain, digest = stops.chain("node of 2 processes", random.Random(seed), tmp_path, print, only,
                                ("--framework", "horovod"))
    for stop in chain:
        assert stop.ok and "not committed" not in stop.last_line, f"seed {seed}, {stop.phase}:\n" + \
            "\n".join(stop.lines[-30:])
        assert f"ckpt-{stop.committed:08d} committed" in stop.last_line, stop.last_line
    assert len(set(summary(tmp_path / "node-of-2-processes" / "model")["param_digests"])) == 1 and digest
