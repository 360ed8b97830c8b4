"""The hooks loop's fault tolerance behind one object: the loop calls it before a step, after a step, and on failure.

``Resilience`` owns what keeps a step safe, so that the training loop reads as training. What exists from the first
hook (stop signals and the regions a stop ends at once, the hang watchdog and the stop's deadline, the advance
notice, the ledger's phases, naming a lost peer) is its ``guard`` (``guard.py``); the rest comes with the layout:

- ``before_step`` / ``after_step(state, loss)``: the watchdog's phases and beats, a failed background checkpoint
  write, and the per-step vote (``vote.py``): every rank learns at the same step that a signal arrived
  anywhere (the chief commits that step, every rank exits 128 + N), that a loss was not finite, or that the
  platform gave a node an advance notice (``notices.py``: that step is committed at once, training goes on).
- ``agree_finite(state, loss)``: ``--on-nonfinite skip`` (every rank agrees the loss is finite before the update,
  or drops it); ``fail`` leaves it to the vote.
- ``checkpoint(state)`` and ``settle(state)``: the vote in flight is finished before anything is saved,
  evaluated or exported, so no checkpoint holds the state of a step whose loss was not finite; a stop that came
  during a save is agreed on right after it (the save in flight is finished and committed, then every rank stops).
- ``fetching(batches, state)``: a wait for a batch does not hold a stop (``stops.py`` commits the last trained step).
- ``evaluation(state)``: the vote between evaluation batches: every rank abandons it at the same batch on a stop
  (the trained step is committed; the restart evaluates again), or commits at once on a notice; each batch beats.
- ``attempts(state)``: the training runs once; with survivors-keep-training on (``survivors.py``), a lost peer
  re-forms the group with its replacement and the training runs again from rank 0's position; a stop while the
  survivors wait for it commits the last trained step (``stops.py``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import torch

from entrypoint import failures
from entrypoint.errors import Interrupted, NonFiniteLoss, StopRequested
from entrypoint.outputs import checkpoints
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.checkpoints.resume import LoopCheckpoints
from entrypoint.pytorch.defaults import HookContext
from entrypoint.pytorch.launch.collectives import Collectives
from entrypoint.pytorch.recovery.guard import RunGuard
from entrypoint.pytorch.recovery.stops import OffStep
from entrypoint.pytorch.recovery.survivors import Healing, InPlace
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


class Resilience:
    """Stop signals, non-finite losses, hangs, heartbeats and in-place recovery around the hooks loop's steps."""

    def __init__(self, plan: Plan, comm: Collectives, ctx: HookContext, checkpoints: LoopCheckpoints,
                 failure_context: failures.FailureContext, inplace: InPlace | None) -> None:
        self.plan, self.comm, self.ctx, self.saver = plan, comm, ctx, checkpoints
        self.guard = RunGuard(plan, comm, ctx, failure_context, lambda: self.saver.io.wait())
        self.record, self.watchdog, self.notice = self.guard.record, self.guard.watchdog, self.guard.notice
        self.request = self.guard.request
        self.failure_context, self.inplace = failure_context, inplace
        self.vote = StepVote(comm, self.request, ctx.device)
        self.in_place_allowed = True
        self.off_step = OffStep(self)  # a stop the step vote cannot agree on (``stops.py``)
        self.patience = patience(plan.options.grace_period)
        self._recoveries_at: list[int] = []  # the step of each in-place recovery
        self._step_started = time.monotonic()
        self._noticed_at: tuple[int, int] | None = None  # (step, epoch) of the last checkpoint a notice asked for

    # ---- the run (the guard's: ``guard.py``) -------------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[Resilience]:
        """The guard for the whole run (``RunGuard.running``)."""
        with self.guard.running():
            yield self

    def starting(self, what: str) -> None:
        """The loop starts ``what`` (``RunGuard.starting``)."""
        self.guard.starting(what)

    def doing(self, what: str) -> None:
        """The loop is now doing ``what`` (the clock keeps running: the step before and this share it)."""
        self.guard.doing(what)

    def beat(self, state: TrainState) -> None:
        """Training goes on at ``state``'s step (after the start-up, the step clock starts now)."""
        self.guard.beat(state.step)

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A phase of the job ledger (``evaluation``) around the loop's block."""
        return self.guard.phase(name)

    def goodput_so_far(self) -> dict[str, Any]:
        """The job's goodput so far, this attempt's steps included (the training summary's ``goodput``)."""
        return self.guard.goodput_so_far()

    def restored(self, step: int) -> None:
        """The training goes on after ``step`` (what the newest checkpoint held; 0 for a fresh start)."""
        self.guard.restored(step)

    def form_group(self) -> None:
        """Survivors keep training: form the group's first generation before anything is built (a replacement of a
        lost process joins in ``join`` instead, once its model exists)."""
        if self.inplace is not None:
            self.starting("forming the process group")
            self.inplace.form()

    def restart_on_loss(self) -> None:
        """The model is sharded: a lost peer takes its shards with it, so the job restarts from its checkpoint."""
        if self.inplace is not None:
            log.info("survivors keep training is off for a sharded model: a lost peer restarts the job from its "
                     "newest sharded checkpoint")
        self.in_place_allowed = False

    def join(self, state: TrainState) -> Healing | None:
        """Publish this rank's heartbeat (None: the group's first generation), or join a job in progress as a
        replacement, healed from rank 0's live state (how)."""
        self.starting("forming the process group")
        joined = self.inplace.enter(state) if self.inplace is not None else None
        if joined is None:
            self.guard.meet()
        members = self.guard.join_board(joined.members if joined is not None else None)
        if self.inplace is not None and members is not None:
            self.inplace.membership.names = lambda rank: members[rank].replica
        return joined

    def started(self) -> None:
        """The group's first generation trains: replacements may join from now on."""
        if self.inplace is not None and self.in_place_allowed:
            self.inplace.started()

    # ---- a step ------------------------------------------------------------------------------
    def fetching(self, batches: Iterator[Any], state: TrainState) -> Iterator[Any]:
        """The epoch's batches. A stop does not wait for one that is slow to come (more than ``patience``): this
        rank commits the last trained step, which every rank voted on, as its layout allows (``stops.py``)."""
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
            yield batch

    def before_step(self) -> None:
        """A training step starts (the first one is part of the start-up: first imports, compilation)."""
        self.watchdog.phase = "in the first training step (first imports, compilation)" if self.watchdog.starting_up \
            else "in a training step"
        self._step_started = time.monotonic()
        self.record.step_begin()

    def agree_finite(self, state: TrainState, loss: Any) -> bool | None:
        """Before the update, ``--on-nonfinite``: ``fail`` lets it through unchecked (None: the step vote checks the
        loss later, without a collective of its own); ``skip`` has every rank agree the loss is finite first (one
        small synchronous all-reduce), and drops the step's update everywhere when it is not (False)."""
        if self.plan.options.on_nonfinite != "skip":
            return None
        bad = int(self.comm.all_reduce_sum(nonfinite(loss)).item())
        if not bad:
            return True
        self.comm.discard_step(state.optimizer)
        state.skipped.append(state.step + 1)
        if self.ctx.is_chief:
            log.warning("step %d: the loss is NaN or infinite on %d of %d ranks: update skipped (--on-nonfinite "
                        "skip; %d skipped so far)", state.step + 1, bad, self.ctx.world_size, len(state.skipped))
        return False

    def after_step(self, state: TrainState, loss: Any) -> None:
        """A step ended (``loss`` None: its finiteness was agreed on already): beat, vote, stop or fail as agreed.
        The first one ends the start-up: ``--hang-timeout`` holds from here on."""
        self.record.step_end(state.step)
        self.watchdog.trained(state.step, WAITING)
        self.saver.io.check()
        self._act(state, self.vote.poll(state.step, loss, self.notice.for_vote()))
        self.notice.after_step(state.saved_step, self.saver.io.write_seconds)

    def settle(self, state: TrainState) -> None:
        """Finish the vote in flight (before saving, evaluating or exporting); stop or fail as it says."""
        self._act(state, self.vote.drain())

    def checkpoint(self, state: TrainState) -> None:
        """Commit ``state`` (chief) once the vote in flight is settled; a stop that came meanwhile is agreed on right
        after the save (every rank is here, at this step): that save is finished, committed, and every rank stops."""
        self.settle(state)
        if self._noticed_at != (state.step, state.epoch):  # else an advance notice committed this very state
            self.watchdog.phase = "checkpointing"
            self._save(state)
            self.notice.saved(state.step)
        flag = torch.tensor([int(self.request.requested)], dtype=torch.int64, device=self.ctx.device)
        if int(self.comm.all_reduce_sum(flag).item()):
            self.stop_agreed(state)

    def evaluation(self, state: TrainState) -> Evaluation:
        """What the evaluation calls between its batches (``evaluation.py``)."""
        return Evaluation(self, state)

    def finishing(self, state: TrainState) -> None:
        """Training is complete: a stop asked for at the very end commits nothing more (the final step is);
        every write is committed; from now on a stop ends the export at once."""
        verdict = self.vote.drain()
        if verdict is not None and verdict.nonfinite:
            self.fail_nonfinite(state, verdict)
        with self.record.phase("checkpoint"):
            self.saver.io.wait()
        self.guard.exporting()

    def _act(self, state: TrainState, verdict: StepVerdict | None, where: str = "") -> None:
        if verdict is not None and verdict.nonfinite:
            self.fail_nonfinite(state, verdict)
        if verdict is not None and verdict.stop:
            self.stop_agreed(state, where)
        if verdict is not None and verdict.notices:
            self._save_on_notice(state, verdict)

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

    def _save(self, state: TrainState, wait: bool = False) -> None:
        """Save ``state`` (the chief commits it): the time the training is blocked is the ledger's ``checkpoint``."""
        with self.record.phase("checkpoint", step=state.step):
            self.saver.save(state)
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
        """A lost peer with survivors-keep-training on: re-form the group and go on (False: fail as usual). A lost
        peer while this process stops, or that stopped on a signal itself, is a stop: the last trained step is
        committed (``stops.py``), as it is when a stop comes while the survivors wait for the replacement."""
        if not failures.is_peer_lost(exc):
            return False
        if self.request.requested or self.guard.peer_stopped() is not None:
            self.off_step.stop(state, f"{self.watchdog.phase} (a stopping peer left the group)")
        if self.inplace is None or not self.in_place_allowed:
            return False
        self._recoveries_at.append(state.step)
        if self._recoveries_at.count(state.step) > MAX_RECOVERIES_AT_ONE_STEP:
            log.warning("lost a peer at step %d again after %d in-place recoveries there: the failure repeats, so "
                        "the job restarts from its checkpoint instead", state.step, MAX_RECOVERIES_AT_ONE_STEP)
            return False
        in_flight = time.monotonic() - self._step_started
        board = self.guard.board
        lost = [s.member.replica for s in board.silent()] if board is not None else []
        self.record.enter("recovery", t=self.record.last_step_end)  # from the last good step to training again
        self.watchdog.phase = "re-forming the group after losing a peer"
        self.vote = StepVote(self.comm, self.request, self.ctx.device)
        try:
            with self.request.interruptible("waiting for a lost peer's replacement"):
                self.inplace.recover(state, in_flight, lost)
        except Interrupted:
            self.off_step.stop(state, "waiting for a lost peer's replacement")
        self.watchdog.beat(state.step, WAITING)
        return True


class Evaluation:
    """Around an evaluation and between two of its batches: a beat, and the vote, which every rank reads at the same
    batch. A replicated model's evaluation needs no collective but the vote and its sums (its forward passes are its
    own), so a stop does not wait for a slow batch there (read or evaluated: after ``patience``): the chief commits the
    trained step alone (``stops.py``). A sharded model's forward passes are collectives: the vote alone decides."""

    def __init__(self, resilience: Resilience, state: TrainState) -> None:
        self.r, self.state = resilience, state
        collective = resilience.saver.format is not None and resilience.saver.format.collective
        self.patience = None if collective else resilience.patience

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
    """One run of the training: a lost peer ends it recovered (in place) or re-raised."""

    def __init__(self, resilience: Resilience, state: TrainState) -> None:
        self.resilience, self.state = resilience, state
        self.recovered = False

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object) -> bool:
        if exc is None:
            return False
        self.recovered = self.resilience.recover(self.state, exc)
        return self.recovered
