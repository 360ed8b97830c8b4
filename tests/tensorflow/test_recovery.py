"""A TensorFlow job survives losing a node: `local --restart-policy vertex` (the default) restarts the SIGKILLed
replica in place, as Vertex AI does, and the job ends 0 with one export, the newest committed checkpoint and the
summary at the last step, and no process left, for every role: MultiWorkerMirrored's chief and worker,
ParameterServer's ps, worker and evaluator. A restarted ps or PS worker serves again at once; losing the ps
restarts the chief too (it names the lost ps), losing a worker and the evaluator at once restarts nothing else. The
replica's whole process tree is killed, as a vanished VM: no SIGTERM, no grace; triggers are lines of the job's
output, never sleeps.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from entrypoint.outputs.checkpoints import committed
from tests.conftest import skip_unless_installed
from tests.runs import Job, assert_restarted_in_place, summary, vanish
from tests.tensorflow.runs import SLOW

skip_unless_installed("tensorflow")
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
RUN = ["run", "--framework", "tensorflow", "--module", SLOW, "--log-every", "2", "--timeout", "60",
       "--hang-timeout", "30", "--grace-period", "5"]


def start(out: Path, *local: str, run: tuple[str, ...] = ()) -> Job:
    return Job("local", *local, "--output-dir", str(out), "--", *RUN, *run)


def assert_consistent(job: Job, out: Path, *victims: str, rerun: int = 0) -> dict[str, object]:
    """Each victim restarted in place, exported once, the newest committed checkpoint is the summary's last step: the
    expected one, or up to ``rerun`` more (steps TensorFlow's coordinator ran again after losing the worker running
    them)."""
    output = assert_restarted_in_place(job, *victims)
    assert output.count("exported the model to") == 1, output[-3000:]
    result = summary(out / "model")
    assert committed(out / "checkpoints")[-1][0] == result["final_step"], result
    assert 0 <= int(result["final_step"]) - int(result["expected_steps"]) <= rerun, result
    assert (out / "model" / "saved_model.pb").is_file()
    if "[workerpool0-0#1]" in output:  # the chief started again: it resumed, and the lost work is on record
        assert result["recoveries"], "the lost work is on record"
        assert "recovered after losing" in output
        lost = result["recoveries"][-1]  # type: ignore[index]
        assert lost["resumed_from_step"] == result["start_step"]  # BackupAndRestore's step, maybe mid-epoch
    return result


def test_multi_worker_mirrored_survives_losing_its_worker_then_its_chief(tmp_path: Path) -> None:
    """One job loses each replica in turn (one job each before: the same start-up and training twice): the worker in
    epoch 3, then the restarted chief in epoch 4, each after a commit. Each time the survivor notices within
    --timeout, ``local`` restarts both in place, and the job resumes from the backup and ends as one that lost a
    single replica does."""
    out = tmp_path / "job"
    job = start(out, "--workers", "2", run=("--checkpoint-every", "8"))
    losses = (("workerpool1-0", "workerpool0-0", 40), ("workerpool0-0", "workerpool1-0", 56))  # of 64 steps
    noticed = []
    try:
        for number, (victim, survivor, step) in enumerate(losses, 1):
            job.wait_for_step(step)
            killed = vanish(job, victim)
            job.wait_for(rf"\[local\] {survivor} exited \d+ \(retryable\): restart {number} of", timeout=240)
            noticed.append(time.monotonic() - killed)
        result = assert_consistent(job, out, "workerpool1-0")  # the first loss: restart 1 of its replica
    finally:
        job.cleanup()
    output = job.output()
    assert re.search(r"\[local\] workerpool0-0 exited 137 \(retryable\): restart 2 of 5", output), output[-3000:]
    assert "[workerpool0-0#2]" in output and "[workerpool1-0#2]" in output  # both restarted again, in place
    assert "job restart" not in output, output[-3000:]
    assert all(n < 60 + 15 for n in noticed), f"the survivor noticed the lost peer after {noticed} s (--timeout 60)"
    assert result["strategy"] == "MultiWorkerMirroredStrategy"
    assert len(result["recoveries"]) == 2, result["recoveries"]  # each loss on record


def test_parameter_server_survives_losing_its_ps_then_a_worker_and_the_evaluator(tmp_path: Path) -> None:
    """One job (two before: the same five processes started and trained twice). The ps is lost in epoch 2: TensorFlow's
    coordinator cannot outlive it, so the chief names it and restarts with it. Once the restarted chief trains on, a
    worker and the evaluator, two VMs gone at once, restart in place while the coordinator carries on."""
    out = tmp_path / "job"
    job = start(out, "--workers", "2", "--ps", "1", "--evaluators", "1", run=("--epochs", "6"))  # 192 steps
    try:
        job.wait_for_step(40)
        vanish(job, "workerpool2-0")
        job.wait_for(r"\[local\] workerpool0-0 exited (129|137) \(retryable\): restart 1 of 5", timeout=240)
        job.wait_for_step(96, timeout=240)  # the restarted chief trained past where the ps was lost
        chief_exits = job.output().count("[local] workerpool0-0 exited")
        for victim in ("workerpool1-0", "workerpool3-0"):  # each restarted on its own
            vanish(job, victim)
        # A worker lost with a step in flight: the coordinator runs it again elsewhere (at least once), and its
        # update may already have reached the ps.
        result = assert_consistent(job, out, "workerpool2-0", "workerpool1-0", "workerpool3-0", rerun=1)
    finally:
        job.cleanup()
    assert result["strategy"] == "ParameterServerStrategy"
    output = job.output()
    assert "job restart" not in output, output[-3000:]  # recovered by restarts in place, no whole-job retry
    # The ps: its last line is the chief's own failure, or (when `local` recorded the ps's SIGKILL first) that failure
    # "because of an earlier failure" and then the ps's SIGKILL as the root cause, whose exit code it takes.
    assert re.search(r"\[workerpool0-0\] entrypoint: .*peer_lost.*lost workerpool2\[0\] "
                     r"\(127\.0\.0\.1:\d+\) .*during training", output), output[-3000:]
    # The restarted chief's first closures can fail once more: a worker that kept dialing the dead chief is still in
    # gRPC's reconnect backoff when the new one dispatches, and TensorFlow turns that UnavailableError into an
    # InternalError its coordinator does not retry (seen under load). The chief restarts again and resumes; nothing
    # but the chief and the ps restarts after the ps is lost.
    restarted = re.findall(r"\[local\] (\S+) exited \d+ \(retryable\): restart", output)
    chief_restarts = restarted.count("workerpool0-0")
    assert sorted(restarted) == ["workerpool0-0"] * chief_restarts + ["workerpool1-0", "workerpool2-0",
                                                                      "workerpool3-0"], output[-3000:]
    assert f"after {3 + chief_restarts} replica restart(s)" in output
    # A worker and the evaluator: the coordinator carried on while they restarted and served again.
    assert output.count("[local] workerpool0-0 exited") == chief_exits, output[-3000:]
    evaluated = [json.loads(line) for line in (out / "logs" / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert evaluated[-1]["step"] == result["final_step"]  # the restarted evaluator saw the last checkpoint
    assert re.search(r"\[workerpool3-0#1\] .*training is done", output)
