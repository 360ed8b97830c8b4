"""The job ledger and ``goodput`` on a real job (docs/goodput.md): a ``local --workers 3`` PyTorch hooks job that
loses a worker in place, is preempted, is rerun, loses a worker under ``--recovery restart`` and finishes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.runs import Job, entrypoint, failure_text, replica_group, summary

pytest.importorskip("torch")  # collected in every venv; these run where torch is
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
RUN = ["--module", "tests.pytorch.faults", "--log-every", "1", "--checkpoint-every", "5", "--timeout", "120",
       "--epochs", "4"]


def local_args(output: Path, *run: str) -> list[str]:
    return ["local", "--workers", "3", "--output-dir", str(output), "--", "run", "--framework", "pytorch", *RUN, *run]


def goodput(job_dir: Path, *args: str) -> dict:
    proc = entrypoint("goodput", str(job_dir), "--json", *args, timeout=120)
    assert proc.returncode == 0, failure_text(proc)
    return json.loads(proc.stdout)


def test_every_second_of_a_disrupted_job_is_accounted_for(tmp_path: Path) -> None:
    out = tmp_path / "job"
    started = time.time()
    first = Job(*local_args(out, "--", "--step-sleep", "0.1"))
    try:
        first.wait_for_step(6)
        os.killpg(replica_group(first, "workerpool1-1"), signal.SIGKILL)  # survivors keep training (in place)
        first.wait_for(r"\[workerpool0-0\] .*group re-formed with 3 replicas at step \d+")
        first.wait_for_step(first.last_step() + 4)
        first.send(signal.SIGTERM)  # preempted: the chief commits the step every rank agreed on
        assert first.wait(300) == 143, first.output()[-4000:]
    finally:
        first.cleanup()
    during = goodput(out)  # a job between its attempts: what it has so far, not provisional (nothing holds it)
    assert not during["provisional"] and during["disruptions"].get("preempted") == 1

    second = Job(*local_args(out, "--recovery", "restart", "--", "--step-sleep", "0.1"))
    try:
        resumed = int(second.wait_for(r"\[workerpool0-0\] .*resumed .*step (\d+)").group(1))
        step = second.wait_for_step(resumed + 7)
        while step % 5 != 1:  # the step after a commit: the kill lands before the next one (4 steps, 0.4 s away;
            step = second.wait_for_step(step + 1)  # with 1-3 steps left, a loaded machine once let a commit in first)
        os.killpg(replica_group(second, "workerpool1-1"), signal.SIGKILL)  # the job restarts from its checkpoint
        assert second.wait(600) == 0, second.output()[-4000:]
    finally:
        second.cleanup()
    measured = time.time() - started
    said = [line for line in second.output().splitlines() if line.startswith("[local] goodput ")]

    report = goodput(out, "--plot", str(tmp_path / "goodput.svg"))
    buckets = report["buckets"]
    assert abs(sum(buckets.values()) - report["wall_seconds"]) < 0.01
    assert abs(report["wall_seconds"] - measured) <= 0.01 * measured, (report["wall_seconds"], measured)
    result = summary(out / "model")
    restarts = [r for r in result["recoveries"] if r["how"] == "restart" and r["cause"] != "preempted"]
    assert restarts and all(r["lost_steps"] > 0 for r in restarts), result["recoveries"]
    assert report["steps"]["lost"] == sum(r["lost_steps"] for r in restarts), (report["steps"], result["recoveries"])
    assert report["steps"]["productive"] == report["steps"]["final"] == result["final_step"]
    assert buckets["wasted_progress"] > 0 and buckets["infrastructure_recovery"] > 0 and buckets["scheduling"] > 0
    assert buckets["evaluation"] > 0 and buckets["export"] > 0  # an evaluation each epoch, the export at the end
    # The restart's cause is the chief's: the lost peer it noticed, or local's SIGTERM restarting the job if first.
    assert report["disruptions"]["preempted"] >= 1 and report["disruptions"]["peer_lost (recovered in place)"] == 1
    assert report["disruption_count"] == 3 and report["job_attempts"] == 3, report["disruptions"]
    assert all(a["end_recorded"] for a in report["attempts"] if a["chief"]), report["attempts"]
    killed = [a for a in report["attempts"] if not a["end_recorded"]]  # the SIGKILLed worker's, as local recorded
    assert [a["replica"] for a in killed] == ["workerpool1-1", "workerpool1-1"], report["attempts"]
    assert all(a["cause"].startswith("signal (exit 137: stopped by SIGKILL") for a in killed), report["attempts"]
    assert {a["replica"] for a in report["attempts"]} == {"workerpool0-0", "workerpool1-0", "workerpool1-1"}
    assert not report["provisional"] and report["goodput_percent"] > 0
    assert result["goodput"]["line"].startswith("goodput ")  # the summary carries the job's goodput so far
    assert (tmp_path / "goodput.svg").read_text().startswith("<svg")
    # local's closing line is what `goodput` reads from the same dir afterwards (its own end recorded first)
    assert said == [f"[local] {report['line']} (python -m entrypoint goodput {out})"], (said, report["line"])


def test_local_names_only_the_outputs_a_script_wrote_and_says_why_its_goodput_is_zero(tmp_path: Path) -> None:
    """A script that saves nothing where the platform points and reports no steps (issue 57's script-mode demos):
    no empty directory is announced as its model, checkpoints or TensorBoard logs, and the goodput of 0 says why."""
    out = tmp_path / "out"
    proc = entrypoint("local", "--output-dir", str(out), "--", "run", "--framework", "pytorch", "--script",
                      "tests/pytorch/sleep_script.py", "--", "0.1", timeout=300)
    assert proc.returncode == 0, failure_text(proc)
    said = [line for line in proc.stdout.splitlines() if line.startswith("[local] ")]
    assert not [line for line in said if line.split()[1] in ("model:", "checkpoints:", "tensorboard:")], said
    assert f"[local] outputs:     none under {out} (no model, checkpoint or TensorBoard files" in proc.stdout
    assert "[local] hypertune:   none reported" in said
    line = next(line for line in said if line.startswith("[local] goodput "))
    assert line.startswith("[local] goodput 0.0%: 0.0 s of ") and "(no training step was recorded (" in line, line
    assert line == f"[local] {goodput(out)['line']} (python -m entrypoint goodput {out})"


def test_a_script_reports_its_steps_through_the_context(tmp_path: Path) -> None:
    """Script mode: attempts, start-up, end and exit class from the node; steps as the script reports them. A rerun
    that starts again at step 11 after the first attempt reached 15 lost steps 11 to 15."""
    job = tmp_path / "job"
    run = ["run", "--framework", "pytorch", "--script", "tests/pytorch/steps_script.py", "--job-dir", str(job)]
    failed = entrypoint(*run, "--", "--fail-after", "15", timeout=300)
    assert failed.returncode == 3, failure_text(failed)
    rerun = entrypoint(*run, "--", "--from", "11", timeout=300)
    assert rerun.returncode == 0, failure_text(rerun)
    report = goodput(job)
    assert report["steps"] == {"productive": 20, "lost": 5, "final": 20, "fewer_replicas": 0}, report["steps"]
    assert report["job_attempts"] == 2 and report["disruption_count"] == 1, report["disruptions"]
    assert report["buckets"]["productive"] > 0 and report["buckets"]["wasted_progress"] > 0
