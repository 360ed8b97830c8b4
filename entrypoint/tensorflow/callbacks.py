"""Keras callbacks the entrypoint adds to fit: committed checkpoints, tuning metric, progress, step count."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import tensorflow as tf

from entrypoint.errors import NonFiniteLoss
from entrypoint.lifecycle import lost_work
from entrypoint.lifecycle.recorder import Recorder
from entrypoint.lifecycle.watch.watchdog import HangWatchdog
from entrypoint.outputs.checkpoints import checkpoint_path
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.progress import Progress
from entrypoint.outputs.staging import Staging
from entrypoint.outputs.storage import Location
from entrypoint.tensorflow.checkpoint_io import KerasCheckpointIO

log = logging.getLogger("entrypoint.tensorflow")
SLOW_HOOK = "is slow compared to the batch time"  # tf-keras' warning about a callback's batch hooks
# When Keras' evaluate returns, its validation iterator is freed, and tf.data's iterator destructor can wait for the
# pipeline's autotuning thread (Model::OptimizeLoop), seen blocked in its timed wait, whose period grows up to 60 s:
# 12-13 s after a 64 s pass here (none after 19 s and 42 s passes, none with the dataset's autotune off), a hang under
# --hang-timeout 10. The hang watchdog allows the phase after a pass that bound beyond --hang-timeout.
VALIDATION_TEARDOWN = (60.0, "the validation data pipeline's teardown: tf.data's autotuning wakes every 60 s at most")


class OurHooksAreNotSlow(logging.Filter):
    """tf-keras times the batch hooks of callbacks it does not ship over fit's first batches and warns when they take
    longer than the batch (``Callback method `on_train_batch_end` is slow``). Ours fetch the batch's loss (a NaN
    stops training at that batch), which waits for the batch Keras only dispatched: the warning measures the batch
    itself. The hooks loop takes no callbacks of the user's, so every such warning in it is about ours: dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return SLOW_HOOK not in record.getMessage()


def quiet_hook_timing() -> None:
    """Drop tf-keras' timing warning about our callbacks (``OurHooksAreNotSlow``) from TensorFlow's logger, once."""
    logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, OurHooksAreNotSlow) for f in logger.filters):
        logger.addFilter(OurHooksAreNotSlow())


def fetched(value: Any) -> Any:
    """The local value of a ParameterServerStrategy RemoteValue (anything else unchanged)."""
    return value.fetch() if hasattr(value, "fetch") else value


def to_float(value: Any) -> float:
    """A Python float from a logged value (tensor, numpy, or RemoteValue)."""
    value = fetched(value)
    return float(tf.get_static_value(value) if tf.is_tensor(value) else value)


def global_step(model: Any) -> int:
    """The optimizer's step counter (restored with the weights, so it survives restarts)."""
    return int(model.optimizer.iterations.numpy())


class CommitCheckpoints(tf.keras.callbacks.Callback):
    """At each epoch end every worker saves through ``writer`` (``KerasCheckpointIO``): the chief commits
    ``ckpt-<step>`` (uploads it, marker last, when staged) and prunes old ones. Each marker carries the job's
    per-epoch metrics (``history``: the resumed checkpoint's, then this run's epochs)."""

    def __init__(self, writer: KerasCheckpointIO, strategy: str, resumed: lost_work.ResumePoint | None = None,
                 job_dir: str | None = None, history: dict[str, list[float]] | None = None) -> None:
        super().__init__()
        self.writer, self.strategy, self.resumed, self.job_dir = writer, strategy, resumed, job_dir
        self.checkpoint_dir, self.is_chief = writer.local_dir, writer.is_chief
        staging = writer.staging
        self.target: Location = staging.target("checkpoints") if staging is not None else self.checkpoint_dir
        self.recoveries: list[dict[str, Any]] = list(resumed.recoveries) if resumed else []
        self.backup_seconds = 0.0  # mirroring BackupAndRestore's backups to the store (synchronous, like a save)
        self.history: dict[str, list[float]] = {k: list(v) for k, v in (history or {}).items()}
        self.record = Recorder.off()  # the chief's job ledger (``ProgressAndSteps`` shares it)
        self.last_committed: int | None = None  # the step this run committed last (never committed twice)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """What this resume cost, once BackupAndRestore (an earlier callback) has restored: it resumes from its
        backup when that is newer than the committed checkpoint (mid-epoch), so the step training starts from is
        the model's step now, reached when the backup was written."""
        step = global_step(self.model)
        if step == 0:
            return
        reached = self.resumed.reached_at if self.resumed is not None else None
        if self.resumed is None or step > self.resumed.step:
            reached = backup_written(self.checkpoint_dir / "backup")
        lost = lost_work.after_resume(self.job_dir, step, reached)
        if lost is not None:
            log.info("%s", lost.line())
            self.recoveries.append(lost.to_dict())

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Save, commit (chief), prune (chief); a step an advance notice committed already in its validation pass
        is not rewritten (its marker says ``validated: false``: a restart from it validates that epoch again)."""
        metrics = {k: to_float(v) for k, v in (logs or {}).items()}
        for key, value in metrics.items():
            self.history.setdefault(key, []).append(value)
        step = global_step(self.model)
        again = self.last_committed == step
        path = self.path(step) if again else self.commit(epoch + 1, {"metrics": metrics})
        if self.is_chief:
            shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            log.info("epoch %d: %s; %s %s", epoch + 1, shown, "committed before:" if again else "committed", path)

    def commit(self, epochs_done: int, extra: dict[str, Any],
               history: dict[str, list[float]] | None = None) -> Location:
        """Every worker saves the current step through the writer; where the chief committed it. ``history``: the
        per-epoch metrics its marker carries (default: the epochs ended so far)."""
        step = global_step(self.model)
        meta = {"epoch": epochs_done, "step": step, "framework": "tensorflow", "strategy": self.strategy,
                "reached_at": time.time(), "recoveries": self.recoveries,
                "history": self.history if history is None else history, **extra}
        path = self.path(step)
        with self.record.phase("checkpoint", step=step):
            self.writer.save(path, self.model, meta)
        self.record.committed(step)
        self.last_committed = step
        return path

    def path(self, step: int) -> Location:
        """Where the checkpoint of ``step`` is committed."""
        return checkpoint_path(self.target, step)


class PublishTensorBoard(tf.keras.callbacks.Callback):
    """Chief, gs:// TensorBoard dir without the mount: upload the staged event files at each epoch end and at the
    end (after Keras' TensorBoard callback, which comes before it, has written and closed them)."""

    def __init__(self, staging: Staging, board: Any) -> None:
        super().__init__()
        self.staging, self.board = staging, board

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Flush Keras' writers (its epoch scalars are queued otherwise), then upload."""
        for writer in list(getattr(self.board, "_writers", {}).values()):
            writer.flush()
        self.staging.publish("tensorboard")

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """The closed event files, whole."""
        self.staging.publish("tensorboard")


def backup_written(backup_dir: Path) -> float | None:
    """When BackupAndRestore last wrote its state (the newest file's time), None without one."""
    times = [p.stat().st_mtime for p in backup_dir.rglob("*") if p.is_file()] if backup_dir.is_dir() else []
    return max(times, default=None)


class FailOnNonFiniteLoss(tf.keras.callbacks.Callback):
    """``--on-nonfinite fail`` for Keras: a batch whose loss is NaN or infinite ends training at once.

    First among the callbacks, so nothing (a backup, a checkpoint, a metric) sees the state it left.
    Under MultiWorkerMirroredStrategy every worker logs the same reduced loss, so all stop at that batch.
    """

    def __init__(self) -> None:
        super().__init__()
        self._supports_tf_logs = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Raise NonFiniteLoss when this batch's loss is not finite."""
        loss = (fetched(logs) or {}).get("loss")
        if loss is not None and not math.isfinite(to_float(loss)):
            step = global_step(self.model)
            raise NonFiniteLoss(f"the training loss was NaN or infinite at step {step}: nothing exported, no metric "
                                "reported; the committed checkpoints are from before it (lower the learning rate "
                                "or check the data)")


class ReportTuningMetric(tf.keras.callbacks.Callback):
    """Report the tuning metric after each epoch, at the global step, through the chief-only MetricReporter."""

    def __init__(self, reporter: MetricReporter, metric: str) -> None:
        super().__init__()
        self.reporter, self.metric = reporter, metric

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Report ``logs[metric]`` (a warning when the epoch did not produce it)."""
        logs = logs or {}
        if self.metric not in logs:
            log.warning("tuning metric %r is not among the epoch's metrics %s", self.metric, sorted(logs))
            return
        self.reporter.report(self.metric, to_float(logs[self.metric]), global_step(self.model))


class ProgressAndSteps(tf.keras.callbacks.Callback):
    """Count this replica's batches and beat the hang watchdog; the chief prints progress every ``log_every`` steps."""

    def __init__(self, epochs: int, global_batch_size: int, replicas: int, log_every: int, verbose: bool,
                 watchdog: HangWatchdog | None = None, record: Recorder | None = None) -> None:
        super().__init__()
        self.record = record or Recorder.off()  # the chief's job ledger: steps, evaluations
        self.epochs, self.global_batch_size, self.replicas, self.log_every, self.verbose = (
            epochs, global_batch_size, replicas, log_every, verbose)
        self.watchdog = watchdog
        self._supports_tf_logs = True  # convert the loss only when a line is printed
        self.batches = 0
        self.first_epoch: int | None = None
        self.start_step = 0
        self._epoch = 0
        self._progress: Progress | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Record where training starts (after BackupAndRestore has restored, which runs first)."""
        self.start_step = global_step(self.model)
        self.record.restored(self.start_step)
        self.record.enter("preparation")
        per_epoch = self.params.get("steps") or 0
        self._progress = Progress(per_epoch * self.epochs, self.global_batch_size, self.start_step)
        self.record.total = self.expected_steps
        if self.watchdog is not None:  # the first step is part of the start-up: Keras traces and compiles it
            self.watchdog.start().beat(self.start_step, "in the first training step (Keras traces and compiles it)")

    @property
    def expected_steps(self) -> int | None:
        """The steps of the whole training (epochs x steps per epoch), None when Keras does not know them."""
        per_epoch = (self.params or {}).get("steps") or 0
        return per_epoch * self.epochs or None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Remember the epoch (and the first one: > 0 after a resume)."""
        self._epoch = epoch
        if self.first_epoch is None:
            self.first_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.record.step_begin()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.record.enter("evaluation")

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        """The pass is over: beat, so Keras' own end of it and the epoch's first callbacks are not timed as a hang;
        with ``VALIDATION_TEARDOWN`` more, the longest its data pipeline's teardown can wait."""
        self.record.leave()
        if self.watchdog is not None:
            self.watchdog.beat(self.watchdog.step, "between steps (validation done; the epoch's checkpoints next)",
                               VALIDATION_TEARDOWN)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """A validation batch is live, not hung: beat at the last trained step (a long pass is not a hang)."""
        if self.watchdog is not None:
            self.watchdog.beat(self.watchdog.step, f"between steps (validating: {batch + 1} validation batches done)")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Count the batch and beat the watchdog; print a progress line on the chief every ``log_every`` steps."""
        self.batches += 1
        step = self.start_step + self.batches
        self.record.step_end(step)
        if self.watchdog is not None:  # the first one ends the start-up: --hang-timeout holds from here on
            self.watchdog.trained(step, "between steps (validating, checkpointing or waiting for the next batch)")
        if self.verbose and self._progress is not None and self.batches % self.log_every == 0:
            # Keras sums the replicas' batch logs (its "auto" reduction off TPU): show their mean.
            loss = to_float((fetched(logs) or {}).get("loss", float("nan"))) / self.replicas
            log.info("%s", self._progress.line(self._epoch + 1, self.epochs, step, loss))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Validation is over: beat the watchdog before the epoch's checkpoints."""
        if self.record.on:
            self.record.metrics = {k: to_float(v) for k, v in (logs or {}).items() if k.startswith("val_")}
        if self.watchdog is not None:
            self.watchdog.beat(self.start_step + self.batches, "checkpointing at the end of an epoch")

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Training is over: stop watching (export and summary are not training steps)."""
        if self.watchdog is not None:
            self.watchdog.stop()
