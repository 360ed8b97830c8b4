"""ml-goodput-measurement's entries, as the chief prints them with ``TRAINER_GOODPUT_JOB_NAME`` set
(docs/goodput.md): its attempt's start (its node process's), each step's start, the finished training's end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from entrypoint.lifecycle import recorder
from entrypoint.outputs.goodput.ledger import attempt_id, process_start_time


def test_the_chief_prints_its_attempts_start_every_steps_start_and_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    node = os.getppid()  # stands for the node's ``run`` process, which started before this one
    monkeypatch.setenv("TRAINER_GOODPUT_JOB_NAME", "job-1")
    monkeypatch.setenv("TRAINER_ATTEMPT", attempt_id("workerpool0-0", process_start_time(node), pid=node))
    record = recorder.for_training(str(tmp_path), "workerpool0-0", 0, chief=True)
    record.restored(0)
    for step in (1, 2):
        record.step_begin()
        record.step_end(step)
    record.close("finished")
    entries = [json.loads(line) for line in capfd.readouterr().out.splitlines()]
    started = entries[0].pop("job_start_time")
    assert entries[0] == {"severity": "INFO", "job_name": "job-1"}
    assert started == pytest.approx(process_start_time(node), abs=0.05)  # /proc's clock ticks: 10 ms
    assert [e.get("step_count") for e in entries[1:3]] == [1, 2]
    assert entries[1]["step_start_time"] <= entries[2]["step_start_time"] <= entries[3]["job_end_time"]
    assert len(entries) == 4 and all(e["job_name"] == "job-1" for e in entries)


def test_without_the_job_name_nothing_is_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TRAINER_GOODPUT_JOB_NAME", raising=False)
    record = recorder.for_training(str(tmp_path), "workerpool0-0", 0, chief=True)
    record.restored(0)
    record.step_begin()
    record.step_end(1)
    record.close("finished")
    assert capfd.readouterr().out == ""
