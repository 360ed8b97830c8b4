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
from entrypoint.lifecycle import lost_work, recorder
from entrypoint.lifecycle.listening import ServerWatch
from entrypoint.lifecycle.recorder import Recorder
from entrypoint.lifecycle.signals import StopRequest
from entrypoint.lifecycle.watchdog import HangWatchdog
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
from entrypoint.tensorflow.strategy import is_multi_worker, is_parameter_server, make_strategy

log = logging.getLogger("entrypoint.tensorflow")
LOAD_WITH = "tf_keras.models.load_model('<model_dir>')  # a SavedModel"
SAVED_MODEL = "saved_model.pb"  # a SavedModel's graph: uploaded last, so finding it means the export is whole


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
           staging: Staging) -> tuple[int, lost_work.ResumePoint | None, dict[str, list[float]]]:
    """Load the job's newest committed checkpoint that loads (``--resume-from`` while it has none of its own, as
    ``load_newest`` decides): the epoch to start from (0: none), where that checkpoint was (its step, when it was
    reached, the recoveries so far) and the job's per-epoch metrics up to it (a rerun at the final checkpoint
    trains nothing, and its summary keeps them). What the resume cost is known only once BackupAndRestore has
    restored its own, possibly newer, state (``CommitCheckpoints``).
    A checkpoint on a store (gs:// without the mount) is verified there and loaded from a downloaded copy."""
    found = load_newest(staging.target("checkpoints"), plan.options.resume_from,
                        lambda path: writer.load(path, model), writer.retention)
    if found is None:
        return 0, None, {}
    path, epoch = found
    marker = read_marker(path)
    step = int(marker.get("step", 0))
    log.info("resumed from %s at step %d (epoch %d)", path, step, epoch)
    reached = marker.get("reached_at")
    history = {str(k): [float(x) for x in v] for k, v in (marker.get("history") or {}).items()}
    return epoch, lost_work.ResumePoint(step, float(reached) if reached is not None else None,
                              list(marker.get("recoveries") or [])), history


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
                   request: StopRequest | None, watchdog: HangWatchdog, writer: KerasCheckpointIO,
                   resumed: lost_work.ResumePoint | None, history: dict[str, list[float]],
                   staging: Staging, record: Recorder | None = None) -> tuple[list[Any], Any, Any]:
    """Backup, restore and save-before-preemption first (it restores before the others look), then ours."""
    import tensorflow as tf

    from entrypoint.tensorflow.callbacks import (
        CommitCheckpoints,
        FailOnNonFiniteLoss,
        ProgressAndSteps,
        PublishTensorBoard,
        ReportTuningMetric,
        quiet_hook_timing,
    )
    from entrypoint.tensorflow.preemption import BACKUP_DIR, NameAdvanceNotice, SaveBeforePreemption

    options, ckpt = plan.options, Path(ctx.checkpoint_dir)
    quiet_hook_timing()  # every callback of fit is ours: tf-keras' "is slow" warning would time the batch itself
    progress = ProgressAndSteps(ctx.epochs, ctx.global_batch_size, ctx.num_replicas_in_sync, options.log_every,
                                ctx.is_chief, watchdog, record)
    commit = CommitCheckpoints(writer, plan.strategy, resumed, plan.outputs.job_dir, history)
    commit.record = progress.record
    callbacks: list[Any] = [
        FailOnNonFiniteLoss(),
        SaveBeforePreemption(str(ckpt / BACKUP_DIR), options.checkpoint_every or "epoch", request, commit, staging),
        progress,
        commit,
        NameAdvanceNotice(plan.topology.replica_name),
    ]
    if ctx.is_chief:
        board = tf.keras.callbacks.TensorBoard(ctx.tensorboard_dir, update_freq="epoch", profile_batch=0)
        callbacks.append(board)
        if staging.staged("tensorboard"):
            callbacks.append(PublishTensorBoard(staging, board))
        if metric:
            callbacks.append(ReportTuningMetric(reporter, metric))
    return callbacks, progress, commit


def train(plan: Plan, module: ModuleType, failure_context: failures.FailureContext) -> int:
    """Train with the module's hooks under the plan's strategy; the chief exports and announces the end."""
    import tensorflow as tf

    from entrypoint.tensorflow.preemption import stop_signals

    options = plan.options
    args = parse_user_args(module, options.user_args)
    tf.keras.utils.set_random_seed(options.seed)  # same pipelines on every worker: DATA sharding relies on it
    strategy = make_strategy(plan, failure_context)
    # After the strategy: TensorFlow's cluster start installs its own SIGTERM handler, ours replaces it. From here the
    # start-up (building, restoring, the first step) is bounded by --startup-timeout, each later step by --hang-timeout.
    watchdog = HangWatchdog(options.hang_timeout, failure_context, options.startup_timeout)
    watchdog.phase = "starting the training loop"
    watchdog.start()
    # ParameterServerStrategy: the chief watches its servers; a lost one is why training failed (retryable).
    servers = plan.topology.training_peers(include_servers=True)[1:] if is_parameter_server(strategy) else ()
    # The chief's job ledger (docs/goodput.md): phases, steps, saves and the restore.
    record = recorder.for_training(plan.outputs.job_dir, plan.topology.replica_name, 0, plan.topology.is_chief_node)
    try:
        with Staging(plan.outputs) as staging, stop_signals(strategy) as request, ServerWatch(servers) as watch:
            try:
                code = _train(plan, module, args, strategy, request, watchdog, staging, record)
                record.close("finished")
                return code
            except BaseException as exc:
                record.close("stopped" if isinstance(exc, StopRequested) else "failed")
                if isinstance(exc, Exception):
                    watch.blame(exc)
                raise
    finally:
        watchdog.stop()


def _train(plan: Plan, module: ModuleType, args: argparse.Namespace, strategy: Any, request: StopRequest | None,
           watchdog: HangWatchdog, staging: Staging, record: Recorder) -> int:
    from entrypoint.tensorflow.preemption import BACKUP_DIR, restore_backup

    started, options, out = time.time(), plan.options, plan.outputs
    record.enter("preparation")
    watchdog.phase = "preparing the training context"
    ctx = make_context(plan, module, strategy, staging)
    if staging.any_staged:
        log.info("TensorFlow writes the gs:// outputs to %s; the chief uploads each commit, the export and "
                 "TensorBoard's events from there", staging.root)
    if ctx.is_chief:
        watchdog.phase = "checking the output directories"
        ensure_writable([out.model_dir, out.checkpoint_dir, out.tensorboard_dir])
        clear_done(staging.target("checkpoints"))
    watchdog.phase = "building the model (build_model)"
    model = build_compiled_model(module, args, ctx)
    watchdog.phase = "building the datasets (build_datasets)"
    inputs = fit_inputs(module, args, ctx)
    writer = KerasCheckpointIO(Path(ctx.checkpoint_dir), ctx.is_chief, Retention(options.keep_checkpoints), staging)
    watchdog.phase = "restoring the newest checkpoint"
    with record.phase("restore"):
        initial_epoch, resumed, history = resume(model, plan, writer, staging)
        restore_backup(Path(ctx.checkpoint_dir) / BACKUP_DIR, staging)  # BackupAndRestore reads the chief's copy
    record.enter("preparation")
    metric = options.hypertune_metric or getattr(module, "HYPERTUNE_METRIC", None)
    reporter = MetricReporter(ctx.is_chief, ctx.trial, asked=options.hypertune_metric is not None)
    callbacks, progress, commit = make_callbacks(plan, ctx, reporter, metric, request, watchdog, writer, resumed,
                                                 history, staging, record)
    log.info("training %d epoch(s), global batch %d (%d per replica x %d)", ctx.epochs, ctx.global_batch_size,
             ctx.per_replica_batch_size, ctx.num_replicas_in_sync)
    watchdog.phase = "starting Keras' fit (its callbacks restore the backup)"
    model.fit(**inputs, epochs=ctx.epochs, initial_epoch=initial_epoch, callbacks=callbacks, verbose=0)
    steps = gather_steps(strategy, progress.batches)
    record.enter("export")
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
        summary.goodput = goodput.so_far(out.job_dir)
        write_summary(staging.target("model"), summary)
        announce_done(staging.target("checkpoints"))
        log.info("exported the model to %s", staging.target("model"))
    return ExitCode.OK


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
