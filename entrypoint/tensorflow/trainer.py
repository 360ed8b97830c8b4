"""Hooks mode on chief and workers: build in scope, fit with backup/checkpoints/metrics, export on the chief."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from entrypoint import failures
from entrypoint.errors import ConfigError, ExitCode, StopRequested
from entrypoint.lifecycle import lost_work, recorder, shutdown
from entrypoint.lifecycle.recorder import Recorder
from entrypoint.lifecycle.startup.listening import ServerWatch
from entrypoint.lifecycle.watch.watchdog import HangWatchdog
from entrypoint.outputs import goodput
from entrypoint.outputs.checkpoints import Retention, load_newest, read_marker
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.locations import ensure_writable
from entrypoint.outputs.staging import Staging
from entrypoint.outputs.summary import TrainingSummary, write_summary
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import module_default, parse_user_args
from entrypoint.tensorflow.checkpoint_io import KerasCheckpointIO
from entrypoint.tensorflow.done import announce_done, clear_done
from entrypoint.tensorflow.export import export_model
from entrypoint.tensorflow.hooks import (
    TFContext,
    batched,
    build_compiled_model,
    make_context,
    parameter_server_input,
    steps_per_epoch,
    user_datasets,
)
from entrypoint.tensorflow.stopping import TrainingStop, signal_name
from entrypoint.tensorflow.strategy import is_multi_worker, is_parameter_server, make_strategy

log = logging.getLogger("entrypoint.tensorflow")
LOAD_WITH = "tf_keras.models.load_model('<model_dir>')  # a SavedModel"
SAVED_MODEL = "saved_model.pb"  # a SavedModel's graph: uploaded last, so finding it means the export is whole
# A stop's exception, kept until the process ends: its traceback holds fit's frames and so its datasets' iterators,
# whose destruction waits for their prefetched batch; under MultiWorkerMirroredStrategy that batch's collective waits
# for peers that are leaving too (measured: 5 s, under load 15 s, past the grace period, after the record is written).
STOPPED: list[BaseException] = []


def fit_inputs(module: ModuleType, args: argparse.Namespace, ctx: TFContext) -> dict[str, Any]:
    """``model.fit`` data arguments: batched/sharded datasets, or per-worker DatasetCreators under PS."""
    train, evaluation = user_datasets(module, args, ctx)
    if not is_parameter_server(ctx.strategy):
        multi = is_multi_worker(ctx.strategy)
        # Without DEFAULTS["steps_per_epoch"] an epoch is one pass over the (finite) training set.
        inputs: dict[str, Any] = {"x": batched(train, ctx, multi),
                                  "steps_per_epoch": module_default(module, "steps_per_epoch", None)}
        if evaluation is not None:
            inputs["validation_data"] = batched(evaluation, ctx, multi)
        return inputs
    steps = steps_per_epoch(train, ctx, module)
    if steps is None:
        raise ConfigError("--module", "ParameterServerStrategy repeats the data: the training set needs a known "
                          "size, or DEFAULTS['steps_per_epoch'] in the module")
    inputs = {"x": parameter_server_input(module, args, ctx, 0), "steps_per_epoch": steps}
    if evaluation is not None:
        inputs["validation_data"] = parameter_server_input(module, args, ctx, 1)
        inputs["validation_steps"] = steps_per_epoch(evaluation, ctx, module) or 1
    return inputs


def resume(model: Any, plan: Plan, writer: KerasCheckpointIO,
           staging: Staging) -> tuple[int, lost_work.ResumePoint | None, dict[str, list[float]], Any]:
    """Load the job's newest committed checkpoint that loads (``--resume-from`` while it has none of its own, as
    ``load_newest`` decides): the epoch to start from (0: none), where that checkpoint was (its step, when it was
    reached, the recoveries so far) and the job's per-epoch metrics up to it (a rerun at the final checkpoint
    trains nothing, and its summary keeps them). What the resume cost is known only once BackupAndRestore has
    restored its own, possibly newer, state (``CommitCheckpoints``); and the checkpoint's path when its epoch's
    validation was abandoned (a stop or a notice in the pass: its marker says ``validated: false``), else None.
    A checkpoint on a store (gs:// without the mount) is verified there and loaded from a downloaded copy."""
    found = load_newest(staging.target("checkpoints"), plan.options.resume_from,
                        lambda path: writer.load(path, model), writer.retention)
    if found is None:
        return 0, None, {}, None
    path, epoch = found
    marker = read_marker(path)
    step = int(marker.get("step", 0))
    log.info("resumed from %s at step %d (epoch %d)", path, step, epoch)
    reached = marker.get("reached_at")
    history = {str(k): [float(x) for x in v] for k, v in (marker.get("history") or {}).items()}
    point = lost_work.ResumePoint(step, float(reached) if reached is not None else None,
                                  list(marker.get("recoveries") or []))
    return epoch, point, history, path if marker.get("validated") is False else None


def gather_steps(strategy: Any, batches: int) -> list[int]:
    """Every training replica's batch count (a collective under MultiWorkerMirroredStrategy)."""
    if not is_multi_worker(strategy):
        return [batches] * strategy.num_replicas_in_sync  # one process drives them all, step by step
    import tensorflow as tf

    local = tf.constant([batches], dtype=tf.int64)

    @tf.function
    def gather() -> Any:
        return strategy.run(lambda: tf.distribute.get_replica_context().all_gather(local, axis=0))

    gathered = strategy.experimental_local_results(gather())[0]
    return [int(v) for v in gathered.numpy()]


def make_callbacks(plan: Plan, ctx: TFContext, reporter: MetricReporter, metric: str | None,
                   stop: TrainingStop | None, watchdog: HangWatchdog, writer: KerasCheckpointIO,
                   resumed: lost_work.ResumePoint | None, history: dict[str, list[float]],
                   staging: Staging, record: Recorder | None = None,
                   validates: bool = False) -> tuple[list[Any], Any, Any, Any]:
    """Backup, restore and save-before-preemption first (it restores before the others look), then ours, and last
    the agreed points (a stop or a notice acts after every other callback's work at a batch or an epoch end)."""
    import tensorflow as tf

    from entrypoint.tensorflow.callbacks import (
        CommitCheckpoints,
        FailOnNonFiniteLoss,
        ProgressAndSteps,
        PublishTensorBoard,
        ReportTuningMetric,
        quiet_hook_timing,
    )
    from entrypoint.tensorflow.preemption import BACKUP_DIR, AgreedStops, SaveBeforePreemption

    options, ckpt = plan.options, Path(ctx.checkpoint_dir)
    quiet_hook_timing()  # every callback of fit is ours: tf-keras' "is slow" warning would time the batch itself
    progress = ProgressAndSteps(ctx.epochs, ctx.global_batch_size, ctx.num_replicas_in_sync, options.log_every,
                                ctx.is_chief, watchdog, record)
    commit = CommitCheckpoints(writer, plan.strategy, resumed, plan.outputs.job_dir, history)
    commit.record = progress.record
    saver = SaveBeforePreemption(str(ckpt / BACKUP_DIR), options.checkpoint_every or "epoch", commit, staging,
                                 validates)
    callbacks: list[Any] = [FailOnNonFiniteLoss(), saver, progress, commit]
    if ctx.is_chief:
        board = tf.keras.callbacks.TensorBoard(ctx.tensorboard_dir, update_freq="epoch", profile_batch=0)
        callbacks.append(board)
        if staging.staged("tensorboard"):
            callbacks.append(PublishTensorBoard(staging, board))
        if metric:
            callbacks.append(ReportTuningMetric(reporter, metric))
    stops = AgreedStops(saver, stop, plan.topology.replica_name, ctx.rank or 0, ctx.world_size, options.timeout)
    return [*callbacks, stops], progress, commit, stops


def train(plan: Plan, module: ModuleType, failure_context: failures.FailureContext,
          stop: TrainingStop | None = None) -> int:
    """Train with the module's hooks under the plan's strategy; the chief exports and announces the end. ``stop``:
    the job's stop signals (``stopping.py``; None under ParameterServerStrategy, whose chief stops at once)."""
    import tensorflow as tf

    from entrypoint.tensorflow.preemption import ps_stop

    options = plan.options
    args = parse_user_args(module, options.user_args)
    tf.keras.utils.set_random_seed(options.seed)  # same pipelines on every worker: DATA sharding relies on it
    if stop is not None:
        stop.phase = "starting the strategy (and joining the other workers)"
    strategy = make_strategy(plan, failure_context)
    if stop is not None:  # TensorFlow's cluster start installs its own SIGTERM handler: take it back
        stop.reinstall()
    # From here the start-up (building, restoring, the first step) is bounded by --startup-timeout, each later step by
    # --hang-timeout.
    watchdog = HangWatchdog(options.hang_timeout, failure_context, options.startup_timeout)
    watchdog.start()
    if stop is not None:  # a stop the loop cannot take in time ends at the grace period, saying so
        stop.guard(options.grace_period, failure_context, lambda: watchdog.phase)
    # ParameterServerStrategy: the chief watches its servers; a lost one is why training failed (retryable).
    servers = plan.topology.training_peers(include_servers=True)[1:] if is_parameter_server(strategy) else ()
    # The chief's job ledger (docs/goodput.md): phases, steps, saves and the restore.
    record = recorder.for_training(plan.outputs.job_dir, plan.topology.replica_name, 0, plan.topology.is_chief_node)
    try:
        with Staging(plan.outputs) as staging, ps_stop(strategy), ServerWatch(servers) as watch:
            try:
                code = _train(plan, module, args, strategy, Phases(watchdog, stop), staging, record)
                record.close("finished")
                return code
            except BaseException as exc:
                record.close("stopped" if isinstance(exc, StopRequested) else "failed")
                if isinstance(exc, StopRequested):  # committed: TensorFlow's teardown would only cost time
                    if stop is not None:
                        stop.ending.set()
                    STOPPED.append(exc)  # its frames keep fit's iterators alive (see STOPPED)
                    shutdown.without_finalization("a TensorFlow replica stopped by a signal")
                if isinstance(exc, Exception):
                    watch.blame(exc)
                raise
    finally:
        watchdog.stop()


class Phases:
    """What the replica is doing, told to the hang watchdog (its stack dump and line) and to the stop signals (a
    stop before the first step names it)."""

    def __init__(self, watchdog: HangWatchdog, stop: TrainingStop | None) -> None:
        self.watchdog, self.stop = watchdog, stop

    def enter(self, phase: str) -> None:
        self.watchdog.phase = phase
        if self.stop is not None:
            self.stop.phase = phase


def _train(plan: Plan, module: ModuleType, args: argparse.Namespace, strategy: Any, phases: Phases,
           staging: Staging, record: Recorder) -> int:
    started, options = time.time(), plan.options
    ctx, model, inputs, writer, restored = _prepare(plan, module, args, strategy, phases, staging, record)
    initial_epoch, resumed, history, unvalidated = restored
    metric = options.hypertune_metric or getattr(module, "HYPERTUNE_METRIC", None)
    reporter = MetricReporter(ctx.is_chief, ctx.trial, asked=options.hypertune_metric is not None)
    if unvalidated is not None and "validation_data" in inputs:
        validate_again(model, inputs, history, unvalidated, reporter, metric, phases, record)
    callbacks, progress, commit, stops = make_callbacks(plan, ctx, reporter, metric, phases.stop, phases.watchdog,
                                                        writer, resumed, history, staging, record,
                                                        validates="validation_data" in inputs)
    log.info("training %d epoch(s), global batch %d (%d per replica x %d)", ctx.epochs, ctx.global_batch_size,
             ctx.per_replica_batch_size, ctx.num_replicas_in_sync)
    phases.enter("starting Keras' fit (its callbacks restore the backup)")
    model.fit(**inputs, epochs=ctx.epochs, initial_epoch=initial_epoch, callbacks=callbacks, verbose=0)
    stop_after_fit(stops, commit, phases)
    steps = gather_steps(strategy, progress.batches)
    record.enter("export")
    if ctx.is_chief:
        log.info("exporting the model to %s", staging.target("model"))
    export_model(model, Path(ctx.model_dir), ctx.is_chief)
    if ctx.is_chief:
        staging.publish("model", last=(SAVED_MODEL,))  # gs:// without the mount: saved_model.pb last
        if metric and progress.first_epoch is None:  # a rerun at the final checkpoint: report its metric again
            reporter.report_final(metric, commit.history, int(model.optimizer.iterations.numpy()))
        summary = summarize(plan, ctx, model, commit.history, progress, steps, reporter, time.time() - started)
        summary.recoveries = commit.recoveries
        # Saves and uploads are synchronous: training waited for all of it (the writer's two totals are equal).
        summary.checkpoint_blocked_seconds = round(writer.blocked_seconds + commit.backup_seconds, 3)
        summary.checkpoint_write_seconds = round(writer.write_seconds + commit.backup_seconds, 3)
        record.flush()
        summary.goodput = goodput.so_far(plan.outputs.job_dir)
        write_summary(staging.target("model"), summary)
        announce_done(staging.target("checkpoints"))
        log.info("exported the model to %s", staging.target("model"))
    if phases.stop is not None:
        phases.stop.interrupt = None  # done: a signal from here on waits for the exit
        if phases.stop.requested:
            log.info("received %s during the export, which every worker runs together under "
                     "MultiWorkerMirroredStrategy: it finished first", signal_name(phases.stop.signum))
    return ExitCode.OK


def _prepare(plan: Plan, module: ModuleType, args: argparse.Namespace, strategy: Any, phases: Phases,
             staging: Staging, record: Recorder) -> tuple[TFContext, Any, dict[str, Any], KerasCheckpointIO, Any]:
    """Before fit: the context, the model, the datasets, the writer and what ``resume`` restored."""
    from entrypoint.tensorflow.preemption import BACKUP_DIR, restore_backup

    options, out = plan.options, plan.outputs
    record.enter("preparation")
    phases.enter("preparing the training context")
    ctx = make_context(plan, module, strategy, staging)
    if staging.any_staged:
        log.info("TensorFlow writes the gs:// outputs to %s; the chief uploads each commit, the export and "
                 "TensorBoard's events from there", staging.root)
    if ctx.is_chief:
        phases.enter("checking the output directories")
        ensure_writable([out.model_dir, out.checkpoint_dir, out.tensorboard_dir])
        clear_done(staging.target("checkpoints"))
    phases.enter("building the model (build_model)")
    model = build_compiled_model(module, args, ctx)
    phases.enter("building the datasets (build_datasets)")
    inputs = fit_inputs(module, args, ctx)
    writer = KerasCheckpointIO(Path(ctx.checkpoint_dir), ctx.is_chief, Retention(options.keep_checkpoints), staging)
    phases.enter("restoring the newest checkpoint")
    with record.phase("restore"):
        restored = resume(model, plan, writer, staging)
        restore_backup(Path(ctx.checkpoint_dir) / BACKUP_DIR, staging)  # BackupAndRestore reads the chief's copy
    record.enter("preparation")
    if phases.stop is not None:
        point = restored[1]
        phases.stop.restart = (f"the restart resumes where this attempt did (step {point.step})" if point else
                               "the restart starts from the beginning, as this attempt did")
    return ctx, model, inputs, writer, restored


def validate_again(model: Any, inputs: dict[str, Any], history: dict[str, list[float]], path: Any,
                   reporter: MetricReporter, metric: str | None, phases: Phases, record: Recorder) -> None:
    """The resumed checkpoint's epoch ended without its validation (a stop or a notice came in the pass): validate
    it now, before training on, so the job's history and its tuning metric have every epoch's (on every worker)."""
    from entrypoint.tensorflow.callbacks import global_step, to_float

    phases.enter(f"validating again the epoch that ended at {path}")
    with record.phase("evaluation"):
        logs = model.evaluate(inputs["validation_data"], steps=inputs.get("validation_steps"), verbose=0,
                              return_dict=True)
    record.enter("preparation")
    validated = {f"val_{k}": to_float(v) for k, v in logs.items()}
    for key, value in validated.items():
        history.setdefault(key, []).append(value)
    shown = " ".join(f"{k} {v:.4f}" for k, v in validated.items())
    log.info("validated again the epoch that ended at %s (its validation pass was abandoned): %s", path, shown)
    if metric in validated:
        reporter.report(metric, validated[metric], global_step(model))


def stop_after_fit(stops: Any, commit: Any, phases: Phases) -> None:
    """Fit ended, its last step committed (at the last epoch end). A stop agreed at a point fit ended before reaching
    ends every worker now (each knows it); with one worker, so does a signal since, or one during the export. The
    restart exports. Under MultiWorkerMirroredStrategy a signal only one worker heard waits for the export, which
    every worker runs together."""
    from entrypoint.tensorflow.callbacks import global_step
    from entrypoint.tensorflow.preemption import signal_number

    stop = phases.stop
    if stop is None:
        return
    step = global_step(stops.model)
    path = commit.path(step)

    def stopped(signum: int, by: str = "") -> StopRequested:
        return StopRequested(signum, f"stopped by {by or signal_name(signum)} after the last training step ({step}), "
                             f"while {stop.phase}: checkpoint {path} is committed; the model was not exported: the "
                             "restart exports it")

    phases.enter("exporting the model")
    stop.late_committed = True  # the export under MultiWorkerMirroredStrategy, which every worker runs together
    stop.late = f"the last step ({step}) is committed ({path}), but the export did not end"
    if (pending := stops.pending_stop()) is not None:
        by = pending.what.split(" ", 1)[0]
        raise stopped(signal_number(by), pending.what)
    if not stops.multi:
        if stop.requested:
            raise stopped(stop.signum)
        stop.interrupt = stopped


def summarize(plan: Plan, ctx: TFContext, model: Any, history: dict[str, list[float]], progress: Any,
              steps: list[int], reporter: MetricReporter, seconds: float) -> TrainingSummary:
    """The run in the shared training-summary schema; ``history``: the job's per-epoch metrics (the checkpoints
    carry them, so a resumed run's, or a rerun's that trained nothing, are the whole job's)."""
    per_epoch = {k: list(v) for k, v in history.items()}
    final = {k[len("val_"):]: v[-1] for k, v in per_epoch.items() if k.startswith("val_") and v}
    final_step = int(model.optimizer.iterations.numpy())
    backend = {"MultiWorkerMirroredStrategy": "nccl" if plan.gpus_per_node else "ring",
               "ParameterServerStrategy": "parameter_servers", "MirroredStrategy": "nccl"}.get(plan.strategy, "local")
    return TrainingSummary(
        framework="tensorflow", strategy=plan.strategy, backend=backend,
        device="gpu" if plan.gpus_per_node else "cpu", world_size=ctx.world_size,
        replicas_in_sync=ctx.num_replicas_in_sync, global_batch_size=ctx.global_batch_size, epochs=ctx.epochs,
        start_epoch=progress.first_epoch if progress.first_epoch is not None else ctx.epochs,
        start_step=progress.start_step, final_step=final_step, expected_steps=progress.expected_steps,
        steps_per_replica=steps,
        metrics=final, history=per_epoch, seconds=round(seconds, 3),
        samples_per_second=round((final_step - progress.start_step) * ctx.global_batch_size / max(seconds, 1e-9), 1),
        checkpoint_blocked_seconds=0.0, checkpoint_write_seconds=0.0, trial=ctx.trial,
        hypertune_file=reporter.path, load_with=LOAD_WITH, ranks=list(range(ctx.world_size)),
        details={"reason": plan.reason}, image=plan.image.to_dict(),
    )
