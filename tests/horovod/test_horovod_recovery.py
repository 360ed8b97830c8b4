"""A Horovod job survives losing a node: `local --restart-policy vertex` (the default) restarts the SIGKILLed
replica in place, the survivor notices within seconds that its peer is gone (Horovod's collectives never time
out: our heartbeat in the rendezvous KV names the silent rank), exits retryable and is restarted too, and the job
resumes from the newest committed checkpoint and ends 0 with one export. The replica's whole process tree is
killed, as a vanished VM: no SIGTERM, no grace; the trigger is a line of the job's output, never a sleep.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.runs import Job, assert_export_is_newest_checkpoint, assert_restarted_in_place, vanish

pytest.importorskip("torch")
pytest.importorskip("horovod.torch")
pytestmark = [pytest.mark.horovod, pytest.mark.slow]


@pytest.mark.parametrize("victim", ["workerpool0-0", "workerpool1-0"])
def test_a_lost_replica_is_restarted_in_place_and_the_job_resumes_from_its_checkpoint(tmp_path: Path,
                                                                                    victim: str) -> None:
    out = tmp_path / "job"
    job = Job("local", "--workers", "2", "--output-dir", str(out), "--", "run", "--framework", "horovod",
              "--module", "tests.pytorch.faults", "--log-every", "2", "--checkpoint-every", "5", "--timeout", "60",
              "--hang-timeout", "20", "--grace-period", "5", "--", "--step-sleep", "0.05")
    try:
        job.wait_for_step(12)
        killed = vanish(job, victim)
        survivor = "workerpool1-0" if victim == "workerpool0-0" else "workerpool0-0"
        job.wait_for(rf"\[local\] {survivor} exited")
        noticed = time.monotonic() - killed
        output = assert_restarted_in_place(job, victim)
    finally:
        job.cleanup()
    assert noticed < 30, f"the survivor noticed the lost peer after {noticed:.0f} s"
    exits = re.findall(r"\[local\] .* exited .*", output)
    # the survivor exits retryable: 129 (peer lost), or the lost peer's own status when it names it as the cause
    assert any(re.search(rf"{survivor} exited 1[2-9]\d \(retryable\): restart 1 of 5", e) for e in exits), exits
    assert len(re.findall(r"\] exported to ", output)) == 1, output[-3000:]
    result = assert_export_is_newest_checkpoint(out)
    assert len(set(result["param_digests"])) == 1  # every rank ended with the same weights
    (lost,) = result["recoveries"]
    assert lost["resumed_from_step"] >= 10 and lost["lost_steps"] == lost["lost_at_step"] - lost["resumed_from_step"]
    assert "recovered after losing" in output
