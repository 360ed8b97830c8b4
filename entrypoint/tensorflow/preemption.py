"""Save before preemption: TensorFlow's PreemptionCheckpointHandler, driven from tf-keras's BackupAndRestore.

A SIGTERM (or SIGINT) only sets the flag of a ``StopRequest``. TensorFlow's handler polls that flag,
and the worker that saw it first names a step through the coordination service; every worker saves
at that same step: the BackupAndRestore state (which resumes mid-epoch) and ``ckpt-<step>`` (the
chief commits it), then raises ``StopRequested``, which the failure funnel records and ends with
128 + the signal. Under ParameterServerStrategy, which the handler does not support, the chief
stops at once (``stop_at_once``) and the restart resumes from the last epoch's backup.

tf-keras turns this on only when it detects GCP (``save_before_preemption=True`` does nothing here,
and TensorFlow's handler does nothing on a GCP CPU machine), so we switch it on ourselves, as tf-keras
does on GCP. Private names relied on (pinned by tests/tensorflow/test_preemption.py):

- tf-keras: ``BackupAndRestore._training_state`` (a ``WorkerTrainingState``), ``_current_epoch`` and ``_backup``
  (every backup write goes through it; the chief's copy is in ``<backup_dir>/chief``); the
  state's ``_enable_save_before_preemption`` (mid-epoch resume counters, a handler check per batch),
  ``preemption_handler``, ``_ckpt_saved_batch`` and ``back_up``; its ``backup_if_preempted`` calls the
  handler's ``_run_counter`` and ``_check_preemption_and_maybe_checkpoint``.
- TensorFlow: the handler's ``_stop_poll_termination_signal_thread`` and
  ``_stop_cluster_wise_termination_watcher_thread`` (what its ``__del__`` calls; we call them when fit
  ends), and ``failure_handling_util.detect_platform`` / ``PlatformDevice``, pinned to the non-GCP
  platform while the handler is built, so it behaves the same everywhere (and skips a metadata probe).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tensorflow as tf

from entrypoint.cluster.environments.settings import metadata_host
from entrypoint.errors import StopRequested
from entrypoint.lifecycle.notice import NoticeWatcher
from entrypoint.lifecycle.signals import StopRequest, stop_at_once
from entrypoint.outputs.staging import Staging
from entrypoint.outputs.storage import Location
from entrypoint.tensorflow.callbacks import CommitCheckpoints, global_step
from entrypoint.tensorflow.strategy import is_parameter_server

log = logging.getLogger("entrypoint.tensorflow")
# The handler needs a checkpoint manager to restore from at start; ours never holds a checkpoint (the
# BackupAndRestore state is restored by tf-keras, from the chief's copy, on every worker), so every
# worker's handler starts counting steps from 0 together.
UNUSED_DIR = "preemption-handler-unused"
PS_STOP = ("training under ParameterServerStrategy, which cannot save before preemption; the restart resumes "
           "from the last epoch's backup")


@contextlib.contextmanager
def stop_signals(strategy: Any) -> Iterator[StopRequest | None]:
    """While training: a StopRequest the handler watches, or (ParameterServerStrategy) a stop at once."""
    if is_parameter_server(strategy):
        with stop_at_once(PS_STOP):
            yield None
        return
    request = StopRequest().install()
    try:
        yield request
    finally:
        request.uninstall()


@contextlib.contextmanager
def _platform_not_gcp() -> Iterator[None]:
    """Make the handler see a non-GCP host: on a GCP CPU machine it would otherwise do nothing."""
    from tensorflow.python.distribute.failure_handling import failure_handling_util as util

    device = util.PlatformDevice
    platform = device.INTERNAL_GPU if tf.config.list_logical_devices("GPU") else device.INTERNAL_CPU
    original = util.detect_platform
    util.detect_platform = lambda: platform
    try:
        yield
    finally:
        util.detect_platform = original


def make_handler(strategy: Any, requested: Callable[[], bool], save: Callable[[], None],
                 stop: Callable[[], None], unused_dir: str) -> Any:
    """TensorFlow's handler: polls ``requested``, agrees on a step, calls ``save`` then ``stop`` there."""
    config = tf.distribute.experimental.TerminationConfig(
        termination_watcher_fn=requested, exit_fn=stop, grace_period=0, save_fn=save)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(), directory=unused_dir, max_to_keep=1)
    with _platform_not_gcp():
        return tf.distribute.experimental.PreemptionCheckpointHandler(
            getattr(strategy, "cluster_resolver", None), manager, termination_config=config)


class NameAdvanceNotice(tf.keras.callbacks.Callback):
    """The platform's advance notice (``lifecycle/notice.py``: GCE's metadata server) is logged when a batch ends.

    Only logged: an early save on it would have every worker agree on a step first (TensorFlow's handler agrees on
    one only to stop), so Keras saves at the signal itself, as it does without a notice.
    """

    def __init__(self, replica: str) -> None:
        super().__init__()
        self.replica = replica
        self.watcher = NoticeWatcher(metadata_host())
        # it reads no logs: Keras need not fetch them for it, and ParameterServerStrategy, which refuses batch-level
        # callbacks that would, accepts it
        self._supports_tf_logs = True

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.watcher.start()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if (heard := self.watcher.take()) is not None:
            log.warning("advance notice from the platform: %s on %s: the TensorFlow loop commits no checkpoint early "
                        "on it; it saves at the signal, within --grace-period", heard, self.replica)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.watcher.stop()


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
    """BackupAndRestore that also saves (and commits ``ckpt-<step>``) at the step every worker agreed to stop at.

    With ``staging`` (gs:// checkpoints without the mount) the chief mirrors its backup copy to the store after
    each write (TensorFlow's ``checkpoint`` index file last, stale files deleted after it), and deletes it there
    when fit ends as tf-keras deletes the local one.
    """

    def __init__(self, backup_dir: str, save_freq: int | str, request: StopRequest | None,
                 commit: CommitCheckpoints, staging: Staging | None = None) -> None:
        super().__init__(backup_dir, save_freq=save_freq)  # save_before_preemption stays off: it probes for GCP
        self.request, self.commit = request, commit
        self.mirror = backup_mirror(backup_dir, staging) if commit.is_chief else None
        self.staging = staging
        self.handler: Any = None
        self.stopped_at: int | None = None

    def _backup(self, epoch: int, batch: int = 0) -> None:
        """tf-keras' backup write, then (chief, staged) its mirror on the store."""
        started = time.monotonic()
        super()._backup(epoch, batch)
        if self.mirror is not None and self.staging is not None:
            local, remote = self.mirror
            self.staging.push(local, remote, last=("checkpoint",), prune=True)
        self.commit.backup_seconds += time.monotonic() - started  # training waited for it, as for a save

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Restore (tf-keras, on every worker from the chief's copy), then switch the handler on."""
        super().on_train_begin(logs)
        if self.request is None or is_parameter_server(self.model.distribute_strategy):
            return
        if getattr(self, "_training_state", None) is None:  # not tf-keras (TF_USE_LEGACY_KERAS=0): Keras 3
            log.warning("save before preemption needs tf-keras: a stop signal ends training at the next step")
            return
        request = self.request
        self.handler = make_handler(self.model.distribute_strategy, lambda: request.requested, self._save,
                                    self._stop, f"{self.backup_dir}/{UNUSED_DIR}")
        state = self._training_state
        state.preemption_handler = self.handler
        state._enable_save_before_preemption = True  # resume mid-epoch; check the handler after each batch

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Record the last step done (a backup resumes after it), then let the handler check for a stop."""
        if self.handler is not None:
            self._training_state._ckpt_saved_batch.assign(batch)
        elif self.request is not None and self.request.requested:
            raise StopRequested(self.request.signum, f"stopped by {self._signal_name()} without saving; the "
                                "restart resumes from the last backup")
        super().on_train_batch_end(batch, logs)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Delete the backup (tf-keras) and stop the handler's watcher threads."""
        super().on_train_end(logs)
        if self.mirror is not None and self.staging is not None:
            self.staging.discard(self.mirror[1].parent)
        if self.handler is not None:
            self.handler._stop_poll_termination_signal_thread()
            self.handler._stop_cluster_wise_termination_watcher_thread()
            self.handler = None

    def _save(self) -> None:
        """Every worker, at the agreed step: the BackupAndRestore state, then ``ckpt-<step>`` (chief commits)."""
        step = global_step(self.model)
        if self.commit.record.last_step < step:  # the step it stops at ends here, before the others hear of it
            self.commit.record.step_end(step)
        batch = int(self._training_state._ckpt_saved_batch.numpy()) + 1
        self._backup(epoch=self._current_epoch, batch=batch)
        self.commit.commit(self._current_epoch, {"batch": batch, "stopped_by": self._signal_name()})
        self.stopped_at = step

    def _stop(self) -> None:
        """Every worker, after the save: end through the failure funnel (128 + the signal)."""
        step = self.stopped_at if self.stopped_at is not None else global_step(self.model)
        signum = (self.request.signum if self.request else 0) or signal.SIGTERM
        path = self.commit.path(step)
        received = self.request.received_at if self.request else None
        after = f" ({time.monotonic() - received:.1f} s after the signal)" if received is not None else ""
        if self.commit.is_chief:
            log.info("stopped by %s at step %d: checkpoint %s committed%s", self._signal_name(), step, path, after)
        raise StopRequested(signum, f"stopped by {self._signal_name()} at step {step}; the restart resumes from "
                            f"{path}")

    def _signal_name(self) -> str:
        own = self.request.signum if self.request else 0
        return signal.Signals(own).name if own else "SIGTERM (on a peer)"
