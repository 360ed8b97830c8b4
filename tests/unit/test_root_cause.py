"""Failure records: which one ``root_cause`` names, and a record's JSON and last line (no framework, no files)."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from entrypoint import failures
from entrypoint.failures.records import (
    SCHEMA_VERSION,
    FailureRecord,
    current,
    read_records,
    root_cause,
    store_record,
)
from entrypoint.lifecycle import lost_work


def rec(replica: str, cls: str, code: int, at: float, rank: int | None = None, reported_by: str | None = None,
        message: str = "") -> FailureRecord:
    return FailureRecord(replica=replica, rank=rank, host=f"{replica}-host", failure_class=cls, exit_code=code,
                         message=message or f"{cls} on {replica}", pid=int(at * 10), time=at,
                         reported_by=reported_by)


USER_ON_WORKER = rec("workerpool1-0", "user_code", 1, 10.0, rank=1)
PEER_LOST_ON_CHIEF = rec("workerpool0-0", "peer_lost", 129, 12.0, rank=0)
EARLY_PEER_LOST = rec("workerpool0-0", "peer_lost", 129, 5.0, rank=0)
HANG = rec("workerpool0-0", "hang", 129, 20.0, rank=0)
OOM = rec("workerpool1-0", "signal", 137, 21.0)  # the kernel's OOM killer: SIGKILL, recorded on its behalf
PREEMPTED = rec("workerpool1-1", "preempted", 143, 30.0)
STORAGE = rec("workerpool0-0", "storage_unavailable", 197, 40.0, rank=0)
VERDICT = rec("workerpool1-1", "peer_lost", 129, 15.0, rank=2, reported_by="workerpool0-0 (rank 0)")
DISK_A = rec("workerpool0-0", "disk_full", 74, 50.0, rank=0, message="no space left on device at /out/a")
DISK_B = replace(DISK_A, time=55.0, pid=99)


@pytest.mark.parametrize(("records", "named"), [
    pytest.param([], None, id="no records"),
    pytest.param([PREEMPTED], PREEMPTED, id="preempted only"),
    pytest.param([USER_ON_WORKER, PEER_LOST_ON_CHIEF], USER_ON_WORKER,
                 id="user error on a worker, peer_lost on the chief"),
    pytest.param([EARLY_PEER_LOST, USER_ON_WORKER], USER_ON_WORKER,
                 id="a consequence written earlier (clock skew) still yields to the cause"),
    pytest.param([HANG, OOM], OOM, id="hang, then the OOM kill that froze the peer: the kill"),
    pytest.param([PEER_LOST_ON_CHIEF, HANG], PEER_LOST_ON_CHIEF, id="consequences only: the earliest"),
    pytest.param([DISK_A, DISK_B], DISK_A, id="two identical permanent failures: the earlier"),
    pytest.param([STORAGE, replace(PEER_LOST_ON_CHIEF, time=41.0)], STORAGE, id="storage 197 and its consequence"),
    pytest.param([STORAGE, replace(PREEMPTED, time=45.0)], STORAGE, id="two causes: the earliest, retryable or not"),
    pytest.param([PEER_LOST_ON_CHIEF, VERDICT, HANG], VERDICT,
                 id="a survivor's verdict names the silent peer over the consequences"),
    pytest.param([VERDICT, USER_ON_WORKER], USER_ON_WORKER,
                 id="what the culprit recorded itself wins over a verdict about it"),
    pytest.param([replace(VERDICT, time=1.0), replace(VERDICT, replica="workerpool1-2", time=2.0)],
                 replace(VERDICT, time=1.0), id="two verdicts: the earlier"),
])
def test_root_cause_names(records: list[FailureRecord], named: FailureRecord | None) -> None:
    """``root_cause`` reads records oldest first (as ``read_records`` returns them)."""
    ordered = sorted(records, key=lambda r: r.time)
    assert root_cause(ordered) == named


@pytest.mark.parametrize(("record", "consequence", "retryable"), [
    (USER_ON_WORKER, False, False), (PEER_LOST_ON_CHIEF, True, True), (HANG, True, True), (OOM, False, True),
    (PREEMPTED, False, True), (STORAGE, False, True), (VERDICT, False, True), (DISK_A, False, False),
])
def test_consequence_and_retryable(record: FailureRecord, consequence: bool, retryable: bool) -> None:
    assert (record.consequence, record.retryable) == (consequence, retryable)


@pytest.mark.parametrize("record", [USER_ON_WORKER, PEER_LOST_ON_CHIEF, OOM, VERDICT,
                                    replace(DISK_A, traceback="Traceback ...\nOSError: [Errno 28]", step=1200),
                                    rec("local", "user_code", 1, 0.0).stamped()])
def test_json_round_trip(record: FailureRecord) -> None:
    written = json.loads(json.dumps(record.to_json()))
    assert FailureRecord.from_json(written) == record
    assert written["class"] == record.failure_class and "failure_class" not in written
    assert written["retryable"] is record.retryable and written["schema_version"] == SCHEMA_VERSION
    assert ("reported_by" in written) is (record.reported_by is not None)


@pytest.mark.parametrize("data", [
    None, [], "user_code", 7,
    {"replica": "w", "rank": 0, "host": "h", "exit_code": 1, "message": "m"},  # no class
    {"replica": "w", "rank": 0, "host": "h", "class": 3, "exit_code": 1, "message": "m"},  # class not a string
    {"replica": None, "rank": 0, "host": "h", "class": "user_code", "exit_code": 1, "message": "m"},
    {"replica": "w", "rank": 0, "host": "h", "class": "user_code", "exit_code": "one", "message": "m"},
    {"replica": "w", "rank": 0, "host": "h", "class": "user_code", "exit_code": 1, "message": "m", "time": "now"},
    {"replica": "w", "class": "user_code", "exit_code": 1},  # required fields missing
])
def test_what_is_not_a_record_reads_as_none(data: object) -> None:
    assert FailureRecord.from_json(data) is None


def test_from_json_ignores_unknown_fields_and_coerces_numbers() -> None:
    data = {"replica": "w", "rank": 0, "host": "h", "class": "user_code", "exit_code": "1", "message": "m",
            "time": 3, "retryable": True, "added_in_v2": {"x": 1}}
    record = FailureRecord.from_json(data)
    assert record is not None and record.exit_code == 1 and record.time == 3.0 and isinstance(record.time, float)


@pytest.mark.parametrize(("record", "line"), [
    (USER_ON_WORKER, "entrypoint: error: user_code on workerpool1-0, rank 1, host workerpool1-0-host: "
                     "user_code on workerpool1-0 (exit 1, permanent)"),
    (OOM, "entrypoint: error: signal on workerpool1-0, host workerpool1-0-host: signal on workerpool1-0 "
          "(exit 137, retryable)"),
    (replace(STORAGE, rank=None, message="gs://bkt unreachable"),
     "entrypoint: error: storage_unavailable on workerpool0-0, host workerpool0-0-host: gs://bkt unreachable "
     "(exit 197, retryable)"),
])
def test_last_line(record: FailureRecord, line: str) -> None:
    assert record.last_line() == line and "\n" not in line


def test_a_note_goes_after_the_message() -> None:
    noted = DISK_A.noted("--restart-policy never")
    assert noted.message == "no space left on device at /out/a; --restart-policy never"
    assert noted.last_line().endswith("at /out/a; --restart-policy never (exit 74, permanent)")
    assert DISK_A.noted("") is DISK_A


def test_records_written_and_read_back_name_the_same_root_cause(tmp_path: Path) -> None:
    """Through the job's ``failures/`` directory: oldest first, only those since the start (minus skew)."""
    job = str(tmp_path / "job")
    old = replace(USER_ON_WORKER, time=100.0)
    records = [replace(r, time=t) for r, t in ((PEER_LOST_ON_CHIEF, 1003.0), (USER_ON_WORKER, 1001.0),
                                               (HANG, 1002.0))]
    for record in (old, *records):
        assert store_record(job, record) is not None
    read = read_records(job, since=1000.0)
    assert read == sorted(records, key=lambda r: r.time)
    assert root_cause(read) == records[1]
    assert read_records(None, 0.0) == [] and read_records(str(tmp_path / "none"), 0.0) == []


def test_a_supervisor_names_the_root_cause_among_the_records(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``finish_child``: the worker's own failure, not the chief's lost peer, names the job's end and its code."""
    ctx = failures.FailureContext(replica="local", job_dir=str(tmp_path / "job"), started=time.time() - 1)
    for record in (USER_ON_WORKER, PEER_LOST_ON_CHIEF):
        store_record(ctx.job_dir or "", replace(record, time=0.0).stamped())
    assert failures.finish_child(ctx, 129, who="workerpool0-0", note="no restart: --restart-policy never") == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("entrypoint: error: user_code on workerpool1-0, rank 1")
    assert line.endswith("; no restart: --restart-policy never (exit 1, permanent)")


def test_a_child_that_left_no_record_gets_one_on_its_behalf(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Killed by SIGKILL (the OOM killer, say): the supervisor writes its record and names it."""
    ctx = failures.FailureContext(replica="local", job_dir=str(tmp_path / "job"), started=time.time() - 1)
    assert failures.finish_child(ctx, 137, who="workerpool1-0") == 137
    (written,) = read_records(ctx.job_dir, ctx.started)
    assert (written.replica, written.failure_class, written.exit_code, written.rank) == ("workerpool1-0", "signal",
                                                                                         137, None)
    assert capsys.readouterr().err.strip().endswith("stopped by SIGKILL (exit 137, retryable)")


@pytest.mark.parametrize(("record", "line"), [
    pytest.param(replace(PREEMPTED, step=21), "resumed after workerpool1-1 was preempted at step 21: resumed from "
                 "step 20 (1 steps, 2.0 s of training lost)", id="a preemption is not a loss"),
    pytest.param(replace(USER_ON_WORKER, step=21), "recovered after losing workerpool1-0 at step 21: resumed from "
                 "step 20 (1 steps, 2.0 s of training lost)", id="a lost replica"),
    pytest.param(replace(PREEMPTED, step=21, failure_class="preempted_uncommitted"), "resumed after workerpool1-1 was "
                 "preempted at step 21 before that step was committed: resumed from step 20 (1 steps, 2.0 s of "
                 "training lost)", id="a preemption whose step was not committed"),
])
def test_the_recovery_line_says_whether_the_job_was_preempted_or_lost_a_replica(tmp_path: Path, record: FailureRecord,
                                                                                 line: str) -> None:
    job = str(tmp_path / "job")
    assert store_record(job, replace(record, time=1002.0)) is not None
    cost = lost_work.after_resume(job, step=20, reached=1000.0)
    assert cost is not None and cost.line() == line and cost.cause == record.failure_class
    assert lost_work.Recovery(**cost.to_dict()).line() == line  # as carried in checkpoints and read back on resume
    old = {k: v for k, v in cost.to_dict().items() if k != "cause"}  # a checkpoint written before ``cause``
    assert lost_work.Recovery(**old).line().startswith("recovered after losing workerpool1-")


LOST_AT_10 = rec("workerpool1-0", "signal", 137, 10.0)  # SIGKILLed, recorded by `local`; restarted at 11.0
PREEMPTED_CHIEF = rec("workerpool0-0", "preempted", 143, 30.0, rank=0)
PREEMPTED_WORKER = rec("workerpool1-0", "preempted", 143, 30.5, rank=1)


@pytest.mark.parametrize(("starts", "kept"), [
    pytest.param({"workerpool1-0": 11.0}, [PREEMPTED_CHIEF, PREEMPTED_WORKER], id="the worker restarted since"),
    pytest.param({"workerpool1-0": 0.0}, [LOST_AT_10, PREEMPTED_CHIEF, PREEMPTED_WORKER], id="not restarted"),
    pytest.param({}, [LOST_AT_10, PREEMPTED_CHIEF, PREEMPTED_WORKER], id="no start known"),
])
def test_the_current_attempt_drops_a_restarted_replicas_earlier_records(starts: dict[str, float],
                                                                         kept: list[FailureRecord]) -> None:
    assert current([LOST_AT_10, PREEMPTED_CHIEF, PREEMPTED_WORKER], starts) == kept


def _stored(job: str, *records: FailureRecord) -> float:
    """``records`` written now, in order, their times shifted so the first is 10 s ago; that moment."""
    now = time.time()
    for record in records:
        assert store_record(job, replace(record, time=now - 20 + record.time - 10.0)) is not None
    return now - 20


def test_a_supervisor_names_the_latest_attempts_end_not_a_loss_the_job_recovered_from(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A worker SIGKILLed and restarted in place, then the job SIGTERMed: 143 `preempted`, not the old 137."""
    job = str(tmp_path / "job")
    first = _stored(job, LOST_AT_10, PREEMPTED_CHIEF, PREEMPTED_WORKER)
    ctx = failures.FailureContext(replica="local", job_dir=job, started=first - 5,
                                  starts={"workerpool0-0": first - 4, "workerpool1-0": first + 1})
    assert failures.finish_child(ctx, 143) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("entrypoint: error: preempted on workerpool0-0")


def test_a_nodes_own_end_outranks_a_peers_earlier_failure(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``finish_node``: the chief SIGTERMed after a worker's loss it recovered from names its own preemption."""
    job = str(tmp_path / "job")
    first = _stored(job, LOST_AT_10, PREEMPTED_CHIEF)
    ctx = failures.FailureContext(replica="workerpool0-0", job_dir=job, started=first - 5)
    assert failures.finish_node(ctx, 143) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("entrypoint: error: preempted on workerpool0-0")


def test_a_restarted_node_never_names_its_own_previous_attempt(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The record `local` wrote for this replica's previous attempt a moment before this one started (within the
    clock skew read_records allows) is not this attempt's."""
    job = str(tmp_path / "job")
    first = _stored(job, LOST_AT_10, PREEMPTED_WORKER)
    ctx = failures.FailureContext(replica="workerpool1-0", job_dir=job, started=first + 0.5)
    assert failures.finish_node(ctx, 143) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("entrypoint: error: preempted on workerpool1-0")


def test_a_nodes_lost_peer_still_names_the_peer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The node's own failure is a consequence: the earliest failure elsewhere that is not one is named."""
    job = str(tmp_path / "job")
    first = _stored(job, USER_ON_WORKER, PEER_LOST_ON_CHIEF)
    ctx = failures.FailureContext(replica="workerpool0-0", job_dir=job, started=first - 5)
    assert failures.finish_node(ctx, 129) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("entrypoint: error: user_code on workerpool1-0")


def test_a_node_without_records_of_its_own_records_its_launchers_exit(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    job = str(tmp_path / "job")
    first = _stored(job, LOST_AT_10)
    ctx = failures.FailureContext(replica="workerpool0-0", job_dir=job, started=first - 5)
    assert failures.finish_node(ctx, 143) == 143
    assert "preempted on workerpool0-0" in capsys.readouterr().err.strip().splitlines()[-1]


def test_records_the_job_dir_cannot_take_are_read_from_the_temp_dir_and_only_the_jobs_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A rank's record that went to ``$TMPDIR/trainer-failures`` (the job dir's ``failures`` cannot be made) keeps its
    reason on the node's last line; another job's record in the same temp dir is never read."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    job, other = tmp_path / "job", tmp_path / "other"
    for directory in (job, other):
        directory.mkdir()
        (directory / "failures").write_text("a file where the directory would be")
    first = _stored(str(other), replace(USER_ON_WORKER, replica="workerpool0-0"))
    _stored(str(job), replace(DISK_A, time=15.0))
    assert len(list((tmp_path / "tmp" / "trainer-failures").glob("*.json"))) == 2
    ctx = failures.FailureContext(replica="workerpool0-0", job_dir=str(job), started=first - 5)
    assert failures.finish_node(ctx, 74) == 74
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "disk_full on workerpool0-0" in line and "no space left on device at /out/a" in line, line


def test_a_supervisor_reads_its_replicas_private_record_dirs(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`local`: a replica's record in its own temp dir (a refused job dir's, say) names the replica's reason."""
    refused = tmp_path / "replica-tmp" / "trainer-refused"
    first = _stored(str(refused), rec("workerpool0-0", "config", 2, 10.0, rank=0,
                                      message="the job dir /j is in use by another live job"))
    ctx = failures.FailureContext(replica="local", job_dir=str(tmp_path / "job"), started=first - 5,
                                  private=(str(refused / "failures"),))
    assert failures.finish_child(ctx, 2, who="workerpool0-0") == 2
    assert "in use by another live job" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_job_run_again_at_once_never_names_the_earlier_runs_failure(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The earlier run's records were written a moment before this run's chief started (within the clock skew
    read_records allows): `local` says when this run started (TRAINER_RUN_STARTED), so its lost peer names the
    failure of this run, not the earlier run's preemption."""
    job = str(tmp_path / "job")
    first = _stored(job, PREEMPTED_WORKER, rec("workerpool1-0", "signal", 137, 32.0),
                    rec("workerpool0-0", "peer_lost", 129, 33.0, rank=0))
    run = first + 20.5 + 0.2  # the earlier run's preemption at +20.5 s, this run's start 0.2 s after it
    for run_started, named in ((0.0, "preempted on workerpool1-0"), (run, "signal on workerpool1-0")):
        ctx = failures.FailureContext(replica="workerpool0-0", job_dir=job, started=run + 0.3, run_started=run_started)
        assert failures.finish_node(ctx, 129) == (143 if run_started == 0.0 else 137)
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"entrypoint: error: {named}")


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_a_run_start_that_is_not_a_time_is_a_configuration_error_naming_it(value: str) -> None:
    from entrypoint.cluster.environments.settings import read_settings
    from entrypoint.errors import ConfigError

    with pytest.raises(ConfigError, match="TRAINER_RUN_STARTED") as raised:
        read_settings({"TRAINER_RUN_STARTED": value})
    assert value not in str(raised.value).replace("TRAINER_RUN_STARTED", "")
    assert read_settings({"TRAINER_RUN_STARTED": "1795950022.5"}).run_started == 1795950022.5
