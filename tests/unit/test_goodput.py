"""Goodput from the job ledger (entrypoint/outputs/goodput/__init__.py) on ledgers written by hand in the recorders'
formats (entrypoint/lifecycle/recorder.py), and the ``goodput`` command (entrypoint/cli.py)."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from entrypoint.cli import main
from entrypoint.failures.records import FailureRecord, store_record
from entrypoint.lifecycle import recorder
from entrypoint.lifecycle.jobdir.lease import JobLease
from entrypoint.outputs import checkpoints, goodput
from entrypoint.outputs.goodput import IN_PLACE, KILLED, ledger
from entrypoint.outputs.goodput.model import BUCKETS, Witness
from entrypoint.outputs.goodput.report import Report
from tests.conftest import PYTHON, ROOT, subprocess_env

T = 1_700_000_000.0
CHIEF, WORKER = "workerpool0-0", "workerpool1-0"


class Job:
    """A job dir whose ledger is written record by record, one file per attempt (its node's and chief's records)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / ledger.LEDGER_DIR).mkdir(parents=True, exist_ok=True)

    def add(self, attempt: str, kind: str, t: float, replica: str = CHIEF, rank: int | None = 0,
            **fields: Any) -> None:
        record = {"v": 1, "kind": kind, "t": T + t, "attempt": attempt, "replica": replica, "rank": rank, "pid": 7,
                  **{k: T + v if k in ("t0", "t1") else v for k, v in fields.items()}}
        with (self.root / ledger.LEDGER_DIR / f"{attempt}.jsonl").open("a") as out:
            out.write(json.dumps(record) + "\n")

    def start(self, attempt: str, t: float, replica: str = CHIEF, chief: bool = True, job: str = "j") -> None:
        self.add(attempt, "start", t, replica, None, chief=chief, job=job)

    def end(self, attempt: str, t: float, code: int = 0, cls: str | None = None, replica: str = CHIEF) -> None:
        self.add(attempt, "end", t, replica, None, code=code, failure_class=cls, line=None)

    def phase(self, attempt: str, name: str, t0: float, t1: float) -> None:
        self.add(attempt, "phase", t1, name=name, t0=t0, t1=t1)

    def progress(self, attempt: str, t0: float, first: int, last: int, seconds_per_step: float = 1.0,
                 data: float = 0.0, start_up: float | None = None) -> float:
        """Steps ``first``..``last``, each ``seconds_per_step`` after ``data`` seconds of waits, the attempt's first
        ``start_up`` seconds longer (when given: this is its first segment); returns its end."""
        seconds = (last - first + 1) * seconds_per_step + (start_up or 0.0)
        first_step: dict[str, Any] = {} if start_up is None else {"first_step_seconds": seconds_per_step + start_up}
        self.add(attempt, "progress", t0 + data + seconds, t0=t0, t1=t0 + data + seconds, first=first, last=last,
                 steps=last - first + 1, step_seconds=seconds, data_seconds=data, **first_step)
        return t0 + data + seconds

    def report(self, now: float | None = None, running: bool = False, witnesses: tuple[Witness, ...] = ()) -> Report:
        report = goodput.compute(ledger.read(str(self.root)), str(self.root), None if now is None else T + now,
                                 running, witnesses)
        assert sum(report.buckets.values()) == pytest.approx(report.wall, abs=1e-6)  # always
        assert set(report.buckets) == set(BUCKETS) and min(report.buckets.values()) >= 0
        return report


def seen(t: float, replica: str, step: int | None = None, cls: str = "signal", code: int = 137,
         message: str = "stopped by SIGKILL") -> Witness:
    """A failure record of the job (``recorder.witnesses`` reads them): by default a supervisor's for a replica that
    was SIGKILLed and wrote nothing itself."""
    return Witness(T + t, replica, step, cls, code, message)


def buckets(report: Report) -> dict[str, float]:
    return {k: round(v, 6) for k, v in report.buckets.items() if v}


def one_attempt(job: Job) -> None:
    """Start-up 1 s, preparation 2 s, steps 1..10 (1 s of data waits, the first step 1 s longer), a 1 s save."""
    job.start("a1", 0)
    job.add("a1", "restored", 1, step=0)
    job.phase("a1", "preparation", 1, 3)
    job.progress("a1", 3, 1, 10, 0.8, data=1.0, start_up=1.0)  # to +13
    job.phase("a1", "checkpoint", 13, 14)
    job.add("a1", "committed", 14, step=10)
    job.add("a1", "training_end", 14, step=10, outcome="finished")
    job.end("a1", 15)


def test_one_finished_attempt(tmp_path: Path) -> None:
    job = Job(tmp_path)
    one_attempt(job)
    report = job.report()
    assert report.wall == pytest.approx(15) and not report.provisional
    assert buckets(report) == {"program_startup": 2.0, "training_preparation": 2.0, "data_loading": 1.0,
                               "productive": 8.0, "checkpoint_save": 1.0, "other": 1.0}
    assert (report.steps_productive, report.steps_lost, report.final_step) == (10, 0, 10)
    assert report.disruptions == {} and report.mean_time_between_disruptions is None and report.job_attempts == 1


def killed_and_rerun(job: Job, restore_to: int) -> None:
    """Attempt 1 commits step 10 and trains on to step 20 when it is killed (no end), at +23; attempt 2 starts
    at +30, restores step ``restore_to`` and finishes step 20."""
    job.start("a1", 0)
    job.progress("a1", 2, 1, 10)
    job.phase("a1", "checkpoint", 12, 13)
    job.add("a1", "committed", 13, step=restore_to)
    job.progress("a1", 13, 11, 20)
    job.start("a2", 30)
    job.phase("a2", "restore", 31, 32)
    job.add("a2", "restored", 32, step=restore_to)
    end = job.progress("a2", 32, restore_to + 1, 20)
    job.add("a2", "training_end", end, step=20, outcome="finished")
    job.end("a2", end + 1)


@pytest.mark.parametrize("restore_to", [10, 15])  # the end of a segment, the middle of one
def test_a_killed_attempt_and_its_rerun(tmp_path: Path, restore_to: int) -> None:
    job = Job(tmp_path)
    killed_and_rerun(job, restore_to)
    report = job.report()
    first, second = report.attempts
    assert (first.ended, first.end, first.cause().split()[0]) == (False, T + 23, KILLED)  # its last record
    assert report.disruptions == {KILLED: 1} and second.cause() == "finished"
    lost = 20 - restore_to
    assert (report.steps_lost, report.steps_productive, report.final_step) == (lost, 20, 20)
    assert report.buckets["wasted_progress"] == pytest.approx(lost)  # 1 s a step
    assert report.buckets["productive"] == pytest.approx(10 + (10 - lost) + (20 - restore_to))
    assert report.buckets["scheduling"] == pytest.approx(7)  # +23 to +30: no replica ran
    assert report.buckets["checkpoint_restore"] == pytest.approx(1)
    assert report.mean_time_between_disruptions == pytest.approx(report.wall - 7)


def test_a_job_that_ended_failed_keeps_only_its_committed_steps(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start("a1", 0)
    job.progress("a1", 1, 1, 10)
    job.add("a1", "committed", 11, step=6)
    job.progress("a1", 11, 11, 14)
    job.add("a1", "training_end", 15, step=14, outcome="failed")
    job.end("a1", 16, code=1, cls="user_code")
    report = job.report()
    assert (report.steps_lost, report.steps_productive) == (8, 6)
    assert report.disruptions == {"user_code": 1} and report.buckets["infrastructure_recovery"] == pytest.approx(1)


def test_replicas_overlapping_the_chief(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start("w1", -2, WORKER, chief=False)  # a worker up before the chief: the chief's start-up
    job.start("c1", 0)
    job.progress("c1", 1, 1, 9)
    job.start("w2", 5, "workerpool1-1", chief=False)
    job.end("c1", 10, code=137, cls="preempted")
    job.end("w2", 12, code=0, replica="workerpool1-1")
    job.start("c2", 14)  # the chief restarted while a worker ran on: recovery
    job.progress("c2", 15, 10, 20)
    job.add("c2", "training_end", 26, step=20, outcome="finished")
    job.end("c2", 27)
    job.end("w1", 29, replica=WORKER)  # a worker outlives the chief
    report = job.report()
    assert report.start == T - 2 and report.end == T + 29 and report.wall == pytest.approx(31)
    assert report.buckets["program_startup"] == pytest.approx(2 + 1 + 1)  # before the chief, before each 1st step
    assert report.buckets["infrastructure_recovery"] == pytest.approx(4 + 2)  # chief down 10..14, after it 27..29
    assert report.buckets["scheduling"] == 0 and report.disruptions == {"preempted": 1}
    assert report.job_attempts == 2 and len(report.attempts) == 4


def test_the_attempts_are_in_columns_whatever_the_replica_names(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start("w1", -2, "workerpool1-10", chief=False)
    job.start("c1", 0)
    job.progress("c1", 1, 1, 9)
    job.end("c1", 10)
    job.end("w1", 120.5, replica="workerpool1-10")
    lines = job.report().text().split("every replica's runs:\n", 1)[1].splitlines()[:2]
    assert len(lines) == 2 and len({line.index(" s from ") for line in lines}) == 1, lines
    assert len({line.index(" s, ") for line in lines}) == 1, lines


def test_overlapping_chief_attempts_still_add_up(tmp_path: Path) -> None:
    """A replacement chief that starts while the preempted one still writes its last checkpoint in its grace period
    (a platform that starts the new pod before the old one terminated), or on a host whose clock is behind."""
    job = Job(tmp_path)
    job.start("c1", 0)
    job.progress("c1", 1, 1, 10)
    job.end("c1", 12, code=137, cls="preempted")
    job.start("c2", 10)
    job.progress("c2", 11, 11, 20)
    job.add("c2", "training_end", 21, step=20, outcome="finished")
    job.end("c2", 22)
    report = job.report()  # asserts that the buckets add up to the wall time
    assert report.wall == pytest.approx(22)


def test_an_in_place_recovery(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start("a1", 0)
    job.progress("a1", 1, 1, 10)
    job.phase("a1", "recovery", 11, 14)  # from the last good step to training again
    job.progress("a1", 14, 11, 20)
    job.add("a1", "training_end", 24, step=20, outcome="finished")
    job.end("a1", 24)
    report = job.report()
    assert report.disruptions == {IN_PLACE: 1} and report.disruption_count == 1
    assert report.buckets["infrastructure_recovery"] == pytest.approx(3)
    assert (report.steps_lost, report.steps_productive) == (0, 20)
    assert report.mean_time_between_disruptions == pytest.approx(24)


def test_an_in_place_recovery_that_rolls_back_to_a_snapshot_loses_the_steps_after_it(tmp_path: Path) -> None:
    """FSDP's survivors roll back to a snapshot in peer memory within their attempt: the steps after it are lost."""
    job = Job(tmp_path)
    job.start("a1", 0)
    job.add("a1", "restored", 1, step=0)
    job.progress("a1", 1, 1, 10)
    job.phase("a1", "recovery", 11, 14)
    job.add("a1", "restored", 14, step=8, in_place=True)  # the snapshot of step 8: steps 9 and 10 again
    job.progress("a1", 14, 9, 20)
    job.add("a1", "training_end", 26, step=20, outcome="finished")
    job.end("a1", 26)
    report = job.report()
    assert report.disruptions == {IN_PLACE: 1}
    assert (report.steps_lost, report.steps_productive, report.final_step) == (2, 20, 20)


def test_a_running_job_is_provisional_and_ends_now(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start("a1", 0)
    job.progress("a1", 1, 1, 10)
    job.add("a1", "committed", 11, step=4)
    report = job.report(now=40, running=True)
    assert report.provisional and report.end == T + 40 and report.attempts[0].running
    assert report.disruptions == {} and report.steps_lost == 0  # nothing rolled back while it runs
    assert "provisional" in report.line()
    over = job.report(now=40)  # the same ledger, nobody running it: its attempt was killed at its last record
    assert not over.provisional and over.end == T + 11 and over.disruptions == {KILLED: 1}


def test_the_platforms_submission_and_end_are_scheduling(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.add("local@h:1", "submitted", -5, "local", None)
    one_attempt(job)
    job.add("local@h:1", "job_end", 18, "local", None, code=0)
    report = job.report()
    assert (report.start, report.end) == (T - 5, T + 18)
    assert report.buckets["scheduling"] == pytest.approx(5 + 3)
    assert report.job_attempts == 1 and [a.id for a in report.attempts] == ["a1"]


def test_mean_time_between_disruptions(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start("a1", 0)
    job.progress("a1", 1, 1, 10)
    job.phase("a1", "recovery", 11, 13)  # a peer lost, recovered in place
    job.progress("a1", 13, 11, 20)  # then killed at +23
    job.start("a2", 30)
    job.add("a2", "restored", 31, step=20)
    job.progress("a2", 31, 21, 30)
    job.add("a2", "training_end", 41, step=30, outcome="finished")
    job.end("a2", 42)
    report = job.report()
    assert report.disruptions == {KILLED: 1, IN_PLACE: 1} and report.buckets["scheduling"] == pytest.approx(7)
    assert report.mean_time_between_disruptions == pytest.approx((42 - 7) / 2)
    assert report.to_dict()["mean_time_between_disruptions_seconds"] == 17.5
    assert (report.steps_productive, report.steps_lost, report.final_step) == (30, 0, 30)


def test_each_chief_attempt_shows_its_start_up_through_its_first_step(tmp_path: Path) -> None:
    """From the attempt's start to its first step's end (``first_step_end``), the compile cache's measure."""
    job = Job(tmp_path)
    job.start("a1", 0)
    job.start("w1", 1, WORKER, chief=False)
    job.add("a1", "progress", 14, t0=2, t1=14, first=1, last=3, steps=3, step_seconds=12.0, data_seconds=0.0,
            first_step_seconds=10.0, first_step_end=T + 12)  # killed at +14
    job.start("a2", 20)
    job.add("a2", "restored", 22, step=0)
    end = job.progress("a2", 22, 1, 3)  # a ledger from before first_step_end: no start-up to show
    job.start("a3", 40)
    job.add("a3", "progress", 47, t0=42, t1=47, first=1, last=3, steps=3, step_seconds=5.0, data_seconds=0.0,
            first_step_seconds=3.0, first_step_end=T + 45)
    job.end("a3", 48)
    report = job.report()
    assert end < 40 and [a.startup for a in report.attempts] == [12.0, None, None, 5.0]
    assert [a["startup_seconds"] for a in report.to_dict()["attempts"]] == [12.0, None, None, 5.0]
    shown = [line for line in report.text().splitlines() if "start-up through its first step" in line]
    assert [line.split("first step ")[1] for line in shown] == ["12.0 s", "5.0 s"] and "(chief)" in shown[0]


# ---- the command -------------------------------------------------------------------------------------------------
def command(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["goodput", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_path_that_is_not_a_job_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "missing", tmp_path / "file", tmp_path):
        code, out, err = command(capsys, str(path))
        assert (code, out) == (2, "") and len(err.splitlines()) == 1 and str(path) in err, err


def test_a_job_dir_without_a_ledger_says_what_is_known(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "training_summary.json").write_text(json.dumps(
        {"start_step": 0, "final_step": 20, "seconds": 12.5, "samples_per_second": 99.0, "recoveries": [{}]}))
    ckpt = checkpoints.checkpoint_path(tmp_path / "checkpoints", 20)
    ckpt.mkdir(parents=True)
    (ckpt / "state.bin").write_bytes(b"weights")
    checkpoints.commit(ckpt, {"step": 20})
    code, out, err = command(capsys, str(tmp_path))
    assert (code, err) == (0, "") and len(out.splitlines()) == 1
    assert "no job ledger" in out and "steps 0 to 20" in out and "1 recoveries" in out
    assert "newest committed checkpoint is at step 20" in out


def test_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = Job(tmp_path / "job")
    killed_and_rerun(job, 15)
    code, out, _ = command(capsys, str(job.root), "--json")
    found = json.loads(out)
    assert code == 0 and sum(found["buckets"].values()) == pytest.approx(found["wall_seconds"], abs=0.02)
    assert found["steps"] == {"productive": 20, "lost": 5, "final": 20, "fewer_replicas": 0}
    assert found["disruptions"] == {KILLED: 1}
    code, out, _ = command(capsys, str(job.root), "--plot", str(tmp_path / "x.svg"))
    assert code == 0 and "wasted_progress" in out
    assert ET.parse(tmp_path / "x.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    code, out, err = command(capsys, str(job.root), "--plot", str(tmp_path / "x.jpg"))
    assert (code, out) == (2, "") and len(err.splitlines()) == 1 and "x.jpg" in err
    assert not (tmp_path / "x.jpg").exists()


def goodput_of(job_dir: Path) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own (this one holds the lease: to itself, the job dir would be its own)."""
    return subprocess.run([PYTHON, "-m", "entrypoint", "goodput", str(job_dir)], env=subprocess_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_a_job_dir_another_job_is_writing(tmp_path: Path) -> None:
    job = Job(tmp_path)
    one_attempt(job)  # the ledger's job is "j"
    held = JobLease(str(tmp_path), "another-job").acquire()
    try:
        done = goodput_of(tmp_path)
    finally:
        held.release()
    assert done.returncode == 2 and done.stdout == "", done
    assert len(done.stderr.splitlines()) == 1 and str(tmp_path) in done.stderr and "another job" in done.stderr
    job.start("a2", 20)  # its next attempt runs: the job's own lease, a provisional report
    held = JobLease(str(tmp_path), "j").acquire()
    try:
        done = goodput_of(tmp_path)
    finally:
        held.release()
    assert done.returncode == 0 and "provisional" in done.stdout.splitlines()[0], done


# ---- what a killed attempt leaves: failure records, commits, clocks ----------------------------------------------
def chief_killed_before_its_first_record(job: Job) -> None:
    """The chief trains steps 1..8 from +3 and is SIGKILLed at +9 before writing a progress record (its supervisor
    records the kill at +9.2; the worker, which lost it, its own failure at step 8); the rerun trains 1..20."""
    job.start("c1", 0)
    job.start("w1", 0, WORKER, chief=False)
    job.phase("c1", "preparation", 1, 3)
    job.add("c1", "restored", 3, step=0)
    job.end("w1", 10, code=137, cls="signal", replica=WORKER)
    job.start("c2", 12)
    job.start("w2", 12, WORKER, chief=False)
    job.add("c2", "restored", 13, step=0)
    end = job.progress("c2", 13, 1, 20)
    job.add("c2", "training_end", end, step=20, outcome="finished")
    job.end("c2", end + 1)
    job.end("w2", end + 1, replica=WORKER)


@pytest.mark.parametrize("noticed", [9.5, 12.5])  # before its replacement started; after, before it restored
def test_steps_trained_before_a_killed_chiefs_first_record_are_counted_lost(tmp_path: Path, noticed: float) -> None:
    job = Job(tmp_path)
    chief_killed_before_its_first_record(job)
    witnesses = (seen(9.2, CHIEF), seen(noticed, WORKER, 8, "peer_lost", 129, "lost workerpool0-0"))
    report = job.report(witnesses=witnesses)
    assert (report.steps_lost, report.steps_productive, report.final_step) == (8, 20, 20)
    assert report.attempts[0].end == T + 9.2  # when its supervisor saw it go, not its last record (+3)
    assert report.attempts[0].cause() == "signal (exit 137: stopped by SIGKILL; recorded for it)"
    assert report.disruptions == {"signal": 1}
    assert job.report().steps_lost == 0  # nothing else says how far it had trained


def test_a_killed_chiefs_commits_count_its_steps(tmp_path: Path) -> None:
    """No progress record, but checkpoint 6 committed before the kill: steps 1..6 were trained and kept."""
    job = Job(tmp_path)
    job.start("c1", 0)
    job.add("c1", "restored", 1, step=0)
    job.phase("c1", "checkpoint", 6, 7)
    job.add("c1", "committed", 7, step=6)
    job.start("c2", 10)
    job.add("c2", "restored", 11, step=6)
    end = job.progress("c2", 11, 7, 20)
    job.add("c2", "training_end", end, step=20, outcome="finished")
    job.end("c2", end + 1)
    report = job.report()
    assert (report.steps_lost, report.steps_productive, report.final_step) == (0, 20, 20)
    assert report.buckets["productive"] == pytest.approx(14)  # the steps whose time is on record


def test_each_replica_keeps_its_own_end_after_a_worker_is_sigkilled(tmp_path: Path) -> None:
    """The worker is SIGKILLed at +8 (its supervisor's record: it wrote no end) and restarted at +14; the chief
    fails at +9 (its lost peer) and ends at +12 with the job's root cause, the worker's kill, which its last line
    names. Each row and lane keeps its own lifetime and says whose end it was; no second of it is scheduling."""
    job = Job(tmp_path)
    job.start("c1", 0)
    job.start("w1", 0, WORKER, chief=False)
    job.progress("c1", 1, 1, 7)
    job.add("c1", "training_end", 9, step=7, outcome="failed")
    job.add("c1", "end", 12, CHIEF, None, code=137, failure_class="signal",
            line=f"entrypoint: error: signal on {WORKER}, host h: stopped by SIGKILL (exit 137, retryable)")
    job.start("w2", 14, WORKER, chief=False)
    job.start("c2", 13)
    end = job.progress("c2", 15, 1, 10)
    job.add("c2", "training_end", end, step=10, outcome="finished")
    job.end("c2", end + 1)
    job.end("w2", end + 1, replica=WORKER)
    report = job.report(witnesses=(seen(8, WORKER), seen(12, CHIEF, 7, "peer_lost", 129, "lost workerpool1-0")))
    chief, worker = report.attempts[0], report.attempts[1]
    assert (chief.replica, chief.end, chief.cause()) == (CHIEF, T + 12, f"ended by the signal of {WORKER} (exit 137)")
    assert (worker.replica, worker.end) == (WORKER, T + 8)  # not its replacement's start (+14)
    assert worker.cause() == "signal (exit 137: stopped by SIGKILL; recorded for it)"
    text = " ".join(report.text().split())  # the attempts are in columns
    assert f"{CHIEF} (chief): 12.0 s from +0.0 s, ended by the signal of {WORKER} (exit 137)" in text
    assert f"{WORKER}: 8.0 s from +0.0 s, signal (exit 137: stopped by SIGKILL" in text
    lanes = {lane["label"]: lane for lane in report.lanes}
    assert [m["t"] for m in lanes[f"{WORKER} from +0 s"]["marks"]] == [T + 8]
    assert report.buckets["scheduling"] == pytest.approx(1)  # +12 to +13: no replica of the job ran


def test_a_killed_replica_is_named_by_its_supervisor_even_when_a_survivor_s_verdict_came_first(tmp_path: Path) -> None:
    """A liveness port names a SIGKILLed worker at once: the survivor's verdict (+8.05) comes before its supervisor's
    record of the kill (+8.13). The attempt ended as its supervisor saw it (exit 137), not as the verdict says."""
    job = Job(tmp_path)
    job.start("c1", 0)
    job.start("w1", 0, WORKER, chief=False)
    job.progress("c1", 1, 1, 7)
    job.add("c1", "training_end", 8.1, step=7, outcome="failed")
    job.end("c1", 8.2, code=129, cls="peer_lost")
    job.start("c2", 13)
    job.start("w2", 13, WORKER, chief=False)
    end = job.progress("c2", 14, 1, 10)
    job.add("c2", "training_end", end, step=10, outcome="finished")
    job.end("c2", end + 1)
    job.end("w2", end + 1, replica=WORKER)
    verdict = replace(seen(8.05, WORKER, None, "peer_lost", 129, "stopped responding (its process is gone"),
                      verdict=True)
    worker = job.report(witnesses=(verdict, seen(8.13, WORKER))).attempts[1]
    assert worker.replica == WORKER and worker.cause() == "signal (exit 137: stopped by SIGKILL; recorded for it)"
    alone = job.report(witnesses=(verdict,)).attempts[1]  # no supervisor recorded it (a VM lost): the verdict says
    assert alone.cause() == "peer_lost (exit 129: stopped responding (its process is gone; recorded for it)"


def test_a_survivors_wait_for_a_killed_chiefs_replacement_is_recovery_not_scheduling(tmp_path: Path) -> None:
    """The chief's last record is at +4 and it is SIGKILLed at +9 (its supervisor's record); the worker waits for
    its replacement, which starts at +12: +4 to +9 is the killed chief's, +9 to +12 the survivor's wait."""
    job = Job(tmp_path)
    job.start("c1", 0)
    job.start("w1", 0, WORKER, chief=False)
    job.progress("c1", 1, 1, 3)
    job.start("c2", 12)
    end = job.progress("c2", 13, 4, 10)
    job.add("c2", "training_end", end, step=10, outcome="finished")
    job.end("c2", end + 1)
    job.end("w1", end + 1, replica=WORKER)
    report = job.report(witnesses=(seen(9, CHIEF),))
    assert report.attempts[0].end == T + 9 and report.buckets["scheduling"] == 0
    assert report.buckets["infrastructure_recovery"] == pytest.approx(3 + 5)  # its end after its last record, too


def test_records_dated_in_the_future_are_ignored_with_a_warning(tmp_path: Path) -> None:
    """A host whose clock is a day ahead wrote a record: without it the wall time is the job's, and a warning says
    whose record it was."""
    job = Job(tmp_path)
    one_attempt(job)
    job.add("w9", "start", 86_400, WORKER, None, chief=False)
    report = job.report(now=100)
    assert report.wall == pytest.approx(15) and [a.id for a in report.attempts] == ["a1"]
    (warning,) = [w for w in report.warnings if "after now" in w]
    assert WORKER in warning and "86300 s after now" in warning


def test_a_goodput_of_zero_says_why(tmp_path: Path) -> None:
    job = Job(tmp_path / "script")
    job.start("a1", 0)
    job.end("a1", 9)
    assert "0.0 s of 9.0 s trained the model (no training step was recorded (" in job.report().line()
    lost = Job(tmp_path / "lost")
    lost.start("a1", 0)
    lost.progress("a1", 1, 1, 5)
    lost.add("a1", "training_end", 6, step=5, outcome="failed")
    lost.end("a1", 7, code=1, cls="user_code")
    assert "(every step trained was lost (5 steps, none kept by a committed checkpoint))" in lost.report().line()
    finished = Job(tmp_path / "finished")
    one_attempt(finished)
    assert "trained the model; 1 attempt" in finished.report().line()


def test_a_plot_to_a_path_that_cannot_be_written_is_one_line(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    job = Job(tmp_path / "job")
    one_attempt(job)
    (tmp_path / "file").write_text("x")
    code, out, err = command(capsys, str(job.root), "--plot", str(tmp_path / "file" / "plot.png"))
    assert (code, out) == (2, "") and len(err.splitlines()) == 1, err
    assert f"--plot: {tmp_path / 'file' / 'plot.png'} cannot be written (" in err


def test_the_command_and_local_read_the_jobs_failure_records(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """What the records under failures/ say reaches the report: the supervisor's record of the chief's kill and the
    survivor's step (``lifecycle/recorder.py`` reads them for ``goodput``, ``local`` and the training summary)."""
    job = Job(tmp_path)
    chief_killed_before_its_first_record(job)
    for t, replica, cls, code, step in ((9.2, CHIEF, "signal", 137, None), (9.5, WORKER, "peer_lost", 129, 8)):
        store_record(str(tmp_path), FailureRecord(replica, None, "h", cls, code, "stopped by SIGKILL", step=step,
                                                  time=T + t))
    assert [(w.replica, w.step) for w in recorder.witnesses(str(tmp_path))] == [(CHIEF, None), (WORKER, 8)]
    code, out, _ = command(capsys, str(tmp_path), "--json")
    found = json.loads(out)
    assert code == 0 and found["steps"]["lost"] == 8 and found["attempts"][0]["end"] == round(T + 9.2, 3)
    assert goodput.of_job(str(tmp_path)).steps_lost == 8  # what local's line and the summary read


def test_evaluation_and_export_have_buckets_of_their_own(tmp_path: Path) -> None:
    """An evaluation after each epoch and the export before the end: their seconds in ``evaluation`` and ``export``
    (ml-goodput-measurement's custom badput events), not in ``other``, in the lanes too."""
    job = Job(tmp_path)
    job.start("a1", 0)
    job.add("a1", "restored", 1, step=0)
    job.progress("a1", 1, 1, 5)  # to +6
    job.phase("a1", "evaluation", 6, 8)
    job.progress("a1", 8, 6, 10)  # to +13
    job.phase("a1", "evaluation", 13, 14.5)
    job.phase("a1", "export", 14.5, 17)
    job.add("a1", "training_end", 17, step=10, outcome="finished")
    job.end("a1", 17)
    report = job.report()
    assert buckets(report) == {"program_startup": 1.0, "productive": 10.0, "evaluation": 3.5, "export": 2.5}
    assert report.to_dict()["ml_goodput_names"]["evaluation"] == "CUSTOM_BADPUT_EVENTS"
    spans = [(s["bucket"], s["t1"] - s["t0"]) for s in report.lanes[1]["spans"]]
    assert ("evaluation", 2.0) in spans and ("export", 2.5) in spans
