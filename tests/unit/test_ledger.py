"""The job ledger (entrypoint/outputs/goodput/ledger.py) and what the processes write to it
(entrypoint/lifecycle/recorder.py): many writers read back as one ledger, torn and bad lines skipped with a warning,
object stores through the storage seam, a ledger that cannot be written or is fenced never stopping the training, the
recorders' records."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import uuid
from pathlib import Path

import pytest

from entrypoint import failures
from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.lifecycle import recorder, runner
from entrypoint.lifecycle.recorder import NodeRecorder, PlatformRecorder, Recorder
from entrypoint.options import RunOptions
from entrypoint.outputs import checkpoints, storage
from entrypoint.outputs.goodput import ledger
from entrypoint.outputs.goodput.ledger import LEDGER_DIR, Ledger
from entrypoint.planning.plan import make_plan
from tests.gcs import Emulator, gs_dir

T0 = 1_700_000_000.0
SECRET = "s3cret-" + uuid.uuid4().hex  # a value the user passes behind a secret-looking flag


def files(job_dir: Path) -> list[Path]:
    return sorted((job_dir / LEDGER_DIR).glob("*.jsonl"))


# ---- the ledger ------------------------------------------------------------------------------------------------
def test_writers_in_one_job_dir_read_back_as_one_ledger_ordered_by_time(tmp_path: Path) -> None:
    node, chief = Ledger(str(tmp_path), "a1", "workerpool0-0", None), Ledger(str(tmp_path), "a1", "workerpool0-0", 0)
    worker = Ledger(str(tmp_path), "a2", "workerpool1-0", None)
    node.add("start", t=T0, chief=True)
    worker.add("start", t=T0 + 1)
    chief.add("phase", t=T0 + 3, name="preparation", t0=T0 + 2, t1=T0 + 3)
    worker.add("end", t=T0 + 5, code=0)
    node.add("end", t=T0 + 4, code=0)
    for writer in (node, chief, worker):
        writer.close()
    found = ledger.read(str(tmp_path))
    assert found.files == 2 and found.warnings == []  # a1 (node and chief in one process here: one file) and a2
    assert [(r["kind"], r["t"], r["attempt"]) for r in found.records] == [
        ("start", T0, "a1"), ("start", T0 + 1, "a2"), ("phase", T0 + 3, "a1"), ("end", T0 + 4, "a1"),
        ("end", T0 + 5, "a2")]
    assert {(r["replica"], r["rank"]) for r in found.records} == {("workerpool0-0", None), ("workerpool0-0", 0),
                                                                 ("workerpool1-0", None)}
    assert all(r["v"] == ledger.SCHEMA_VERSION and isinstance(r["pid"], int) for r in found.records)


def test_a_file_cut_at_every_byte_of_its_last_record_still_reads(tmp_path: Path) -> None:
    writer = Ledger(str(tmp_path / "whole"), "a1", "workerpool0-0", 0)
    for step in (1, 2, 3):
        writer.add("committed", t=T0 + step, step=step, note="é")  # a multi-byte character cut too
    writer.close()
    [source] = files(tmp_path / "whole")
    data = source.read_bytes()
    last = data.rindex(b"\n", 0, len(data) - 1) + 1  # where the last record starts
    target = tmp_path / "cut" / LEDGER_DIR / source.name
    target.parent.mkdir(parents=True)
    for cut in range(last, len(data) + 1):
        target.write_bytes(data[:cut])
        found = ledger.read(str(tmp_path / "cut"))
        steps = [r["step"] for r in found.records]
        if cut == last or cut == len(data):  # nothing of it, or all of it
            assert (steps, found.warnings) == ([1, 2] if cut == last else [1, 2, 3], []), cut
        elif cut == len(data) - 1:  # whole but for its end of line: kept, said
            assert steps == [1, 2, 3] and len(found.warnings) == 1 and source.name in found.warnings[0], cut
        else:
            assert steps == [1, 2], cut
            assert found.warnings == [f"{source.name}: line 3 skipped (torn: its writer stopped while writing it)"]


def test_a_bad_line_in_the_middle_is_skipped_with_a_warning(tmp_path: Path) -> None:
    folder = tmp_path / LEDGER_DIR
    folder.mkdir()
    good = json.dumps({"kind": "start", "t": T0, "attempt": "a1"})
    (folder / "a1.jsonl").write_text("\n".join([good, '{"kind": "end", "t": 1', "[1, 2]", '{"kind": "x"}',
                                                json.dumps({"kind": "end", "t": T0 + 1})]) + "\n")
    (folder / "notes.txt").write_text("not a ledger file\n")
    found = ledger.read(str(tmp_path))
    assert [r["kind"] for r in found.records] == ["start", "end"] and found.files == 1
    assert found.warnings == [f"a1.jsonl: line {n} skipped (not a ledger record)" for n in (2, 3, 4)]


def test_a_record_whose_time_is_not_a_number_is_a_bad_line(tmp_path: Path) -> None:
    (tmp_path / LEDGER_DIR).mkdir()
    (tmp_path / LEDGER_DIR / "a1.jsonl").write_text('{"kind": "start", "t": 1}\n{"kind": "x", "t": "soon"}\n'
                                                     '{"kind": "end", "t": 2}\n')
    found = ledger.read(str(tmp_path))
    assert [r["kind"] for r in found.records] == ["start", "end"] and len(found.warnings) == 1


def test_a_job_dir_without_a_ledger_reads_as_empty(tmp_path: Path) -> None:
    assert ledger.read(str(tmp_path)) == ledger.Read()


def roundtrip_on_a_store(job_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records on an object store appear at ``flush`` and at ``close``, not before (no upload due yet)."""
    monkeypatch.setattr(ledger, "REMOTE_EVERY", 600.0)
    writer = Ledger(job_dir, "a1", "workerpool0-0", 0)
    writer.add("start", t=T0)
    assert ledger.read(job_dir).records == []
    writer.flush()
    assert [r["kind"] for r in ledger.read(job_dir).records] == ["start"]
    writer.add("end", t=T0 + 1, code=0)
    writer.close()
    found = ledger.read(job_dir)
    assert ([r["kind"] for r in found.records], found.files, found.warnings) == (["start", "end"], 1, [])
    assert writer._uploader.started and not writer._uploader.alive  # its upload thread ended with it


def test_a_ledger_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    job_dir = f"memory://ledger-{uuid.uuid4().hex}/job"
    try:
        roundtrip_on_a_store(job_dir, monkeypatch)
    finally:
        storage.rmtree(storage.path(job_dir))


def test_a_ledger_on_a_bucket(emulator: Emulator, monkeypatch: pytest.MonkeyPatch,
                              request: pytest.FixtureRequest) -> None:
    roundtrip_on_a_store(gs_dir(request), monkeypatch)


def test_an_upload_in_flight_at_close_never_replaces_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "REMOTE_EVERY", 0.05)  # the thread uploads at once
    started, closed = threading.Event(), threading.Event()

    class Slow(storage.RemotePath):
        def write_bytes(self, data: bytes) -> int:
            if not started.is_set():  # the thread's first upload: still in flight when close() uploads
                started.set()
                closed.wait(3)
            return super().write_bytes(data)

    writer = Ledger(f"memory://ledger-{uuid.uuid4().hex}/job", "a1", "workerpool0-0", 0)
    writer.location = Slow(str(writer.location))
    writer.add("start", t=T0)
    assert started.wait(30)
    writer.add("end", t=T0 + 1, code=0)
    writer.close()
    closed.set()
    writer._uploader.stop(30)
    try:
        assert [json.loads(line)["kind"] for line in writer.location.read_text().splitlines()] == ["start", "end"]
    finally:
        storage.rmtree(writer.location.parent.parent)


def test_a_ledger_that_cannot_be_written_warns_once_and_never_raises(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / LEDGER_DIR).write_text("a file where the ledger's folder should be")
    writer = Ledger(str(tmp_path), "a1", "workerpool0-0", 0)
    with caplog.at_level(logging.WARNING, logger="entrypoint"):
        for step in range(3):
            writer.add("committed", step=step)
        writer.flush()
        writer.close()
    said = [r.getMessage() for r in caplog.records if "job ledger" in r.getMessage()]
    assert len(said) == 1 and str(writer.location) in said[0] and "training goes on" in said[0]


def test_a_fence_that_refuses_means_nothing_more_is_written(tmp_path: Path) -> None:
    writer = Ledger(str(tmp_path), "a1", "workerpool0-0", 0)
    writer.add("start", t=T0)

    def taken_over() -> None:
        raise RuntimeError("another job holds the job dir")

    with checkpoints.fence(taken_over):
        writer.add("committed", t=T0 + 1, step=1)  # refused: not written, not raised
    writer.add("end", t=T0 + 2, code=0)  # and never again, once displaced
    writer.close()
    assert [r["kind"] for r in ledger.read(str(tmp_path)).records] == ["start"]


# ---- the recorders ---------------------------------------------------------------------------------------------
def chief(job_dir: Path) -> Recorder:
    return Recorder(Ledger(str(job_dir), "a1", "workerpool0-0", 0))


def train(rec: Recorder, steps: range) -> None:
    for step in steps:
        rec.step_begin()
        rec.step_end(step)


def test_phases_and_aggregated_steps(tmp_path: Path) -> None:
    rec = chief(tmp_path)
    rec.restored(0)
    rec.enter("preparation")
    train(rec, range(1, 4))
    with rec.phase("checkpoint", step=3):
        pass
    rec.committed(3)
    train(rec, range(4, 6))
    rec.close("finished")
    records = ledger.read(str(tmp_path)).records
    phases = [(r["name"], r.get("step")) for r in records if r["kind"] == "phase"]
    progress = [(r["first"], r["last"], r["steps"]) for r in records if r["kind"] == "progress"]
    # the attempt's first step is written at once (a job killed before its next record still shows it trained)
    assert phases == [("preparation", None), ("checkpoint", 3)] and progress == [(1, 1, 1), (2, 3, 2), (4, 5, 2)]
    timed = sorted((r for r in records if "t0" in r), key=lambda r: r["t0"])
    assert all(r["t0"] <= r["t1"] for r in timed)
    assert all(a["t1"] <= b["t0"] for a, b in itertools.pairwise(timed))  # one activity at a time
    first, *others = (r for r in records if r["kind"] == "progress")
    assert "first_step_seconds" in first and not any("first_step_seconds" in r for r in others)  # its first only
    assert first["t0"] <= first["first_step_end"] <= first["t1"] and not any("first_step_end" in r for r in others)
    assert first["data_seconds"] >= 0 and first["step_seconds"] >= 0
    events = {r["kind"]: (r["step"], r.get("outcome")) for r in records if "step" in r and r["kind"] != "phase"}
    assert events == {"restored": (0, None), "committed": (3, None), "training_end": (5, "finished")}


def test_a_progress_record_each_flush_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder, "FLUSH_EVERY", 0.0)
    rec = chief(tmp_path)
    train(rec, range(1, 4))
    progress = [r for r in ledger.read(str(tmp_path)).records if r["kind"] == "progress"]  # before any close
    assert [(r["first"], r["last"], r["steps"]) for r in progress] == [(1, 1, 1), (2, 2, 1), (3, 3, 1)]
    rec.close("finished")


def last_progress(job_dir: Path) -> dict:
    return [r for r in ledger.read(str(job_dir)).records if r["kind"] == "progress"][-1]


def test_a_failed_training_ends_its_segment_at_its_last_step(tmp_path: Path) -> None:
    rec = chief(tmp_path)
    train(rec, range(1, 4))
    time.sleep(0.05)  # the failure comes a while after the last whole step
    rec.close("failed")
    assert rec.last_step_end is not None and last_progress(tmp_path)["t1"] == round(rec.last_step_end, 3)
    other = chief(tmp_path / "finished")
    train(other, range(1, 4))
    time.sleep(0.05)
    other.close("finished")
    assert other.last_step_end is not None and last_progress(tmp_path / "finished")["t1"] > other.last_step_end


def test_a_failure_inside_a_step_ends_the_segment_at_the_last_whole_step(tmp_path: Path) -> None:
    rec = chief(tmp_path)
    train(rec, range(1, 4))
    rec.step_begin()  # step 4 starts and fails
    time.sleep(0.05)
    rec.close("failed")
    assert rec.last_step_end is not None and last_progress(tmp_path)["t1"] == round(rec.last_step_end, 3)


def test_a_recorder_off_writes_nothing(tmp_path: Path) -> None:
    rec = Recorder.off()
    assert not rec.on
    rec.restored(0)
    rec.enter("preparation")
    with rec.phase("checkpoint"):
        train(rec, range(1, 3))
    rec.committed(2)
    rec.flush()
    rec.close("finished")
    assert recorder.for_training(str(tmp_path), "workerpool1-0", 0, chief=False).ledger is None
    assert not (tmp_path / LEDGER_DIR).exists()


def test_the_ledger_never_holds_a_secret_of_the_users_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ev.TRAINER_ATTEMPT, "set by the node below")  # restored after the test
    plan = make_plan(resolve({}), RunOptions(framework="pytorch", module="trainers.digits_torch",
                                             job_dir=str(tmp_path), user_args=("--lr", "0.1", "--token", SECRET)),
                     PlatformSettings(), 0)
    ctx = runner.describe_failures(failures.FailureContext(), plan)
    platform = PlatformRecorder(str(tmp_path))
    node = runner.start_ledger(plan, ctx)  # as the runner does: the node's start, ctx.on_end its end
    assert node is not None
    rec = recorder.for_training(str(tmp_path), plan.topology.replica_name, 0, chief=True)
    assert rec.ledger is not None and rec.ledger.attempt == node.attempt  # the node's attempt, through the env
    rec.restored(0)
    rec.enter("preparation")
    train(rec, range(1, 3))
    rec.close("failed")
    try:
        raise RuntimeError(f"the tracker refused the token {SECRET!r} ({SECRET})")
    except RuntimeError as exc:
        own = failures.make_record(ctx, failures.classify(exc))
    failures.finish(ctx, own, stored=False)
    platform.ended(1)
    written = [path.read_text() for path in files(tmp_path)]  # local's, and the node's with its chief's (one pid)
    assert len(written) == 2 and all(SECRET not in text for text in written)
    kinds = {r["kind"] for r in ledger.read(str(tmp_path)).records}
    assert kinds >= {"submitted", "start", "restored", "phase", "progress", "training_end", "end", "job_end"}
    ends = [r for r in ledger.read(str(tmp_path)).records if r["kind"] == "end"]
    assert len(ends) == 1 and "***" in ends[0]["line"]  # the failure's line was there, redacted
    assert SECRET not in capsys.readouterr().err
    assert isinstance(node, NodeRecorder) and node.ended
