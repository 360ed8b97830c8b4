"""Save before preemption: every worker commits the newest trained step at a point they agreed on, in any phase of fit.

A SIGTERM (or SIGINT) only sets the flag of the ``TrainingStop`` (``stopping.py``); the platform's advance notice
(``lifecycle/watch/notice.py``: GCE's metadata server) is heard by a daemon thread. ``AgreedStops``, the last of the
loop's callbacks, passes a point after every training batch, every validation batch and every epoch end, and proposes
what this worker heard there; every worker acts on it at the same point (``agreement.py``): for a stop,
``SaveBeforePreemption`` saves the BackupAndRestore state (which resumes mid-epoch, or at the next epoch when the
step ended one) and ``ckpt-<step>`` (the chief commits it), then every worker raises ``StopRequested``, which the
failure funnel records and ends with 128 + the signal. A validation pass is abandoned at its next batch (the weights
do not change while it runs, so the step it follows is the newest): its checkpoint's marker says ``validated: false``
and the restart validates that epoch before it trains on. For a notice, the same commit, and training goes on.
Under ParameterServerStrategy (no agreement: its workers only serve) the chief stops at once (``stop_at_once``) and
the restart resumes from the last epoch's backup.

Private tf-keras names relied on (pinned by tests/tensorflow/test_preemption.py): ``BackupAndRestore``'s
``_training_state`` (a ``WorkerTrainingState``), ``_current_epoch``, ``_batches_count`` and ``_backup`` (every backup
write goes through it; the chief's copy is in ``<backup_dir>/chief``); the state's ``_ckpt_saved_batch`` and
``_enable_save_before_preemption``, which makes ``maybe_load_initial_counters_from_ckpt`` resume mid-epoch (set once
the state is restored, so that tf-keras's ``restore`` still reads it; its ``backup_if_preempted`` is never called).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tensorflow as tf

from entrypoint.cluster.environments.settings import metadata_host
from entrypoint.errors import StopRequested
from entrypoint.lifecycle.signals import stop_at_once
from entrypoint.lifecycle.watch.notice import NoticeWatcher
from entrypoint.outputs.staging import Staging
from entrypoint.outputs.storage import Location
from entrypoint.tensorflow.agreement import NOTICE, STOP, Agreed, Agreement, coordination_service
from entrypoint.tensorflow.callbacks import CommitCheckpoints, global_step, to_float
from entrypoint.tensorflow.stopping import TrainingStop, signal_name
from entrypoint.tensorflow.strategy import is_multi_worker, is_parameter_server

log = logging.getLogger("entrypoint.tensorflow")
PS_STOP = ("training under ParameterServerStrategy, which cannot save before preemption; the restart resumes "
           "from the last epoch's backup")
END_BARRIER = "entrypoint/agreed/fit-end"


@contextlib.contextmanager
def ps_stop(strategy: Any) -> Iterator[None]:
    """ParameterServerStrategy's chief: a stop ends it at once (after the strategy: its cluster start takes SIGTERM)."""
    if not is_parameter_server(strategy):
        yield
        return
    with stop_at_once(PS_STOP):
        yield


BACKUP_DIR = "backup"  # below the checkpoint dir
CHIEF_COPY = "chief"  # tf-keras' WorkerTrainingState: the copy every worker restores from, below the backup dir


def backup_mirror(backup_dir: str | Path, staging: Staging | None) -> tuple[Path, Location] | None:
    """The chief's backup copy in staging and its place on the store (gs:// checkpoints without the mount)."""
    if staging is None or not staging.staged("checkpoints"):
        return None
    return Path(backup_dir) / CHIEF_COPY, staging.target("checkpoints") / BACKUP_DIR / CHIEF_COPY


def restore_backup(backup_dir: str | Path, staging: Staging | None) -> list[str]:
    """Every replica before fit: download the chief's backup from the store into this replica's staging (a
    replica restarted on a new machine resumes mid-epoch as on a shared disk); the names copied."""
    mirror = backup_mirror(backup_dir, staging)
    if mirror is None or staging is None:
        return []
    local, remote = mirror
    shutil.rmtree(local, ignore_errors=True)
    return staging.pull(remote, local)


class SaveBeforePreemption(tf.keras.callbacks.BackupAndRestore):
    """BackupAndRestore that also saves (and commits ``ckpt-<step>``) at a point every worker agreed on
    (``AgreedStops`` calls ``save_now``), wherever fit stands: mid-epoch, in the validation pass, at the epoch's end.

    With ``staging`` (gs:// checkpoints without the mount) the chief mirrors its backup copy to the store after
    each write (TensorFlow's ``checkpoint`` index file last, stale files deleted after it), and deletes it there
    when fit ends as tf-keras deletes the local one.
    """

    def __init__(self, backup_dir: str, save_freq: int | str, commit: CommitCheckpoints,
                 staging: Staging | None = None, validates: bool = False) -> None:
        super().__init__(backup_dir, save_freq=save_freq)  # save_before_preemption stays off: it probes for GCP
        self.commit, self.staging, self.validates = commit, staging, validates
        self.mirror = backup_mirror(backup_dir, staging) if commit.is_chief else None
        self.batch_level = False  # the backup resumes mid-epoch and saves at agreed points (not under PS)
        self.where = "training"  # or "validating" (the epoch's validation pass), "epoch end" (its callbacks)
        self.trained_metrics: dict[str, float] = {}  # the epoch's training metrics, read before its validation
        self.test_batches = 0  # validation batches done in this pass

    def _backup(self, epoch: int, batch: int = 0) -> None:
        """tf-keras' backup write, then (chief, staged) its mirror on the store."""
        started = time.monotonic()
        super()._backup(epoch, batch)
        if self.mirror is not None and self.staging is not None:
            local, remote = self.mirror
            self.staging.push(local, remote, last=("checkpoint",), prune=True)
        self.commit.backup_seconds += time.monotonic() - started  # training waited for it, as for a save

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Restore (tf-keras, on every worker from the chief's copy), then resume and back up at batch level."""
        super().on_train_begin(logs)
        if is_parameter_server(self.model.distribute_strategy):
            return
        if getattr(self, "_training_state", None) is None:  # not tf-keras (TF_USE_LEGACY_KERAS=0): Keras 3
            log.warning("save before preemption needs tf-keras: a stop signal ends training without saving")
            return
        self._training_state._enable_save_before_preemption = True  # read only to resume mid-epoch, once restored
        self.batch_level = True

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Record the last step done (a backup resumes after it); back up every ``save_freq`` batches."""
        if not self.batch_level:
            super().on_train_batch_end(batch, logs)
            return
        self._training_state._ckpt_saved_batch.assign(batch)
        if self.save_freq != "epoch":  # tf-keras's own count (its on_train_batch_end would call the handler)
            self._batches_count: int = self._batches_count + 1
            if self._batches_count >= int(self.save_freq):
                self._batches_count = 0
                self._backup(epoch=self._current_epoch, batch=batch)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        self.where = "training"

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        """The epoch's validation starts: keep its training metrics (read on every worker: a collective), so a stop
        in the pass commits them."""
        if self.batch_level and self.validates:
            self.where, self.test_batches = "validating", 0
            self.trained_metrics = metrics_now(self.model)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.test_batches += 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        self.where = "epoch end"

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Delete the backup (tf-keras), on the store too."""
        super().on_train_end(logs)
        if self.mirror is not None and self.staging is not None:
            self.staging.discard(self.mirror[1].parent)

    def save_now(self, why: dict[str, Any]) -> tuple[int, Location]:
        """Every worker, at an agreed point: the BackupAndRestore state, then ``ckpt-<step>`` (the chief commits it;
        not again when this run committed that step already); the step and where it is committed."""
        step = global_step(self.model)
        if self.commit.record.last_step < step:  # the step it stops at ends here, before the others hear of it
            self.commit.record.step_end(step)
        batch = int(self._training_state._ckpt_saved_batch.numpy()) + 1
        per_epoch = (self.params or {}).get("steps") or 0
        history, extra = None, dict[str, Any]()
        if self.where == "epoch end":
            done = self._current_epoch + 1
        elif self.where == "validating" or (per_epoch and batch >= per_epoch):  # the epoch's training is done
            trained = self.trained_metrics if self.where == "validating" else metrics_now(self.model)
            history = {k: list(v) for k, v in self.commit.history.items()}
            for key, value in trained.items():
                history.setdefault(key, []).append(value)
            done = self._current_epoch + 1
            if self.validates:
                extra["validated"] = False
        else:
            done, extra["batch"] = self._current_epoch, batch
        self._backup(epoch=self._current_epoch, batch=batch)
        if self.commit.last_committed == step:
            return step, self.commit.path(step)
        return step, self.commit.commit(done, {**extra, **why}, history)

    def whereabouts(self) -> str:
        """Where fit stood, for the stop's line: ``, validating epoch 3 (abandoned after 2 of its batches; ...)``."""
        epoch = self._current_epoch + 1
        if self.where == "validating":
            return (f", validating epoch {epoch} (abandoned after {self.test_batches} of its batches; the restart "
                    "validates it again)")
        return f", at the end of epoch {epoch}" if self.where == "epoch end" else ""


def metrics_now(model: Any) -> dict[str, float]:
    """The model's metrics as Keras ends an epoch with them (a collective under MultiWorkerMirroredStrategy)."""
    return {k: to_float(v) for k, v in model.get_metrics_result().items()}


class AgreedStops(tf.keras.callbacks.Callback):
    """The loop's points, last among its callbacks: after every training batch, validation batch and epoch end.

    What this worker heard since its last point (a stop signal, the platform's advance notice) is proposed there, and
    every worker acts on it at the same point (``agreement.py``): a stop commits the newest trained step and ends the
    process (``StopRequested``); a notice commits it and training goes on. Under ParameterServerStrategy (no
    batch-level saves) a notice is only logged.
    """

    def __init__(self, saver: SaveBeforePreemption, stop: TrainingStop | None, replica: str, rank: int,
                 workers: int, timeout: float) -> None:
        super().__init__()
        self.saver, self.stop, self.replica = saver, stop, replica
        self.rank, self.workers, self.timeout = rank, workers, timeout
        self.watcher = NoticeWatcher(metadata_host())
        self.agreement: Agreement | None = None
        self.multi = False
        self.proposed_stop = False
        self._supports_tf_logs = True  # reads no logs: ParameterServerStrategy accepts its batch hooks then

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return True

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.watcher.start()
        if self.stop is None or not self.saver.batch_level:
            return
        self.multi = is_multi_worker(self.model.distribute_strategy) and self.workers > 1
        self.agreement = Agreement(self.workers if self.multi else 1, self.rank, self.timeout,
                                   coordination_service() if self.multi else None).start()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.stop is not None:
            self.stop.interrupt = None  # a step starts: from here a stop commits it

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.point()

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.point()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.point()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Every worker at a barrier (a stop agreed at the last point is then known to all), then stop watching."""
        self.watcher.stop()
        if self.agreement is None:
            return
        if self.multi:
            try:
                coordination_service().wait_at_barrier(END_BARRIER, int(self.timeout * 1000))
            except tf.errors.OpError as exc:  # a worker gone: its collectives failed, or will
                log.warning("the other workers did not all end fit within --timeout (%s)", type(exc).__name__)
        self.agreement.close()

    def pending_stop(self) -> Agreed | None:
        """A stop agreed at a point fit ended before reaching (every worker knows it), if any."""
        return self.agreement.pending(STOP) if self.agreement is not None else None

    def point(self) -> None:
        """Propose what this worker heard; act on what every worker agreed on for this point."""
        heard = []
        if self.stop is not None and self.stop.requested and not self.proposed_stop:
            self.proposed_stop = True
            heard.append((STOP, f"{signal_name(self.stop.signum)} on {self.replica}"))
        if (notice := self.watcher.take()) is not None:
            if self.agreement is None:
                log.warning("advance notice from the platform: %s on %s: the TensorFlow loop under "
                            "ParameterServerStrategy commits no checkpoint early on it", notice, self.replica)
            else:
                log.warning("advance notice from the platform: %s on %s: every worker commits the newest trained "
                            "step at the next batch, and training goes on until the signal", notice, self.replica)
                heard.append((NOTICE, f"{notice} on {self.replica}"))
        if self.agreement is None:
            if heard and heard[0][0] == STOP and self.stop is not None:  # tf-keras only: Keras 3 has no backup state
                raise StopRequested(self.stop.signum, f"stopped by {heard[0][1]} without saving (not a tf-keras "
                                    "model); the restart resumes from the newest committed checkpoint", False)
            return
        for agreed in self.agreement.point(heard):
            if agreed.kind == NOTICE:
                step, path = self.saver.save_now({"notice": agreed.what})
                if self.saver.commit.is_chief:
                    log.warning("advance notice from the platform: %s: checkpoint of step %d committed (%s); "
                                "training goes on until the signal", agreed.what, step, path)
            elif agreed.kind == STOP:
                self.stop_here(agreed)

    def stop_here(self, agreed: Agreed) -> None:
        """Every worker at the agreed point: commit the newest trained step, then end (128 + the signal)."""
        step, path = self.saver.save_now({"stopped_by": agreed.what})
        signum = signal_number(agreed.what.split(" ", 1)[0])
        received = self.stop.received_at if self.stop is not None else None
        after = f" ({time.monotonic() - received:.1f} s after the signal)" if received is not None else ""
        where = self.saver.whereabouts()
        if self.saver.commit.is_chief:
            log.info("stopped by %s at step %d%s: checkpoint %s committed%s", agreed.what, step, where, path, after)
        raise StopRequested(signum, f"stopped by {agreed.what} at step {step}{where}: checkpoint committed{after}; "
                            f"the restart resumes from {path}")


def signal_number(name: str) -> int:
    """15 for ``SIGTERM`` (SIGTERM for a name that is none)."""
    try:
        return int(signal.Signals[name])
    except KeyError:
        return int(signal.SIGTERM)
