"""Google's ``ml-goodput-measurement`` (the real package) reads the entries our chief prints with
``TRAINER_GOODPUT_JOB_NAME`` set, through a fake Cloud Logging reader, and agrees with our ``goodput`` command
(docs/goodput.md, "ml-goodput-measurement"): a ``local --workers 2`` PyTorch hooks job, once undisturbed and once
losing its worker to SIGKILL under ``--recovery restart`` (the job restarts from its checkpoint).

The two definitions differ, so the comparison is of the same quantity: ours recomputed the way the package counts
(``as_theirs``); both raw numbers are printed (``pytest -s``) and the package's is never below ours."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from entrypoint.outputs.goodput import ledger
from tests.conftest import skip_unless_installed
from tests.runs import Job, entrypoint, failure_text, replica_group, wait_gone

pytest.importorskip("torch")  # collected in every venv; these run where torch is
skip_unless_installed("ml_goodput_measurement")  # imported by theirs(): 2.8 s of CPU (Cloud Monitoring's client)
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
JOB_NAME = "goodput-reference"
RUN = ["--module", "tests.pytorch.faults", "--checkpoint-every", "5", "--log-every", "1", "--timeout", "120"]
# The chief's lines, any attempt (``local`` prefixes them with the replica and, after a restart, the attempt).
ENTRY = re.compile(r"^\[workerpool0-0(?:#\d+)?\] (\{\"severity\": \"INFO\", \"job_name\": .*\})\s*$")
POINTS = 2.0  # the bound on the difference


def local_args(output: Path, *run: str) -> list[str]:
    return ["local", "--workers", "2", "--output-dir", str(output), "--", "run", "--framework", "pytorch", *RUN,
            *run, "--", "--step-sleep", "0.05"]


class FakeCloudLogging:
    """What ``GoodputCalculator`` calls on its ``cloud_logger`` (the package's ``_CloudLogger``): the job's entries,
    in the order the chief printed them (Cloud Logging's timestamp order), each with an insert id; a read after
    the last entry seen returns the newer ones."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries
        self.job_start_time: datetime.datetime | None = None

    def read_cloud_logging_entries(self, start_time: Any = None, end_time: Any = None,
                                   last_entry_info: tuple[Any, str] | None = None
                                   ) -> tuple[list[dict[str, Any]], tuple[Any, str | None]]:
        first = int(last_entry_info[1]) + 1 if last_entry_info and last_entry_info[1] is not None else 0
        new = self.entries[first:]
        if self.job_start_time is None:
            started = next((e["job_start_time"] for e in self.entries if "job_start_time" in e), None)
            if started is not None:
                self.job_start_time = datetime.datetime.fromtimestamp(started, tz=datetime.timezone.utc)
        if not new:
            return [], (None, None)
        last = self.entries[-1]
        stamp = max(v for k, v in last.items() if k.endswith("_time"))
        return list(new), (datetime.datetime.fromtimestamp(stamp, tz=datetime.timezone.utc),
                           str(len(self.entries) - 1))


def entries(output: str) -> list[dict[str, Any]]:
    """The ml-goodput-measurement entries the chief printed, in order."""
    found = [json.loads(m.group(1)) for line in output.splitlines() if (m := ENTRY.match(line))]
    assert found and all(e["job_name"] == JOB_NAME and e["severity"] == "INFO" for e in found), output[-3000:]
    return found


def theirs(found: list[dict[str, Any]], cache: Path) -> tuple[float, dict[str, Any]]:
    """The package's goodput percent of the job and its details (productive and total seconds, disruptions)."""
    from ml_goodput_measurement.src import goodput as reference

    calculator = reference.GoodputCalculator(JOB_NAME, "unused-log-name", cloud_logger=FakeCloudLogging(found),
                                             cache_dir=str(cache))
    percent, _, _ = calculator.get_job_goodput(include_badput_breakdown=True)
    return float(percent), dict(calculator.get_job_goodput_details())


def ours(job_dir: Path) -> dict[str, Any]:
    proc = entrypoint("goodput", str(job_dir), "--json", timeout=120)
    assert proc.returncode == 0, failure_text(proc)
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def as_theirs(report: dict[str, Any], job_dir: Path) -> float:
    """Our report's goodput counted as ml-goodput-measurement counts it (docs/goodput.md):

    - its wall time runs from the chief's first attempt's start (its ``job_start_time``) to the end of the
      finished training (``job_end_time``, the ledger's ``training_end``): the platform's time before and after
      the job (``local`` starting and reporting, the node's exit after the training) is outside it;
    - its productive time is every second between one kept step's start and the next one's, and the last step's
      start to the end: a step's wait for data, a checkpoint save (it subtracts only Orbax's own saves), an
      evaluation and the export are productive to it; ours has them in their buckets. The first step's time beyond
      a typical one is program startup in both, and a step lost to a disruption is wasted progress in both."""
    chief = [a for a in report["attempts"] if a["chief"]]
    ends = [r["t"] for r in ledger.of_kind(ledger.read(str(job_dir)).records, "training_end")
            if r.get("outcome") == "finished"]
    window = max(ends) - chief[0]["start"]
    b = report["buckets"]
    productive = b["productive"] + b["data_loading"] + b["checkpoint_save"] + b["evaluation"] + b["export"]
    return 100.0 * productive / window


def compare(tmp_path: Path, job: Job, out: Path) -> tuple[float, float, dict[str, Any], dict[str, Any]]:
    found = entries(job.output())
    percent, details = theirs(found, tmp_path / "cache")
    report = ours(out)
    same = as_theirs(report, out)
    print(f"ml-goodput-measurement {percent:.2f}% of {details['total_elapsed_time']:.2f} s; ours "
          f"{report['goodput_percent']:.2f}% of {report['wall_seconds']:.2f} s, counted as theirs {same:.2f}%; "
          f"buckets {report['buckets']}")
    assert abs(percent - same) <= POINTS, (percent, same, report["buckets"], details)
    assert percent >= report["goodput_percent"] - 0.5  # theirs counts more as productive, over less time
    assert details["max_productive_step"] == report["steps"]["final"] == report["steps"]["productive"]
    return percent, same, report, details


def test_an_undisturbed_job_has_the_same_goodput_in_both_definitions(tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job(*local_args(out), env={"TRAINER_GOODPUT_JOB_NAME": JOB_NAME})
    try:
        assert job.wait(420) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    found = entries(job.output())
    assert "job_start_time" in found[0] and "job_end_time" in found[-1]
    assert sum("job_start_time" in e for e in found) == 1 and sum("job_end_time" in e for e in found) == 1
    steps = [e["step_count"] for e in found if "step_start_time" in e]
    assert steps == list(range(1, len(steps) + 1))  # one entry per step, numbered as the step about to run
    _, _, report, details = compare(tmp_path, job, out)
    assert details["disruption_count"] == 0 and report["disruption_count"] == 0


def test_a_job_restarted_from_its_checkpoint_has_the_same_goodput_in_both_definitions(tmp_path: Path) -> None:
    out = tmp_path / "job"
    job = Job(*local_args(out, "--recovery", "restart"), env={"TRAINER_GOODPUT_JOB_NAME": JOB_NAME})
    try:
        step = job.wait_for_step(7)
        while step % 5 in (0, 4):  # a few steps past a commit, so some are lost
            step = job.wait_for_step(step + 1)
        os.killpg(replica_group(job, "workerpool1-0"), signal.SIGKILL)  # the job restarts from its checkpoint
        assert job.wait(600) == 0, job.output()[-4000:]
        assert wait_gone(job.marker) == []
    finally:
        job.cleanup()
    found = entries(job.output())
    assert sum("job_start_time" in e for e in found) == 2  # one per attempt of the chief
    _, _, report, details = compare(tmp_path, job, out)
    assert report["job_attempts"] == 2 and report["disruption_count"] == 1, report["disruptions"]
    assert details["disruption_count"] == 1  # the step after the restored one was recorded again
