"""The hooks loop's steps: each batch read (a stop does not wait for a slow one), the agreement, then a
``train_on_batch`` of this process's share, its checks, progress and checkpoint schedule; each epoch ends with its
evaluation (the agreement between its batches) and its commit.

**The agreement** (``guard.vote``) comes after each batch read and before the step it feeds: there every process has
trained the same steps (each step is one computation across the processes, and none starts the next before the
vote), so a stop that any process got, in any phase, stops every process at the same step, and every process takes
part in its commit (the chief writes ``ckpt-<step>``, then says it is committed), then raises ``StopRequested`` (exit
128 + N) saying what is committed. A read interrupted by a stop (``guard.reading``) goes straight to the vote. The
platform's advance notice rides the same vote: that step is committed at once, and training goes on. Between two
evaluation batches every process votes again (a Keras callback): a stop abandons the evaluation at the same batch
everywhere and commits the epoch's trained step (the restart evaluates that epoch again); a notice commits it and the
evaluation goes on. A step already committed (a stop during a save, agreed on right after it) is not saved again.

Each checkpoint's marker holds the position (epoch, batches done in it, step) and the epoch's training metrics summed
so far, so a resume mid-epoch, or in the evaluation, ends the epoch with the same means as an uninterrupted run.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import keras
import numpy as np

from entrypoint.errors import Interrupted, NonFiniteLoss, StopRequested
from entrypoint.jax.checkpoint_io import JaxCheckpointIO
from entrypoint.jax.guard import WAITING, StopGuard, Verdict
from entrypoint.jax.hooks import Arrays, Batches, JaxContext
from entrypoint.outputs.checkpoints import checkpoint_path
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.progress import Progress
from entrypoint.outputs.storage import Location

log = logging.getLogger("entrypoint.jax")


@dataclass
class Position:
    """Where training is: epoch, batches done in it, the optimizer's step, the epoch's training metrics summed over
    its steps so far; the job's history and recoveries."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    history: dict[str, list[float]] = field(default_factory=dict)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    sums: dict[str, float] = field(default_factory=dict)
    count: int = 0

    def marker(self) -> dict[str, Any]:
        """What a checkpoint's marker holds of the position."""
        return {"epoch": self.epoch, "batch": self.batch, "step": self.step, "recoveries": self.recoveries,
                "history": self.history, "epoch_sums": self.sums, "epoch_count": self.count}


def scalar(value: Any) -> float:
    """A logged value (a JAX array, fully replicated) as a float."""
    return float(np.asarray(value.addressable_data(0) if hasattr(value, "addressable_data") else value))


@dataclass
class Steps:
    """One process's part of the loop: its model, batches, writer and the guard that watches it."""

    model: Any
    ctx: JaxContext
    batches: Batches
    evaluation: Arrays | None
    writer: JaxCheckpointIO
    target: Location
    meta: dict[str, Any]  # what every marker carries besides the position (framework, strategy)
    guard: StopGuard
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
        self.guard.record.total = total
        self.guard.watchdog.beat(at.step, "in the first training step (JAX traces and compiles it)")
        for epoch in range(at.epoch, self.ctx.epochs):
            start = at.batch if epoch == at.epoch else 0
            if start == 0:
                at.sums, at.count = {}, 0
            batches = self.batches.epoch(epoch, start)
            while (batch := self.next_batch(batches, at)) is not None:
                index, (x, y, weight) = batch
                self.guard.record.step_begin()
                logs = self.model.train_on_batch(x, y, sample_weight=weight, return_dict=True)
                if not self.trained:
                    self.guard.first_step_done()
                at.step, at.batch, at.epoch = at.step + 1, index + 1, epoch
                self.step_done(at, logs, progress)
            self.end_epoch(at, epoch)
        return at

    def next_batch(self, batches: Iterator[Any], at: Position) -> Any:
        """This process's next batch (None: the epoch's end), then the agreement on the step before it (from the
        attempt's second step on: before, the start-up is a region a stop ends at once)."""
        interrupted = False
        try:
            with self.guard.reading():
                batch = next(batches, None)
        except Interrupted as exc:  # a stop during a slow read: every process meets at the vote
            if exc.what != WAITING:
                raise  # the start-up's: nothing trained in this attempt, the process ends at once
            batch, interrupted = None, True
        if self.trained:
            self.act(at, self.guard.vote(), WAITING if interrupted else "")
        if interrupted:  # the vote carried this process's own signal: act stopped every process
            raise AssertionError("a stop during a batch read was not agreed on")
        return batch

    def step_done(self, at: Position, logs: dict[str, Any], progress: Progress) -> None:
        """After a step: the loss checked, the watchdog fed, progress, the epoch's sums and the schedule."""
        self.trained += 1
        self.guard.trained = at.step
        loss = scalar(logs.get("loss", 0.0))
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"the training loss was NaN or infinite at step {at.step}: nothing exported, no "
                                "metric reported; the committed checkpoints are from before it (lower the learning "
                                "rate or check the data)")
        self.guard.record.step_end(at.step)
        self.guard.watchdog.trained(at.step, WAITING)
        if self.ctx.is_chief and self.trained % self.log_every == 0:
            log.info("%s", progress.line(at.epoch + 1, self.ctx.epochs, at.step, loss))
        at.count += 1
        for name, value in logs.items():
            at.sums[name] = at.sums.get(name, 0.0) + scalar(value)
        if self.checkpoint_every and at.step % self.checkpoint_every == 0:
            self.guard.doing("checkpointing (--checkpoint-every)")
            self.commit(at)
            self.guard.watchdog.beat(at.step, WAITING)

    def end_epoch(self, at: Position, epoch: int) -> None:
        """The epoch's evaluation, metrics (the mean of its steps'; history, TensorBoard, the tuning metric) and its
        commit."""
        metrics = {name: total / at.count for name, total in at.sums.items()} if at.count else {}
        if self.evaluation is not None:
            self.guard.record.enter("evaluation")
            metrics.update(self.evaluate(at, epoch))
            self.guard.record.leave()
        for name, value in metrics.items():
            at.history.setdefault(name, []).append(value)
        if self.guard.record.on:
            self.guard.record.metrics = {k: v for k, v in metrics.items() if k.startswith("val_")}
        if self.board is not None:
            for name, value in metrics.items():
                self.board.add_scalar(f"epoch_{name}", value, epoch + 1)
            self.board.flush()
        if self.metric:
            if self.metric in metrics:
                self.reporter.report(self.metric, metrics[self.metric], at.step)
            else:
                log.warning("tuning metric %r is not among the epoch's metrics %s", self.metric, sorted(metrics))
        at.epoch, at.batch, at.sums, at.count = epoch + 1, 0, {}, 0
        self.guard.watchdog.beat(at.step, "checkpointing at the end of an epoch")
        path = self.commit(at, metrics)
        if self.ctx.is_chief:
            shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            log.info("epoch %d: %s; committed %s", epoch + 1, shown, path)

    def evaluate(self, at: Position, epoch: int) -> dict[str, float]:
        """The evaluation split's metrics (``val_``), the agreement between its batches (``Votes``)."""
        assert self.evaluation is not None
        data, size = self.evaluation, self.ctx.global_batch_size
        votes = Votes(self, at, epoch, -(-data.size // size))
        self.guard.watchdog.beat(at.step, "evaluating")
        scores = self.model.evaluate(data.x, data.y, sample_weight=data.sample_weight, batch_size=size, verbose=0,
                                     return_dict=True, callbacks=[votes])
        return {f"val_{name}": scalar(value) for name, value in scores.items()}

    # ---- the agreement's outcomes --------------------------------------------------------------------------
    def act(self, at: Position, verdict: Verdict, where: str = "") -> None:
        """What every process agreed on: stop at ``at`` (``where``: the phase it was agreed in), or commit it on the
        platform's notice and go on."""
        if verdict.signum:
            self.stop(at, verdict.signum, where)
        if verdict.notices:
            if self.guard.committed != at.step:  # else this very step is committed already
                self.guard.doing("checkpointing on the platform's advance notice")
                self.commit(at)
            if self.ctx.is_chief:
                log.info("%s", self.guard.notice_words(verdict, at.step))

    def stop(self, at: Position, signum: int, where: str) -> NoReturn:
        """Every process stops at ``at.step``: commit it (not again when it is), hear from the chief that it is
        committed, end 128 + ``signum`` saying so."""
        name = signal.Signals(signum).name
        self.guard.doing(f"saving before stopping ({where or 'between steps'})")
        path = checkpoint_path(self.target, at.step)
        if self.guard.committed != at.step:
            self.commit(at)
        said = f"stopped by {name} at step {at.step}" + (f" while {where}" if where else "")
        if not self.guard.agree(True):
            words, kept = self.guard.holding()
            raise StopRequested(signum, f"{said}: {words}", kept)
        if self.ctx.is_chief:
            log.info("%s: checkpoint %s committed", said, path)
        raise StopRequested(signum, f"{said}: checkpoint {path} committed; the restart resumes from it")

    def commit(self, at: Position, metrics: dict[str, float] | None = None) -> Location:
        """Every process saves the step; the chief commits ``ckpt-<step>`` with the position in its marker."""
        meta = {**self.meta, **at.marker(), "reached_at": time.time(), "metrics": metrics or {}}
        path = checkpoint_path(self.target, at.step)
        with self.guard.record.phase("checkpoint", step=at.step):
            self.writer.save(path, self.model, meta)
        self.guard.record.committed(at.step)
        self.guard.committed = at.step
        return path


class Votes(keras.callbacks.Callback):
    """Between two evaluation batches: a beat, and the agreement, which every process reads at the same batch (each
    evaluates its share of the same global batches). Keras holds the model's variables apart while it evaluates:
    they are put back before a commit."""

    def __init__(self, steps: Steps, at: Position, epoch: int, batches: int) -> None:
        super().__init__()
        self.steps, self.at, self.epoch, self.batches = steps, at, epoch, batches

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        steps, done = self.steps, batch + 1
        steps.guard.watchdog.beat(self.at.step, f"evaluating (batch {done} of {self.batches})")
        if not steps.trained:  # a resumed attempt evaluating before its first step: the start-up's region
            return
        verdict = steps.guard.vote()
        if verdict.signum or verdict.notices:
            self.model.jax_state_sync()
        where = f"evaluating epoch {self.epoch + 1} (abandoned after {done} of its {self.batches} batches; the " \
                "restart evaluates it again)"
        steps.act(self.at, verdict, where)
        steps.guard.watchdog.beat(self.at.step, f"evaluating (batch {done} of {self.batches})")
