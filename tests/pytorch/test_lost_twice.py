"""A node lost twice in a row under ``--recovery restart`` (a node preempted again while its replacement starts): the
job goes on within moments, not at ``--timeout``.

The worker node of an FSDP job (2 nodes x 2 processes) is SIGKILLed while it trains; ``local`` restarts it, the
chief's attempt fails on the lost peer and is restarted too, and both meet anew. The worker node is SIGKILLed again
as soon as the chief's new attempt released it from the start-up barrier, before its processes met the others: the
chief's ranks would wait ``--timeout`` for them. Its next replacement says it was restarted, and the chief ends that
attempt at once, naming the node (``pytorch/launch/restarts.py``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.runs import Job, summary, vanish, wait_gone

torch = pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
TIMEOUT = 300  # --timeout: the chief's new attempt would wait this long for the lost node's processes
BOUND = 90  # seconds from the second loss to the chief's attempt ending: far below TIMEOUT, room for a loaded host
RUN = ["run", "--framework", "pytorch", "--module", "tests.pytorch.sharded_hooks", "--timeout", str(TIMEOUT),
       "--log-every", "1", "--nproc-per-node", "2", "--strategy", "fsdp", "--recovery", "restart", "--epochs", "2",
       "--checkpoint-every", "4"]


def test_a_node_lost_again_while_its_replacement_starts_ends_the_chiefs_attempt_at_once(tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job("local", "--workers", "2", "--restart-policy", "vertex", "--output-dir", str(out), "--", *RUN, "--",
              "--step-sleep", "0.2")
    try:
        job.wait_for_step(5)
        vanish(job, "workerpool1-0")
        # the chief's next attempt released both nodes: the worker's processes are starting; lose the node again
        job.wait_for(r"\[workerpool0-0#1\] .*all 2 replicas are here", timeout=240)
        lost = vanish(job, "workerpool1-0")
        job.wait_for(r"\[local\] workerpool0-0 exited \d+ \(retryable\): restart 2 of 5", timeout=TIMEOUT + 60)
        stalled = time.monotonic() - lost
        assert stalled < BOUND, f"the chief's attempt ended {stalled:.0f} s after the second loss:\n" + \
            job.output()[-4000:]
        assert job.wait(420) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    output = job.output()
    # the chief said why it ended its attempt, naming the node restarted meanwhile
    said = r"\[workerpool0-0#1\] .*workerpool1\[0\] \(\S+\) \(node 1\) was restarted while this attempt ran"
    assert re.search(said, output), output[-4000:]
    assert "[workerpool1-0#2]" in output and "[workerpool0-0#2]" in output
    # the killed node's processes died with it: none of them reported the node's vanished plan as a config error
    assert "cannot read the plan" not in output, output[-4000:]
    result = summary(out / "model")
    assert result["final_step"] == result["expected_steps"] and result["world_size"] == 4
