"""Hooks mode on JAX: build under Keras' distribution, resume, train (``steps.py``), export and summarize (chief)."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import keras
import numpy as np

from entrypoint import failures
from entrypoint.errors import ExitCode
from entrypoint.jax import distributed
from entrypoint.jax.checkpoint_io import JaxCheckpointIO, assign_state, model_state
from entrypoint.jax.data import Share, share_arrays
from entrypoint.jax.guard import StopGuard
from entrypoint.jax.hooks import Batches, JaxContext, build_compiled_model, make_context, user_datasets
from entrypoint.jax.steps import Position, Steps
from entrypoint.lifecycle import lost_work
from entrypoint.outputs import goodput
from entrypoint.outputs.checkpoints import Retention, load_newest
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.locations import ensure_writable
from entrypoint.outputs.staging import Staging
from entrypoint.outputs.summary import TrainingSummary, write_summary
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import load_hooks, module_default, parse_user_args

log = logging.getLogger("entrypoint.jax")
EXPORT = "model.keras"  # Keras 3's own format: the architecture, the weights, the compile config
PARTIAL = ".partial-model.keras"  # the export being written (Keras wants the suffix), renamed to EXPORT once whole
LOAD_WITH = "keras.saving.load_model('<model_dir>/model.keras')"


def train(plan: Plan, target: str, failure_context: failures.FailureContext) -> int:
    """Join the job's processes, load the hooks, train with them; the chief exports, summarizes and reports. The
    guard (``guard.py``) holds from before JAX's distributed start to the end, so a stop in any phase is answered."""
    guard = StopGuard(plan, failure_context)
    with guard.running():
        guard.doing("joining the job's processes (jax.distributed.initialize)")
        found = distributed.start(plan, own_stops=True)
        guard.request.reinstall()  # ours again, should anything of JAX's have taken SIGTERM meanwhile
        guard.doing("loading the hooks module")
        module = load_hooks(target)
        args = parse_user_args(module, plan.options.user_args)
        keras.utils.set_random_seed(plan.options.seed)  # every process alike: Keras refuses differing initial values
        with Staging(plan.outputs) as staging:
            return _train(plan, module, args, found, guard, staging)


def _train(plan: Plan, module: ModuleType, args: argparse.Namespace, found: distributed.Devices, guard: StopGuard,
           staging: Staging) -> int:
    started, options, out, record = time.time(), plan.options, plan.outputs, guard.record
    replicas = distributed.mesh_shape(plan, found)[0] if plan.strategy != "default" else 1
    ctx = make_context(plan, module, found, replicas, staging)
    if ctx.is_chief:
        guard.doing("checking the output directories")
        ensure_writable([out.model_dir, out.checkpoint_dir, out.tensorboard_dir])
    build_layouts = getattr(module, "build_layout_map", None)
    distributed.set_distribution(plan, found, (lambda mesh: build_layouts(mesh, args, ctx))
                                 if callable(build_layouts) else None)
    share_arrays(found.process_index, found.process_count)  # evaluate() gets this process's rows too
    guard.doing("building the model (build_model)")
    model = build_compiled_model(module, args, ctx)
    guard.doing("building the datasets (build_datasets)")
    train_split, evaluation = user_datasets(module, args, ctx)
    share = Share(found.process_index, found.process_count, max(replicas, found.process_count))
    batches = Batches(train_split, ctx.global_batch_size, share, options.seed,
                      bool(module_default(module, "shuffle", True)))
    writer = JaxCheckpointIO(Path(ctx.checkpoint_dir), ctx.is_chief, Retention(options.keep_checkpoints), staging)
    guard.checkpoints = staging.target("checkpoints")
    guard.doing("restoring the newest checkpoint")
    with record.phase("restore"):
        at = resume(model, plan, writer, staging, found)
    guard.trained = at.step
    guard.committed = at.step or None  # a checkpoint is of a step after the first
    record.restored(at.step)
    record.enter("preparation")
    metric = options.hypertune_metric or getattr(module, "HYPERTUNE_METRIC", None)
    reporter = MetricReporter(ctx.is_chief, ctx.trial, asked=options.hypertune_metric is not None)
    steps = Steps(model=model, ctx=ctx, batches=batches, evaluation=evaluation, writer=writer,
                  target=staging.target("checkpoints"), meta={"framework": "jax", "strategy": plan.strategy},
                  guard=guard, reporter=reporter, metric=metric, log_every=options.log_every,
                  checkpoint_every=options.checkpoint_every, board=tensorboard(ctx) if ctx.is_chief else None)
    log.info("training %d epoch(s) of %d steps, global batch %d (%d per replica x %d)", ctx.epochs,
             batches.per_epoch, ctx.global_batch_size, ctx.per_replica_batch_size, ctx.replicas)
    start_step, start_epoch = at.step, at.epoch
    guard.doing("in the first training step (JAX traces and compiles it)")
    at = steps.run(at)
    guard.exporting()
    export(model, Path(ctx.model_dir), ctx.is_chief, plan.strategy)
    if ctx.is_chief:
        if steps.board is not None:
            steps.board.close()
        staging.publish("tensorboard")
        staging.publish("model", last=(EXPORT,))
        if metric and steps.trained == 0:  # a rerun at the final checkpoint: report its metric again
            reporter.report_final(metric, at.history, at.step)
        summary = summarize(plan, ctx, at, start_step, start_epoch, steps.trained, reporter, time.time() - started)
        summary.checkpoint_blocked_seconds = round(writer.blocked_seconds, 3)
        summary.checkpoint_write_seconds = round(writer.write_seconds, 3)
        record.flush()
        summary.goodput = goodput.so_far(out.job_dir)
        write_summary(staging.target("model"), summary)
        log.info("exported the model to %s", staging.target("model"))
    return ExitCode.OK


def tensorboard(ctx: JaxContext) -> Any:
    """The chief's TensorBoard event writer (tensorboardX: Keras 3's own callback needs TensorFlow)."""
    from tensorboardX import SummaryWriter

    return SummaryWriter(ctx.tensorboard_dir)


def resume(model: Any, plan: Plan, writer: JaxCheckpointIO, staging: Staging, found: distributed.Devices) -> Position:
    """The chief loads the job's newest committed checkpoint that loads (``--resume-from`` while the job has none
    of its own; a corrupt one is skipped, ``load_newest``) and hands its state and position to every process."""
    loaded: dict[str, Any] = {}
    if writer.is_chief:
        load_newest(staging.target("checkpoints"), plan.options.resume_from,
                    lambda path: writer.load(path, loaded), writer.retention)
    marker = loaded.get("marker", {})
    head = np.array([1 if loaded else 0, int(marker.get("epoch", 0)), int(marker.get("batch", 0)),
                     int(marker.get("step", 0))], dtype=np.int64)
    if found.process_count > 1:
        from jax.experimental import multihost_utils

        head = np.asarray(multihost_utils.broadcast_one_to_all(head))
        if head[0]:
            state = loaded.get("state") or model_state(model)  # the others' own values give the shapes
            loaded["state"] = multihost_utils.broadcast_one_to_all(state)
    if not head[0]:
        return Position()
    assign_state(model, loaded["state"])
    at = Position(epoch=int(head[1]), batch=int(head[2]), step=int(head[3]),
                  history={str(k): [float(x) for x in v] for k, v in (marker.get("history") or {}).items()},
                  recoveries=list(marker.get("recoveries") or []),
                  sums={str(k): float(v) for k, v in (marker.get("epoch_sums") or {}).items()},
                  count=int(marker.get("epoch_count", 0)))
    log.info("resumed at step %d (epoch %d, batch %d)", at.step, at.epoch, at.batch)
    if writer.is_chief:
        reached = marker.get("reached_at")
        lost = lost_work.after_resume(plan.outputs.job_dir, at.step, float(reached) if reached is not None else None)
        if lost is not None:
            log.info("%s", lost.line())
            at.recoveries.append(lost.to_dict())
    return at


def export(model: Any, model_dir: Path, is_chief: bool, strategy: str) -> None:
    """``model.keras`` by the chief. Every process saves (Keras makes variables while it saves, and under a
    distribution across processes making one is a collective): the others into a scratch directory removed at
    once. A model sharded across processes is gathered to host arrays first and saved as an unsharded copy. The file
    is written under a partial name and renamed: a stop in the export leaves no torn ``model.keras``."""
    weights = None
    if strategy == "model_parallel":
        from entrypoint.jax.checkpoint_io import host_copy

        weights = [host_copy(v.value) for v in model.weights]  # a collective where a variable is sharded
    scratch = None if is_chief else Path(tempfile.mkdtemp(prefix="jax-nonchief-export-"))
    target = model_dir if scratch is None else scratch
    try:
        target.mkdir(parents=True, exist_ok=True)
        partial = target / PARTIAL
        if weights is None:
            model.save(partial)
        else:
            with keras.distribution.DataParallel(devices=[keras.distribution.list_devices()[0]]).scope():
                copy = keras.models.clone_model(model)
                copy.set_weights(weights)
            copy.save(partial)
        os.replace(partial, target / EXPORT)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def summarize(plan: Plan, ctx: JaxContext, at: Position, start_step: int, start_epoch: int, trained: int,
              reporter: MetricReporter, seconds: float) -> TrainingSummary:
    """The run in the shared training-summary schema."""
    final = {k[len("val_"):]: v[-1] for k, v in at.history.items() if k.startswith("val_") and v}
    gpus = plan.gpus_per_node
    return TrainingSummary(
        framework="jax", strategy=plan.strategy, backend="nccl" if gpus else ("gloo" if ctx.world_size > 1 else
                                                                            "local"),
        device="gpu" if gpus else "cpu", world_size=ctx.world_size, replicas_in_sync=ctx.replicas,
        global_batch_size=ctx.global_batch_size, epochs=ctx.epochs, start_epoch=start_epoch, start_step=start_step,
        final_step=at.step, expected_steps=None, steps_per_replica=[trained] * ctx.world_size, metrics=final,
        history=at.history, seconds=round(seconds, 3),
        samples_per_second=round(trained * ctx.global_batch_size / max(seconds, 1e-9), 1),
        checkpoint_blocked_seconds=0.0, checkpoint_write_seconds=0.0, trial=ctx.trial, hypertune_file=reporter.path,
        load_with=LOAD_WITH, ranks=list(range(ctx.world_size)), recoveries=at.recoveries, image=plan.image.to_dict(),
        details={"reason": plan.reason, "devices": len(ctx.devices.devices)})
