"""The hooks loop's steps: each a ``train_on_batch`` of this process's share, then the agreed stop, the
checkpoint schedule, progress and the hang watchdog; each epoch ends with its evaluation, metrics and commit.

The stop protocol is the other loops': a SIGTERM (or SIGINT) sets this process's ``StopRequest``; after every step
each process says whether it got one (an all-gather of one integer across the processes: the same step for all,
as every step is one collective computation), and when any did, every process commits that step (the chief
writes) and raises ``StopRequested`` (exit 128 + N). A stop in another phase (building the model, compiling the first
step, evaluating, exporting) takes effect at the next step boundary, or ends the process as it would without us
once no step follows (the export).
"""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from entrypoint.errors import NonFiniteLoss, StopRequested
from entrypoint.jax.checkpoint_io import JaxCheckpointIO
from entrypoint.jax.hooks import Arrays, Batches, JaxContext
from entrypoint.lifecycle.recorder import Recorder
from entrypoint.lifecycle.signals import StopRequest
from entrypoint.lifecycle.watchdog import HangWatchdog
from entrypoint.outputs.checkpoints import checkpoint_path
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.progress import Progress
from entrypoint.outputs.storage import Location

log = logging.getLogger("entrypoint.jax")


@dataclass
class Position:
    """Where training is: epoch, batches done in it, the optimizer's step; the job's history and recoveries."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    history: dict[str, list[float]] = field(default_factory=dict)
    recoveries: list[dict[str, Any]] = field(default_factory=list)


def agreed_stop(request: StopRequest, processes: int) -> int:
    """The signal any process got (0: none), the same answer on every process (a collective when several)."""
    mine = request.signum
    if processes < 2:
        return mine
    from jax.experimental import multihost_utils

    everyone = np.asarray(multihost_utils.process_allgather(np.int32(mine)))
    return int(everyone.max())


def scalar(value: Any) -> float:
    """A logged value (a JAX array, fully replicated) as a float."""
    return float(np.asarray(value.addressable_data(0) if hasattr(value, "addressable_data") else value))


@dataclass
class Steps:
    """One process's part of the loop: its model, batches, writer and the things that watch it."""

    model: Any
    ctx: JaxContext
    batches: Batches
    evaluation: Arrays | None
    writer: JaxCheckpointIO
    target: Location
    meta: dict[str, Any]  # what every marker carries besides the position (framework, strategy)
    request: StopRequest
    watchdog: HangWatchdog
    record: Recorder
    reporter: MetricReporter
    metric: str | None
    log_every: int
    checkpoint_every: int
    board: Any = None  # the chief's tensorboardX writer
    trained: int = 0  # steps trained in this run

    def run(self, at: Position) -> Position:
        """Train from ``at`` to the last epoch; the position reached."""
        total = self.batches.per_epoch * self.ctx.epochs
        progress = Progress(total, self.ctx.global_batch_size, at.step)
        self.record.total = total
        self.watchdog.beat(at.step, "in the first training step (JAX traces and compiles it)")
        for epoch in range(at.epoch, self.ctx.epochs):
            sums: dict[str, float] = {}
            count = 0
            for index, (x, y, weight) in self.batches.epoch(epoch, at.batch if epoch == at.epoch else 0):
                self.record.step_begin()
                logs = self.model.train_on_batch(x, y, sample_weight=weight, return_dict=True)
                at.step, at.batch, at.epoch = at.step + 1, index + 1, epoch
                self.step_done(at, logs, progress)
                count += 1
                for name, value in logs.items():
                    sums[name] = sums.get(name, 0.0) + scalar(value)
            self.end_epoch(at, epoch, {name: total / count for name, total in sums.items()})
        return at

    def step_done(self, at: Position, logs: dict[str, Any], progress: Progress) -> None:
        """After a step: the loss checked, the watchdog fed, progress, then the agreed stop and the schedule."""
        self.trained += 1
        loss = scalar(logs.get("loss", 0.0))
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"the training loss was NaN or infinite at step {at.step}: nothing exported, no "
                                "metric reported; the committed checkpoints are from before it (lower the learning "
                                "rate or check the data)")
        self.record.step_end(at.step)
        self.watchdog.trained(at.step, "between steps (evaluating, checkpointing or waiting for the next batch)")
        if self.ctx.is_chief and self.trained % self.log_every == 0:
            log.info("%s", progress.line(at.epoch + 1, self.ctx.epochs, at.step, loss))
        signum = agreed_stop(self.request, self.ctx.world_size)
        if signum:
            path = self.commit(at)
            raise StopRequested(signum, f"stopped by {signal.Signals(signum).name} at step {at.step}: committed "
                                f"{path}; the restart resumes from there")
        if self.checkpoint_every and at.step % self.checkpoint_every == 0:
            self.commit(at)

    def end_epoch(self, at: Position, epoch: int, logs: dict[str, float]) -> None:
        """The epoch's evaluation, metrics (``logs``: the mean of its steps' in this run; history, TensorBoard, the
        tuning metric) and its commit."""
        metrics = dict(logs)
        if self.evaluation is not None:
            self.record.enter("evaluation")
            self.watchdog.beat(at.step, "evaluating")
            x, y, weight = self.evaluation.x, self.evaluation.y, self.evaluation.sample_weight
            scores = self.model.evaluate(x, y, sample_weight=weight, batch_size=self.ctx.global_batch_size,
                                         verbose=0, return_dict=True)
            metrics.update({f"val_{name}": scalar(value) for name, value in scores.items()})
            self.record.leave()
        for name, value in metrics.items():
            at.history.setdefault(name, []).append(value)
        if self.record.on:
            self.record.metrics = {k: v for k, v in metrics.items() if k.startswith("val_")}
        if self.board is not None:
            for name, value in metrics.items():
                self.board.add_scalar(f"epoch_{name}", value, epoch + 1)
            self.board.flush()
        if self.metric:
            if self.metric in metrics:
                self.reporter.report(self.metric, metrics[self.metric], at.step)
            else:
                log.warning("tuning metric %r is not among the epoch's metrics %s", self.metric, sorted(metrics))
        at.epoch, at.batch = epoch + 1, 0
        self.watchdog.beat(at.step, "checkpointing at the end of an epoch")
        path = self.commit(at, metrics)
        if self.ctx.is_chief:
            shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            log.info("epoch %d: %s; committed %s", epoch + 1, shown, path)

    def commit(self, at: Position, metrics: dict[str, float] | None = None) -> Location:
        """Every process saves the step; the chief commits ``ckpt-<step>`` with the position in its marker."""
        meta = {**self.meta, "epoch": at.epoch, "batch": at.batch, "step": at.step, "reached_at": time.time(),
                "recoveries": at.recoveries, "history": at.history, "metrics": metrics or {}}
        path = checkpoint_path(self.target, at.step)
        with self.record.phase("checkpoint", step=at.step):
            self.writer.save(path, self.model, meta)
        self.record.committed(at.step)
        return path
