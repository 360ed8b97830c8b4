"""What keeps a step safe, built with the parallel layout: the vote, non-finite steps, saves and stops, recovery.

The hooks loop's guard comes in two parts. What exists from the first hook (stop signals and the regions a stop ends
at once, the hang watchdog and the stop's deadline, the advance notice, the ledger's phases, the group and naming a
lost peer) is ``RunGuard`` (``guard.py``). ``StepGuard`` comes with the layout, given its facts (its checkpoint
format, whether its evaluation runs in lockstep, whether survivors may keep training after a lost peer), and the
loop calls it at a handful of points:

- ``start(state, fresh)``: join the group and resume from the newest checkpoint (``fresh`` when there is none), or, as
  a replacement, from a live replica's state (``healing.py``).
- ``batches(batches, state)``: the epoch's batches, each the start of a step; a wait for one does not hold a stop
  (``stops.py`` commits the last trained step).
- ``agree_finite(state, loss)``: ``--on-nonfinite skip`` (every rank agrees the loss is finite before the update,
  or drops it); ``fail`` leaves it to the vote.
- ``after_step(state, loss, save)``: the watchdog's beats, a failed background checkpoint write, and the per-step
  vote (``vote.py``): every rank learns at the same step that a signal arrived anywhere (the chief commits that step,
  every rank exits 128 + N), that a loss was not finite, or that the platform gave a node an advance notice
  (``notices.py``: that step is committed at once, training goes on); then the scheduled checkpoint (``save``). The
  vote in flight is finished before anything is saved, evaluated or exported, so no checkpoint holds the state of a
  step whose loss was not finite; a stop that came during a save is agreed on right after it (the save in flight is
  finished and committed, then every rank stops).
- ``evaluating(state)`` and ``epoch_done(state)``: the vote between evaluation batches (every rank abandons it at the
  same batch on a stop: the trained step is committed, the restart evaluates again; or commits at once on a
  notice; each batch beats), then the epoch's checkpoint.
- ``attempts(state)``: the training runs once; with survivors-keep-training on (``survivors.py``) and a layout whose
  lost ranks' state lives on (a replicated model, HSDP by node, FSDP's snapshots in peer memory), a lost peer re-forms
  the group with its replacement (HSDP: over the live nodes at once, taking the returning node in at the step boundary
  the vote agrees on) and the training runs again from the healed position; a stop while the survivors wait commits
  the last trained step (``stops.py``). A failure ends the checkpoint write in flight before its last line.
- ``finishing(state)``: every write committed, the writer closed; the export is a region a stop ends at once.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import torch

from entrypoint import failures
from entrypoint.errors import Interrupted, NonFiniteLoss, StopRequested
from entrypoint.outputs import checkpoints
from entrypoint.pytorch.checkpoints.resume import LoopCheckpoints
from entrypoint.pytorch.recovery.guard import RunGuard
from entrypoint.pytorch.recovery.healing import Healing
from entrypoint.pytorch.recovery.host_copy import HostCopy
from entrypoint.pytorch.recovery.stops import OffStep
from entrypoint.pytorch.recovery.survivors import InPlace, Rejoin
from entrypoint.pytorch.recovery.vote import StepVerdict, StepVote, nonfinite
from entrypoint.pytorch.state import TrainState

log = logging.getLogger("entrypoint.pytorch")
MAX_RECOVERIES_AT_ONE_STEP = 2  # more, at the same step, is a failure that repeats (not a peer that was lost)
WAITING = "waiting for the next batch"
EVALUATING = "evaluating"
_END = object()


def patience(grace: float) -> float:
    """How long a wait for a batch may hold a stop before it is interrupted: one that ends in a moment leaves the
    stop to the step vote (every rank agrees on the step); a slow read does not hold it."""
    return min(1.0, grace / 10)


class StepGuard:
    """The vote, non-finite steps, saves and stops, and in-place recovery around the hooks loop's steps."""

    def __init__(self, guard: RunGuard, saver: LoopCheckpoints, lockstep: bool, survives_lost_peer: bool,
                 replica_size: int = 1) -> None:
        self.guard, self.saver = guard, saver
        self.plan, self.comm, self.ctx = guard.plan, guard.comm, guard.ctx
        self.record, self.watchdog, self.notice, self.request = guard.record, guard.watchdog, guard.notice, \
            guard.request
        self.survivors: InPlace | None = guard.survivors if survives_lost_peer else None
        if self.survivors is not None:
            self.survivors.replica_size = replica_size  # a healed rank takes rank r % replica_size's state
        if guard.survivors is not None and not survives_lost_peer:
            log.info("survivors keep training is off for a model sharded over every rank (FSDP) with "
                     "--peer-snapshots off: a lost peer restarts the job from its newest sharded checkpoint")
        self.skips_nonfinite = self.plan.options.on_nonfinite == "skip"
        self._rejoin = False  # the vote said a lost node's replacement is there: take it in at the next boundary
        if self.survivors is not None and replica_size > 1:  # HSDP by node: train on with fewer replicas meanwhile
            self.survivors.train_on(replica_size, lambda: guard.board)
        self.vote = self._new_vote()
        # A stop the step vote cannot agree on (``stops.py``): ranks that each write their shards meet first.
        self.off_step = OffStep(self, together=saver.format.collective and self.ctx.world_size > 1)
        self.patience = patience(self.plan.options.grace_period)
        # A replicated model's evaluation has no collective but the vote: a stop does not wait for a slow batch.
        self.evaluation_patience = None if lockstep else self.patience
        self._recoveries_at: list[int] = []  # the step of each in-place recovery
        self._step_started = time.monotonic()
        self._noticed_at: tuple[int, int] | None = None  # (step, epoch) of the last checkpoint a notice asked for

    # ---- the start ---------------------------------------------------------------------------
    def start(self, state: TrainState, fresh: Callable[[TrainState], None]) -> Healing | None:
        """Join the group; resume from the newest checkpoint (``fresh(state)`` when there is none), and let
        replacements join from now on; or, as a replacement, take a live replica's state (how: ``Healing``)."""
        joined = self.guard.join(state)
        if joined is None:  # the group's first generation: every member starts here, from the newest checkpoint
            self.guard.starting("resuming from the newest checkpoint")
            with self.record.phase("restore"):
                resumed = self.saver.resume(state)
            if not resumed:
                fresh(state)
            self.guard.restored(state.step)
            if self.survivors is not None:
                self.survivors.started()
        self.guard.beat(state.step)
        return joined

    # ---- a step ------------------------------------------------------------------------------
    def batches(self, batches: Iterator[Any], state: TrainState) -> Iterator[Any]:
        """The epoch's batches, each the start of a step (the first one is part of the start-up: first imports,
        compilation). A stop does not wait for one that is slow to come (more than ``patience``): this rank commits
        the last trained step, which every rank voted on, as its layout allows (``stops.py``)."""
        request = self.request
        while True:
            try:
                request.enter(WAITING, self.patience)  # the start-up (if it was still on) ends here
                batch = next(batches, _END)
                request.enter(None)
            except Interrupted:
                self.off_step.stop(state, WAITING)
            if batch is _END:
                return
            self.watchdog.phase = "in the first training step (first imports, compilation)" \
                if self.watchdog.starting_up else "in a training step"
            self._step_started = time.monotonic()
            self.record.step_begin()
            yield batch

    def agree_finite(self, state: TrainState, loss: torch.Tensor) -> bool:
        """Whether to apply the step's update. ``--on-nonfinite fail`` lets it through unchecked (the step vote
        checks the loss after the step, without a collective of its own); ``skip`` has every rank agree the loss is
        finite first (one small synchronous all-reduce), and drops the step's update everywhere when it is not."""
        if not self.skips_nonfinite:
            return True
        bad = int(self.comm.all_reduce_sum(nonfinite(loss)).item())
        if not bad:
            return True
        self.comm.discard_step(state.optimizer)
        state.skipped.append(state.step + 1)
        if self.ctx.is_chief:
            log.warning("step %d: the loss is NaN or infinite on %d of %d ranks: update skipped (--on-nonfinite "
                        "skip; %d skipped so far)", state.step + 1, bad, self.ctx.world_size, len(state.skipped))
        return False

    def after_step(self, state: TrainState, loss: torch.Tensor, save: bool) -> None:
        """A step ended: beat, vote (on ``loss`` unless every rank agreed on it before the update), stop or fail as
        agreed; then commit it if ``save`` (the checkpoint schedule). The first one ends the start-up:
        ``--hang-timeout`` holds from here on."""
        self.record.step_end(state.step)
        self.watchdog.trained(state.step, WAITING)
        self.saver.io.check()
        self._act(state, self.vote.poll(state.step, None if self.skips_nonfinite else loss, self.notice.for_vote()))
        self.notice.after_step(state.saved_step, self.saver.io.write_seconds)
        if save:
            self.checkpoint(state)
        self._take_in(state)

    @contextlib.contextmanager
    def evaluating(self, state: TrainState) -> Iterator[Evaluation]:
        """Around the epoch's evaluation (the ledger's ``evaluation``), once the vote in flight is settled: what it
        calls between its batches (``evaluation.py``). A stop in it commits the epoch's training; the restart
        evaluates again."""
        self.settle(state)
        self.guard.doing("evaluating")
        with self.record.phase("evaluation"):
            yield Evaluation(self, state)

    def epoch_done(self, state: TrainState) -> None:
        """The epoch ended (its metrics are ``state.metrics``): commit it, and go on."""
        self.record.metrics = dict(state.metrics)
        self.checkpoint(state)
        self.guard.beat(state.step)
        self._take_in(state)

    def settle(self, state: TrainState) -> None:
        """Finish the vote in flight (before saving, evaluating or exporting); stop or fail as it says."""
        self._act(state, self.vote.drain())

    def checkpoint(self, state: TrainState) -> None:
        """Commit ``state`` (chief) once the vote in flight is settled; a stop that came meanwhile is agreed on right
        after the save (every rank is here, at this step): that save is finished, committed, and every rank stops."""
        self.settle(state)
        host = self.survivors.snapshot(state) if self.survivors is not None else None  # FSDP's, in peer memory
        if self._noticed_at != (state.step, state.epoch):  # else an advance notice committed this very state
            self.watchdog.phase = "checkpointing"
            self._save(state, host=host)
            self.notice.saved(state.step)
        flag = torch.tensor([int(self.request.requested)], dtype=torch.int64, device=self.ctx.device)
        if int(self.comm.all_reduce_sum(flag).item()):
            self.stop_agreed(state)

    def finishing(self, state: TrainState) -> None:
        """Training is complete: a stop asked for at the very end commits nothing more (the final step is);
        every write is committed and the writer's buffers released; from now on a stop ends the export at once."""
        verdict = self.vote.drain()
        if verdict is not None and verdict.nonfinite:
            self.fail_nonfinite(state, verdict)
        with self.record.phase("checkpoint"):
            self.saver.io.wait()
        self.saver.close()
        self.guard.exporting()

    def _act(self, state: TrainState, verdict: StepVerdict | None, where: str = "") -> None:
        if verdict is not None and verdict.nonfinite:
            self.fail_nonfinite(state, verdict)
        if verdict is not None and verdict.stop:
            self.stop_agreed(state, where)
        if verdict is not None and verdict.notices:
            self._save_on_notice(state, verdict)
        if verdict is not None and verdict.joining:
            self._rejoin = True

    def _save_on_notice(self, state: TrainState, verdict: StepVerdict) -> None:
        """Every rank heard of the platform's advance notice at the same step: commit this step at once (outside
        the cadence), wait for the write, and train on until the signal."""
        self.settle(state)  # this step must be finite; a stop agreed on meanwhile commits it itself
        if self._noticed_at == (state.step, state.epoch):
            return  # a notice heard on another node in the vote just settled committed it
        self.watchdog.phase = "checkpointing on the platform's advance notice"
        self._noticed_at = (state.step, state.epoch)
        self._save(state, wait=True)
        self.notice.saved(state.step)
        if self.ctx.is_chief:
            log.info("%s", self.notice.committed(verdict, state.step))

    def stop_agreed(self, state: TrainState, where: str = "") -> NoReturn:
        """Every rank agreed to stop at this step (``where``: in a phase after it): commit it (the chief; every rank
        its shards when sharded), wait for the write, and end 128 + signal, each saying what the chief committed."""
        signum = self.request.signum or signal.SIGTERM
        name = signal.Signals(signum).name
        at = f"at step {state.step}" + (f" while {where}" if where else "")
        self.watchdog.phase = "saving before stopping"
        verdict = self.vote.drain()  # the stop step itself must be finite before it is committed
        if verdict is not None and verdict.nonfinite:
            self.fail_nonfinite(state, verdict)
        if state.saved_step != state.step:
            self._save(state, wait=True)
        else:
            self.saver.io.wait()
        path = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.step)
        committed = self.comm.broadcast_object(checkpoints.is_committed(path) if self.ctx.is_chief else None)
        if not committed:
            words, kept = self.guard.holding()
            raise StopRequested(signum, f"stopped by {name} {at}: {words}", kept)
        if self.ctx.is_chief:
            log.info("stopped by %s %s: checkpoint %s committed", name, at, path)
        raise StopRequested(signum, f"stopped by {name} {at}: checkpoint {path} committed; the "
                                    "restart resumes from it")

    def _save(self, state: TrainState, wait: bool = False, host: HostCopy | None = None) -> None:
        """Save ``state`` (the chief commits; shards from ``host``, a snapshot's copy): the ledger's ``checkpoint``."""
        with self.record.phase("checkpoint", step=state.step):
            self.saver.save(state, host=host)
            if wait:
                self.saver.io.wait()
        self.record.committed(state.step)

    def fail_nonfinite(self, state: TrainState, verdict: StepVerdict) -> NoReturn:
        """Every rank saw the same non-finite step: keep what is committed (all finite), export nothing, fail."""
        self.saver.io.wait()
        newest = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.saved_step)
        kept = f"the newest committed checkpoint, {newest}, is from before it" if state.saved_step >= 0 else \
            "no checkpoint was committed"
        raise NonFiniteLoss(f"the training loss was NaN or infinite at step {verdict.step} on {verdict.nonfinite} of "
                            f"{self.ctx.world_size} ranks: nothing exported, no metric reported; {kept} "
                            "(lower the learning rate, check the data, or pass --on-nonfinite skip)")

    # ---- failures ----------------------------------------------------------------------------
    def attempts(self, state: TrainState) -> Iterator[Attempt]:
        """The training, once; again after each in-place recovery from a lost peer (survivors keep training)."""
        while True:
            attempt = Attempt(self, state)
            yield attempt
            if not attempt.recovered:
                return

    def recover(self, state: TrainState, exc: BaseException) -> bool:
        """A lost peer with survivors-keep-training on: re-form the group and go on (False: fail as usual); a returning
        node that every rank agreed to take in at this step boundary (``Rejoin``): the same, healing it. A lost
        peer while this process stops, or that stopped on a signal itself, is a stop: the last trained step is
        committed (``stops.py``), as it is when a stop comes while the survivors wait for the replacement."""
        rejoin = isinstance(exc, Rejoin)
        if not rejoin and not failures.is_peer_lost(exc):
            return False
        if not rejoin and (self.request.requested or self.guard.peer_stopped() is not None):
            self.off_step.stop(state, f"{self.watchdog.phase} (a stopping peer left the group)")
        if self.survivors is None:
            return False
        self._recoveries_at += [] if rejoin else [state.step]
        if self._recoveries_at.count(state.step) > MAX_RECOVERIES_AT_ONE_STEP:
            log.warning("lost a peer at step %d again after %d in-place recoveries there: the failure repeats, so "
                        "the job restarts from its checkpoint instead", state.step, MAX_RECOVERIES_AT_ONE_STEP)
            return False
        in_flight = 0.0 if rejoin else time.monotonic() - self._step_started
        if rejoin or self.saver.format.collective:  # a write of every rank's shards runs on the group
            with contextlib.suppress(BaseException):
                self.saver.io.wait()  # its failure is said once, in its log line; what it left is removed
        board = self.guard.board
        silent = board.silent() if board is not None and not rejoin else []
        what = "taking a returning node back into the group" if rejoin else "waiting for a lost peer's replacement"
        self.record.enter("rejoin" if rejoin else "recovery", t=self.record.last_step_end)  # to training again
        self.watchdog.phase = what if rejoin else "re-forming the group after losing a peer"
        self.vote = self._new_vote()
        try:
            with self.request.interruptible(what):
                fewer = self.survivors.recover(state, in_flight, silent, rejoin)
        except Interrupted:
            self.off_step.stop(state, what)
        if fewer is not None:  # the ledger: how many steps ran with fewer replicas
            self.record.event("fewer_replicas", step=state.step, steps=fewer, rejoined=True)
        self.watchdog.beat(state.step, WAITING)
        return True

    def _new_vote(self) -> StepVote:
        """The step vote; with fewer replicas, rank 0's says whether a lost node's replacement is there to join."""
        returning = self.survivors.returning if self.survivors is not None else lambda: False
        return StepVote(self.comm, self.request, self.ctx.device, returning)

    def _take_in(self, state: TrainState) -> None:
        """A step boundary: when the vote said a returning node is there, every rank takes it in (``recover``)."""
        if not self._rejoin:
            return
        self.settle(state)
        self._rejoin = False
        raise Rejoin(state.step)


class Evaluation:
    """Around an evaluation and between two of its batches: a beat, and the vote, which every rank reads at the same
    batch. A replicated model's evaluation needs no collective but the vote and its sums (its forward passes are its
    own), so a stop does not wait for a slow batch there (read or evaluated: after ``patience``): the chief commits the
    trained step alone (``stops.py``). A sharded model's forward passes are collectives: the vote alone decides."""

    def __init__(self, guard: StepGuard, state: TrainState) -> None:
        self.r, self.state = guard, state
        self.patience = guard.evaluation_patience

    def _enter(self) -> None:
        if self.patience is not None:
            self.r.request.enter(EVALUATING, self.patience)

    @contextlib.contextmanager
    def rounds(self) -> Iterator[None]:
        """The evaluation's rounds: a stop that interrupts one commits the last trained step."""
        try:
            self._enter()
            yield
        except Interrupted:
            self.r.off_step.stop(self.state, EVALUATING)
        finally:
            self.r.request.enter(None)

    def between(self, batch: int, batches: int) -> None:
        """Batch ``batch`` (of ``batches``, the most any rank has) is evaluated: beat, vote, stop or save as every
        rank learns at the same batch; after the last one the last vote is read too."""
        r, state = self.r, self.state
        r.request.enter(None)  # the vote is a collective: no stop interrupts it
        r.watchdog.beat(state.step, f"evaluating (batch {batch + 1} of {batches})")
        r._act(state, r.vote.poll(state.step, None, r.notice.for_vote()), "evaluating")
        if batch + 1 >= batches:
            r.settle(state)
        else:
            self._enter()


class Attempt:
    """One run of the training: a lost peer ends it recovered (in place) or re-raised once the write in flight ended,
    or on that write's own failure where the loss was its consequence (a peer left first on the same full disk)."""

    def __init__(self, guard: StepGuard, state: TrainState) -> None:
        self.guard, self.state = guard, state
        self.recovered = False

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object) -> bool:
        if exc is None:
            return False
        cause = exc
        try:
            self.recovered = self.guard.recover(self.state, exc)
        finally:
            if not self.recovered:
                with self.guard.request.uninterrupted():  # no stop interrupts the wait
                    try:
                        self.guard.saver.io.wait()
                    except BaseException as written:
                        cause = failures.first_cause(exc, written)
        if cause is not exc:
            raise cause from exc
        return self.recovered
