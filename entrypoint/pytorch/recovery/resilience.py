"""The hooks loop's fault tolerance behind one object: the loop calls it before a step, after a step, and on failure.

``Resilience`` owns what keeps a step safe, so that the training loop reads as training:

- ``running()``: the stop signals are taken over (SIGTERM/SIGINT only set a flag), the hang watchdog runs from
  the first hook on (the start-up, ``build_datasets`` to the end of the first step, must end within
  ``--startup-timeout``; each later step within ``--hang-timeout``), and a lost peer that ended the run is named
  from the heartbeats.
- ``before_step`` / ``after_step(state, loss)``: the watchdog's phases and beats, a failed background checkpoint
  write, and the per-step vote (``vote.py``): every rank learns at the same step that a signal arrived
  anywhere (the chief commits that step, every rank exits 128 + N), that a loss was not finite, or that the
  platform gave a node an advance notice (``notices.py``: that step is committed at once, training goes on).
- ``agree_finite(state, loss)``: ``--on-nonfinite skip`` (every rank agrees the loss is finite before the update,
  or drops it); ``fail`` leaves it to the vote.
- ``checkpoint(state)`` and ``settle(state)``: the vote in flight is finished before anything is saved,
  evaluated or exported, so no checkpoint holds the state of a step whose loss was not finite.
- ``attempts(state)``: the training runs once; with survivors-keep-training on (``survivors.py``), a lost peer
  re-forms the group with its replacement and the training runs again from rank 0's position.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

from entrypoint import errors, failures
from entrypoint.errors import NonFiniteLoss, PeerError, StopRequested
from entrypoint.lifecycle import peers, recorder
from entrypoint.lifecycle.signals import StopRequest
from entrypoint.lifecycle.waiting import LOG_EVERY, Wait
from entrypoint.lifecycle.watchdog import HangWatchdog
from entrypoint.outputs import checkpoints, goodput
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.checkpoints.resume import LoopCheckpoints
from entrypoint.pytorch.defaults import HookContext
from entrypoint.pytorch.launch.collectives import Collectives
from entrypoint.pytorch.recovery.notices import AdvanceNotice
from entrypoint.pytorch.recovery.survivors import Healing, InPlace
from entrypoint.pytorch.recovery.vote import StepVerdict, StepVote, nonfinite
from entrypoint.pytorch.state import TrainState

log = logging.getLogger("entrypoint.pytorch")
MAX_RECOVERIES_AT_ONE_STEP = 2  # more, at the same step, is a failure that repeats (not a peer that was lost)


class Resilience:
    """Stop signals, non-finite losses, hangs, heartbeats and in-place recovery around the hooks loop's steps."""

    def __init__(self, plan: Plan, comm: Collectives, ctx: HookContext, checkpoints: LoopCheckpoints,
                 failure_context: failures.FailureContext, inplace: InPlace | None) -> None:
        self.plan, self.comm, self.ctx, self.saver = plan, comm, ctx, checkpoints
        # The job ledger (the chief's; a no-op elsewhere): phases, steps, saves, restores, recoveries (goodput).
        self.record = recorder.for_training(plan.outputs.job_dir, plan.topology.replica_name, ctx.rank, ctx.is_chief)
        self.failure_context, self.inplace = failure_context, inplace
        self.request = StopRequest()
        self.vote = StepVote(comm, self.request, ctx.device)
        self.watchdog = HangWatchdog(plan.options.hang_timeout, failure_context, plan.options.startup_timeout)
        self.board: peers.PeerBoard | None = None
        self.in_place_allowed = True
        self._recoveries_at: list[int] = []  # the step of each in-place recovery
        self._step_started = time.monotonic()
        self.notice = AdvanceNotice(plan, ctx)  # the platform's advance notice (``notices.py``)
        self._noticed_at: tuple[int, int] | None = None  # (step, epoch) of the last checkpoint a notice asked for

    # ---- the run ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[Resilience]:
        """Stop signals and the hang watchdog for the whole run; a lost peer that ended it is named."""
        self.request.install()
        self.watchdog.phase = "starting the training loop"
        self.watchdog.start()
        self.notice.start()
        self.record.enter("preparation")
        try:
            yield self
            self.record.close("finished")
        except BaseException as exc:
            # A write still in flight ends (and says how) before the failure's last line, not after it: the
            # process's exit would wait for its thread anyway, and the last line names the root cause.
            with contextlib.suppress(BaseException):
                self.saver.io.wait()
            self.record.close("stopped" if isinstance(exc, StopRequested) else "failed")
            named = self._name_the_lost(exc)
            if named is not exc:
                raise named from None
            raise
        finally:
            self.request.uninstall()
            self.watchdog.stop()
            self.notice.stop()
            if self.board is not None:
                self.board.stop()

    def starting(self, what: str) -> None:
        """The loop starts ``what``: within the start-up's ``--startup-timeout``; after it, within ``--hang-timeout``
        (that clock starts now)."""
        self.watchdog.beat(self.watchdog.step, what)

    def doing(self, what: str) -> None:
        """The loop is now doing ``what`` (the clock keeps running: the step before and this share it)."""
        self.watchdog.phase = what

    def beat(self, state: TrainState) -> None:
        """Training goes on at ``state``'s step (after the start-up, the step clock starts now)."""
        self.watchdog.beat(state.step, "waiting for the first batch" if self.watchdog.starting_up else
                           "waiting for the next batch")

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
            self._meet()
        self._join_board(joined.members if joined is not None else None)
        return joined

    def _meet(self) -> None:
        """Every rank built its datasets and model before the first collective; the ranks still building are
        named every 20 s and, at ``--timeout``, in the failure (a collective's timeout names nobody)."""
        store = self.comm.heartbeat_store()
        if store is None:
            return
        rank, world = self.ctx.rank, self.ctx.world_size
        key = f"trainer/built/{self.plan.topology.trial or ''}/"
        store.put(f"{key}{rank}", "1")
        wait = Wait(self.plan.options.timeout, first_after=LOG_EVERY, logger=log)

        def pending() -> tuple[str, str] | None:
            missing = [r for r in range(world) if store.fetch(f"{key}{r}") is None]
            if not missing:
                return None
            return ", ".join(self._rank_name(r) for r in missing), "building its datasets and model"

        wait.until(pending)

    def _rank_name(self, rank: int) -> str:
        """A rank as users know it: its replica (``workerpool1[0]``) and rank."""
        placed, peers_ = self.plan.placed, self.plan.topology.training_peers()
        node = rank // max(placed.local_world_size, 1)
        return f"{peers_[node].name} (rank {rank})" if node < len(peers_) else f"rank {rank}"

    def started(self) -> None:
        """The group's first generation trains: replacements may join from now on."""
        if self.inplace is not None and self.in_place_allowed:
            self.inplace.started()

    # ---- a step ------------------------------------------------------------------------------
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
        self.watchdog.trained(state.step, "waiting for the next batch")
        self.saver.io.check()
        self._act(state, self.vote.poll(state.step, loss, self.notice.for_vote()))
        self.notice.after_step(state.saved_step, self.saver.io.write_seconds)

    def settle(self, state: TrainState) -> None:
        """Finish the vote in flight (before saving, evaluating or exporting); stop or fail as it says."""
        self._act(state, self.vote.drain())

    def checkpoint(self, state: TrainState) -> None:
        """Commit ``state`` (chief) once the vote in flight is settled."""
        self.settle(state)
        if self._noticed_at == (state.step, state.epoch):
            return  # an advance notice committed this very state already
        self.watchdog.phase = "checkpointing"
        self._save(state)
        self.notice.saved(state.step)

    def finishing(self, state: TrainState) -> None:
        """Training is complete: a stop asked for at the very end is moot; every write is committed."""
        verdict = self.vote.drain()
        if verdict is not None and verdict.nonfinite:
            self._fail_nonfinite(state, verdict)
        with self.record.phase("checkpoint"):
            self.saver.io.wait()
        self.watchdog.end_startup()  # nothing was left to train (a rerun at the final checkpoint)
        self.watchdog.phase = "exporting the model (chief) and waiting for it (the others)"
        self.record.enter("export")

    def _act(self, state: TrainState, verdict: StepVerdict | None) -> None:
        if verdict is not None and verdict.nonfinite:
            self._fail_nonfinite(state, verdict)
        if verdict is not None and verdict.stop:
            self._stop(state)
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

    def _stop(self, state: TrainState) -> None:
        """Every rank agreed to stop: commit this exact step (chief), wait for the write, exit 128 + signal."""
        signum = self.request.signum or signal.SIGTERM
        name = signal.Signals(signum).name
        self.watchdog.phase = "saving before stopping"
        verdict = self.vote.drain()  # the stop step itself must be finite before it is committed
        if verdict is not None and verdict.nonfinite:
            self._fail_nonfinite(state, verdict)
        if state.saved_step != state.step:
            self._save(state, wait=True)
        else:
            self.saver.io.wait()
        path = checkpoints.checkpoint_path(self.ctx.checkpoint_dir, state.step)
        if self.ctx.is_chief:
            log.info("stopped by %s at step %d: checkpoint %s committed", name, state.step, path)
        raise StopRequested(signum, f"stopped by {name} at step {state.step}; the restart resumes from {path}")

    def _save(self, state: TrainState, wait: bool = False) -> None:
        """Save ``state`` (the chief commits it): the time the training is blocked is the ledger's ``checkpoint``."""
        with self.record.phase("checkpoint", step=state.step):
            self.saver.save(state)
            if wait:
                self.saver.io.wait()
        self.record.committed(state.step)

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A phase of the job ledger (``evaluation``) around the loop's block."""
        return self.record.phase(name)

    def goodput_so_far(self) -> dict[str, Any]:
        """The job's goodput so far, this attempt's steps included (the training summary's ``goodput``)."""
        self.record.flush()
        return goodput.so_far(self.plan.outputs.job_dir)

    def restored(self, step: int) -> None:
        """The training goes on after ``step`` (what the newest checkpoint held; 0 for a fresh start)."""
        self.record.restored(step)
        self.record.enter("preparation")

    def _fail_nonfinite(self, state: TrainState, verdict: StepVerdict) -> None:
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
        """A lost peer with survivors-keep-training on: re-form the group and go on (False: fail as usual)."""
        if self.inplace is None or not self.in_place_allowed or not failures.is_peer_lost(exc):
            return False
        self._recoveries_at.append(state.step)
        if self._recoveries_at.count(state.step) > MAX_RECOVERIES_AT_ONE_STEP:
            log.warning("lost a peer at step %d again after %d in-place recoveries there: the failure repeats, so "
                        "the job restarts from its checkpoint instead", state.step, MAX_RECOVERIES_AT_ONE_STEP)
            return False
        in_flight = time.monotonic() - self._step_started
        lost = [s.member.replica for s in self.board.silent()] if self.board is not None else []
        self.record.enter("recovery", t=self.record.last_step_end)  # from the last good step to training again
        self.watchdog.phase = "re-forming the group after losing a peer"
        self.vote = StepVote(self.comm, self.request, self.ctx.device)
        self.inplace.recover(state, in_flight, lost)
        self.watchdog.beat(state.step, "waiting for the next batch")
        return True

    def _join_board(self, names: list[Any] | None) -> None:
        """Every rank says who it is and starts its heartbeat (survivors use them to name a lost peer)."""
        if names is None:
            names = self.comm.gather_object((self.plan.topology.replica_name, socket.gethostname()))
        store = self.comm.heartbeat_store()
        if store is None:
            return
        members = [peers.Member(rank, replica, host) for rank, (replica, host) in enumerate(names)]
        self.board = peers.PeerBoard(store, members[self.ctx.rank], members).start()
        self.watchdog.board = self.board
        if self.inplace is not None:
            self.inplace.membership.names = lambda rank: members[rank].replica

    def _name_the_lost(self, exc: BaseException) -> BaseException:
        """A lost peer, named by the heartbeats (gloo only says an address and a port); ``exc`` otherwise."""
        if self.board is None or not failures.is_peer_lost(exc):
            return exc
        silent = self.board.silent()
        if not silent:
            return exc
        step = self.board.step
        for lost in silent:
            failures.record_verdict(self.failure_context, lost.member.replica, lost.member.rank, errors.PEER_LOST,
                                    f"{peers.describe([lost])}; the others stopped at step {step}")
        return PeerError(f"lost {peers.describe(silent)} at step {step} ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]})")


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
