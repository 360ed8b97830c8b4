"""What a process tells the job ledger (``outputs/goodput/ledger.py``), framework-free: the loops and the node call it.

``NodeRecorder``: a node's ``run`` process, every replica: its attempt's ``start`` (when the process started) and
``end`` (exit code, class, last line). ``Recorder``: the chief's training process (the hooks loops, a script
through ``entrypoint.context``): the phases it goes through and its steps, aggregated. A step costs two clock
reads and a comparison; records are written when an activity changes (a checkpoint, an evaluation), every
``FLUSH_EVERY`` seconds of training, and at the end. Every other process gets ``Recorder.off()``, which does
nothing.

Phases (each a ``phase`` record with ``t0``, ``t1``): ``preparation`` (datasets, model, optimizer), ``restore``,
``checkpoint`` (the training's time blocked by a save), ``evaluation``, ``export``, ``recovery`` (an in-place
recovery: from the last good step to training again). Training is ``progress`` records: the steps ``first`` to
``last`` trained between ``t0`` and ``t1``, the seconds spent waiting for batches (``data_seconds``) and the
first step of the attempt (``first_step_seconds``: imports and compilation happen there; ``first_step_end``: when
it ended, so the attempt's start-up through its first step is read against its ``start``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from entrypoint.cluster.environments.settings import goodput_job_name, ledger_attempt
from entrypoint.errors import ConfigError
from entrypoint.failures.records import read_records
from entrypoint.lifecycle.jobdir import jobrecord, lease
from entrypoint.outputs import checkpoints, goodput, storage
from entrypoint.outputs.goodput import Report, ledger
from entrypoint.outputs.goodput.ledger import Ledger, attempt_id, process_start_time
from entrypoint.outputs.goodput.model import Witness
from entrypoint.outputs.storage import Location
from entrypoint.outputs.summary import SUMMARY_FILE

if TYPE_CHECKING:
    from entrypoint.outputs.goodput.kubeflow_progress import KubeflowProgress

log = logging.getLogger("entrypoint")
FLUSH_EVERY = 10.0  # seconds of training between progress records
PROGRESS_CLOSE = 5.0  # seconds the end of a training waits for its last progress post, at most
_TRAINING: list[Recorder] = []  # this process's chief training recorder (``ending_abruptly``)


class Recorder:
    """The chief training process's activities and steps, written to the job ledger."""

    def __init__(self, ledger: Ledger | None, progress: KubeflowProgress | None = None,
                 step_entries: str | None = None) -> None:
        self.ledger = ledger
        self.progress = progress  # Kubeflow Trainer's progress, posted at every flush (off the training's path)
        self.step_entries = step_entries  # ml-goodput-measurement's job name: one step_start_time entry a step
        self.metrics: dict[str, float] = {}  # the newest evaluation's, for the progress posts
        self.total: int | None = None  # the step the training ends at, when the loop knows it
        self._phase: tuple[str, float] | None = None  # the activity outside training, since when
        self._seg_t0: float | None = None  # the training segment being aggregated
        self._seg_first = self._seg_last = -1
        self._seg_steps = 0
        self._seg_data = self._seg_step_seconds = 0.0
        self._first_step: float | None = None  # the attempt's first step's seconds, until written
        self._first_end = 0.0  # when it ended
        self._first_done = False
        self._step_t0 = 0.0
        self._idle_since: float | None = None  # end of the last step or phase: the wait for the next batch
        self._flush_at = 0.0
        self.last_step = -1
        self.last_step_end: float | None = None  # when the newest step ended

    @classmethod
    def off(cls) -> Recorder:
        return cls(None)

    @property
    def on(self) -> bool:
        return self.ledger is not None

    # ---- activities ----------------------------------------------------------------------------
    def enter(self, name: str, t: float | None = None) -> None:
        """An activity outside training starts now (the previous one, or the training segment, ends)."""
        if self.ledger is None:
            return
        now = time.time() if t is None else t
        self._close_segment(now)
        self._close_phase(now)
        self._phase = (name, now)

    @contextlib.contextmanager
    def phase(self, name: str, **fields: Any) -> Iterator[None]:
        """``name`` lasts for the block; the time after it, until the next step, is a wait for data."""
        if self.ledger is None:
            yield
            return
        self.enter(name)
        try:
            yield
        finally:
            now = time.time()
            self._close_phase(now, **fields)
            self._idle_since = now

    def leave(self) -> None:
        """The activity ``enter`` started is over; until the next step, a wait for data."""
        if self.ledger is not None and self._phase is not None:
            now = time.time()
            self._close_phase(now)
            self._idle_since = now

    def _close_phase(self, now: float, **fields: Any) -> None:
        if self._phase is not None and self.ledger is not None:
            name, t0 = self._phase
            self.ledger.add("phase", name=name, t0=round(t0, 3), t1=round(now, 3), t=now, **fields)
        self._phase = None

    # ---- steps -----------------------------------------------------------------------------------
    def step_begin(self) -> None:
        if self.ledger is None:
            return
        now = time.time()
        if self._phase is not None:  # the activity before the steps (preparation, a restore) ends here
            self._close_phase(now)
            self._idle_since = now
        if self._seg_t0 is None:
            self._seg_t0 = self._idle_since if self._idle_since is not None else now
            self._seg_first = self.last_step + 1 if self.last_step >= 0 else -1
            self._flush_at = now + FLUSH_EVERY
        if self._idle_since is not None:
            self._seg_data += now - self._idle_since
            self._idle_since = None
        self._step_t0 = now
        if self.step_entries:
            self._entry(step_count=self.last_step + 1 if self.last_step >= 0 else 0, step_start_time=now)

    def step_end(self, step: int) -> None:
        """Step ``step`` (the count of steps trained, after it) is done."""
        if self.ledger is None:
            return
        now = time.time()
        seconds = now - self._step_t0
        if not self._first_done:
            self._first_done, self._first_step, self._first_end = True, seconds, now
        if self._seg_first < 0:
            self._seg_first = step
        self._seg_last, self.last_step = step, step
        self._seg_steps += 1
        self._seg_step_seconds += seconds
        self._idle_since = self.last_step_end = now
        if now >= self._flush_at or self._first_step is not None:  # the attempt's first step is written at once
            self._close_segment(now)

    def _close_segment(self, now: float, at_last_step: bool = False) -> None:
        """Write the segment, ending now (or, after a failure, where its last whole step ended)."""
        if self._seg_t0 is None or self.ledger is None:
            return
        last = self.last_step_end
        end = last if at_last_step and last is not None and last >= self._seg_t0 else now
        if self._seg_steps:
            fields: dict[str, Any] = {"first": self._seg_first, "last": self._seg_last, "steps": self._seg_steps,
                                      "step_seconds": round(self._seg_step_seconds, 4),
                                      "data_seconds": round(max(self._seg_data, 0.0), 4)}
            if self._first_step is not None:
                fields.update(first_step_seconds=round(self._first_step, 4), first_step_end=round(self._first_end, 3))
                self._first_step = None
            self.ledger.add("progress", t0=round(self._seg_t0, 3), t1=round(end, 3), t=end, **fields)
            if self.progress is not None:
                self.progress.update(self._seg_last, self.total, self.metrics)
        self._seg_t0, self._seg_steps, self._seg_data, self._seg_step_seconds = None, 0, 0.0, 0.0
        self._seg_first = -1

    # ---- events ------------------------------------------------------------------------------------
    def restored(self, step: int, **fields: Any) -> None:
        """The training resumes after step ``step`` (0: from the start; what a checkpoint held otherwise)."""
        self.last_step = step
        self._first_done = False
        self.event("restored", step=step, **fields)

    def rolled_back(self, step: int) -> None:
        """The training goes on after ``step`` within this attempt (FSDP's survivors rolled back to a snapshot in peer
        memory): the steps after it are lost, and the next one is not the attempt's first."""
        self.last_step = step
        self.event("restored", step=step, in_place=True)

    def committed(self, step: int) -> None:
        self.event("committed", step=step)

    def event(self, kind: str, **fields: Any) -> None:
        if self.ledger is not None:
            self.ledger.add(kind, **fields)

    def close(self, outcome: str, **fields: Any) -> None:
        """The training process's end (``finished``, ``stopped``, ``failed``): what is open is written."""
        if self.ledger is None:
            return
        now = time.time()
        self._close_segment(now, at_last_step=outcome == "failed")
        self._close_phase(now)
        self.ledger.add("training_end", outcome=outcome, step=self.last_step, **fields)
        if self.step_entries and outcome == "finished":
            self._entry(job_end_time=now)
        self.ledger.close()
        if self.progress is not None:
            if outcome == "finished":
                self.progress.update(self.last_step, self.total, self.metrics, done=True)
            self.progress.close(PROGRESS_CLOSE)

    def flush(self, at_last_step: bool = False) -> None:
        """Write the training segment so far (the goodput read now sees it), ending now or, ``at_last_step``, where
        its last whole step ended."""
        if self.ledger is not None:
            now = time.time()
            self._close_segment(now, at_last_step)
            self.ledger.flush()

    def job_started(self, t: float) -> None:
        if self.step_entries:
            self._entry(job_start_time=t)

    def _entry(self, **fields: Any) -> None:
        """One of ml-goodput-measurement's entries, as a Cloud Logging structured line (docs/goodput.md)."""
        line = json.dumps({"severity": "INFO", "job_name": self.step_entries, **fields}) + "\n"
        try:  # one write of the whole line: a block-buffered stdout cut lines where log lines came between
            sys.stdout.flush()
            os.write(sys.stdout.fileno(), line.encode())
        except (OSError, ValueError):
            pass


class NodeRecorder:
    """A node's ``run`` process: its attempt's start and end in the job ledger."""

    def __init__(self, job_dir: str, replica: str, chief: bool, fields: dict[str, Any]) -> None:
        self.started = process_start_time()
        self.attempt = attempt_id(replica, self.started)
        self.ledger = Ledger(job_dir, self.attempt, replica, None)
        self.ledger.add("start", t=self.started, chief=chief, **fields)
        self.ledger.flush()  # on a store too: the other replicas look for it past the start-up barrier
        self.ended = False

    def end(self, code: int, failure_class: str | None = None, line: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        self.ledger.add("end", code=int(code), failure_class=failure_class, line=line)
        self.ledger.close()


class PlatformRecorder:
    """The emulated platform (``local``): when the job was submitted (its process's start) and when it ended, so
    the ledger's wall time is the platform's, its own start-up and the gaps between replicas' runs included."""

    def __init__(self, job_dir: str) -> None:
        started = process_start_time()
        self.ledger = Ledger(job_dir, attempt_id("local", started), "local", None)
        self.ledger.add("submitted", t=started)
        self.done = False

    def ended(self, code: int | None) -> None:
        """The job ended (its replicas are gone): once."""
        if not self.done:
            self.done = True
            self.ledger.add("job_end", code=code)
            self.ledger.close()


def for_training(job_dir: str | None, replica: str, rank: int | None, chief: bool) -> Recorder:
    """The recorder of a training process: the chief's writes the ledger under its node's attempt (docs/goodput.md);
    every other process's does nothing."""
    if not chief or job_dir is None:
        return Recorder.off()
    attempt = ledger_attempt()
    if attempt is None:  # trained outside ``run`` (a test calling the loop): an attempt of its own
        attempt = attempt_id(replica, process_start_time())
    from entrypoint.outputs.goodput.kubeflow_progress import KubeflowProgress  # urllib and ssl: for the chief only

    record = Recorder(Ledger(job_dir, attempt, replica, rank if rank is not None else 0),
                      KubeflowProgress.from_settings(), step_entries=goodput_job_name())
    _TRAINING.append(record)
    if record.step_entries:  # ml-goodput-measurement's job start: when this attempt's node process started
        record.job_started(_attempt_started(attempt))
    return record


def ending_abruptly() -> None:
    """This process is about to end without its training's own end (``os._exit`` from another thread: node 0 ends
    an attempt a restarted peer node made hopeless): what the chief's training recorded is written, its open
    segment ending where its last whole step ended, so the steps it trained since its last progress record keep
    their time (a restore rolls them back as wasted progress, not as steps of no duration)."""
    for record in _TRAINING:
        with contextlib.suppress(Exception):  # the training thread may be mid-step: best effort, then gone
            record.flush(at_last_step=True)


def _attempt_started(attempt: str) -> float:
    """When the node process of ``attempt`` (``replica@host:pid:stamp``, ``attempt_id``) started (this process's
    start for an id without a pid; now when that process cannot be read)."""
    pid = attempt.rsplit(":", 2)[-2] if attempt.count(":") >= 2 else ""
    return process_start_time(int(pid)) if pid.isdigit() else process_start_time()


def witnesses(job_dir: str) -> list[Witness]:
    """The job's failure records, as goodput reads them (``goodput.Witness``)."""
    return [Witness(r.time, r.replica, r.step, r.failure_class, r.exit_code, r.message.split(";")[0][:120],
                    verdict=bool(r.reported_by)) for r in read_records(job_dir, 0.0)]


goodput.add_witness_source(witnesses)  # goodput.of_job (the training summary's goodput, local's line) reads them


def report_for(job_dir: str) -> Report | str:
    """The ``goodput`` command's report on ``job_dir``: provisional while a job of ours holds it; a line of what is
    known (summary, checkpoints) for a job dir without a ledger; a ``ConfigError`` for a path that is not a job dir,
    or one another job is writing."""
    folder = storage.path(job_dir)
    if not folder.is_dir():
        raise ConfigError("JOB_DIR", f"{job_dir} is not a directory: name a job dir (the --job-dir of a run)")
    found = ledger.read(job_dir)
    holder = lease.Holder.read(folder / lease.LEASE)
    running = holder is not None and lease.in_use(job_dir) is not None
    starts = ledger.of_kind(found.records, "start")
    if running and holder is not None and holder.job and starts and starts[-1].get("job") not in (None, holder.job):
        raise ConfigError("JOB_DIR", f"{job_dir} is being written by another job ({holder}) than the one its ledger "
                                     "records: its goodput is that job's to report when it ends")
    if not found.files:
        return _without_ledger(job_dir, folder)
    return goodput.compute(found, job_dir, running=running, witnesses=witnesses(job_dir))


def _without_ledger(job_dir: str, folder: Location) -> str:
    """A job dir with no ledger (a job from before it): one line of what its summary and checkpoints say."""
    known = [name for name in (jobrecord.RECORD, lease.LEASE, "checkpoints", "model", "failures")
             if (folder / name).exists()]
    if not known:
        raise ConfigError("JOB_DIR", f"{job_dir} is not a job dir: no ledger/, {jobrecord.RECORD}, checkpoints/ or "
                                     "model/ in it")
    said = []
    summary = folder / "model" / SUMMARY_FILE
    if summary.exists():
        with contextlib.suppress(ValueError, OSError):
            s = json.loads(summary.read_text())
            said.append(f"its last training summary says steps {s.get('start_step')} to {s.get('final_step')} in "
                        f"{s.get('seconds')} s ({s.get('samples_per_second')} samples/s), "
                        f"{len(s.get('recoveries') or [])} recoveries")
    newest = checkpoints.committed(folder / "checkpoints", warn=False) if (folder / "checkpoints").exists() else []
    if newest:
        said.append(f"its newest committed checkpoint is at step {newest[-1][0]}")
    return (f"{job_dir}: no job ledger (a job from before the ledger, or one that wrote none): goodput unknown; "
            + ("; ".join(said) if said else "no training summary or committed checkpoint either"))
