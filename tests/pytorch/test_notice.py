"""The platform's advance notice with real PyTorch processes: a fake metadata server on 127.0.0.1 per node
(``GCE_METADATA_HOST``) says the worker's VM is being reclaimed; every rank commits that step at once, outside the
cadence, and the job trains on to its normal end. The notice is given when the job's own output shows a step,
never after a fixed sleep."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup.ports import free_ports
from entrypoint.outputs import checkpoints
from tests.metadata import FakeMetadata
from tests.runs import Job, entrypoint, failure_text, summary

pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
STEPS_PER_EPOCH = 22  # the digits at batch 32 on two replicas
COMMITTED = (r"advance notice from the platform: (.+): checkpoint of step (\d+) committed; training goes on until the "
             r"signal")


def test_a_reclaim_notice_on_the_worker_commits_a_checkpoint_at_once_and_training_goes_on(tmp_path: Path) -> None:
    chief, worker = free_ports(2)
    cluster = {"workerpool0": [f"127.0.0.1:{chief}"], "workerpool1": [f"127.0.0.1:{worker}"]}
    with FakeMetadata() as quiet, FakeMetadata() as reclaimed:
        def node(pool: str, server: FakeMetadata) -> Job:
            spec = {"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": 0}}
            return Job("run", "--framework", "pytorch", "--module", "tests.pytorch.faults", "--job-dir", str(tmp_path),
                       "--timeout", "120", "--log-every", "2", "--grace-period", "0.001", "--", "--step-sleep", "0.1",
                       env={"CLUSTER_SPEC": json.dumps(spec), "GCE_METADATA_HOST": server.host})

        nodes = [node("workerpool0", quiet), node("workerpool1", reclaimed)]
        try:
            nodes[0].wait_for_step(4)
            reclaimed.values["instance/preempted"] = "TRUE"  # only the worker's VM is reclaimed
            heard = nodes[1].wait_for(r"advance notice from the platform: preempted \(instance/preempted\) on "
                                      r"workerpool1-0: every rank commits a checkpoint at the next step boundary")
            match = nodes[0].wait_for(COMMITTED)
            assert [job.wait(300) for job in nodes] == [0, 0], nodes[0].output()[-3000:]
        finally:
            for job in nodes:
                job.cleanup()
    assert heard
    what, step = match.group(1), int(match.group(2))
    assert what == "preempted (instance/preempted) on 1 node"  # heard on the worker, learned by the chief in the vote
    assert step > 4 and step % STEPS_PER_EPOCH, step  # outside the cadence (epoch ends only)
    chief_log = nodes[0].output()
    assert len(re.findall(COMMITTED, chief_log)) == 1  # once per notice, not at every step
    marker = checkpoints.read_marker(checkpoints.checkpoint_path(tmp_path / "checkpoints", step))
    assert marker["step"] == step
    result = summary(tmp_path / "model")
    assert result["final_step"] == result["expected_steps"] == 2 * STEPS_PER_EPOCH  # trained on to the end
    # The first save took longer than --grace-period 0.001 s: the chief says so once, naming the flag.
    warnings = re.findall(r"the last checkpoint \(ckpt-\d+\) took [\d.]+ s to save, longer than --grace-period "
                          r"0.001 s", chief_log)
    assert len(warnings) == 1, chief_log[-3000:]
    assert quiet.refused == reclaimed.refused == 0  # every request carried Metadata-Flavor: Google
    # A rerun resumes from the final checkpoint: its save time (in its marker) is checked before this run saves any.
    rerun = entrypoint("run", "--framework", "pytorch", "--module", "tests.pytorch.faults", "--job-dir", str(tmp_path),
                       "--epochs", "3", "--grace-period", "0.001")
    assert rerun.returncode == 0, failure_text(rerun)
    assert re.search(r"the last checkpoint \(ckpt-00000044\) took [\d.]+ s to save, longer than --grace-period 0.001 s",
                     rerun.stdout), rerun.stdout[-3000:]
