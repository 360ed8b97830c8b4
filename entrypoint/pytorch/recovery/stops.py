"""A stop outside a step: what a rank commits when a signal finds it waiting (for a batch, for a lost peer's
replacement) or finds its peers gone, where the step vote cannot be had.

Every rank that finished step k took part in step k's collectives, and step k's vote was started by every rank
before it fetched its next batch. A rank that waits for its next batch is therefore never behind a peer's trained
state; a peer may however already be inside step k+1's collectives, waiting for it, where no new collective can
meet it. So:

- **A replicated model** (DDP, Horovod, one process): the chief commits its own newest trained step alone, with no
  collective (a peer's random streams are not needed: every step reseeds from (seed, rank, step), ``state.reseed``),
  after the step vote in flight (which every rank started) says that step was finite. The others drain the same
  vote, leave the group (a peer blocked in a collective on them sees it at once, and stops too: ``guard.py``'s
  ``post_stop``) and wait, within the grace period, until that checkpoint is committed. Each says what is committed.
- **A sharded model** (FSDP, HSDP): every rank must write its own shards, with collectives. The ranks that were
  interrupted waiting for a batch meet in the job's store: when every rank waits there at the same step, they commit
  together (the usual stop, ``StepGuard.stop_agreed``). When one does not come within a few seconds, it is inside
  step k+1's collectives, waiting for them: they wake it (``_wake``: the step's vote read, the write in flight
  finished, the stop posted, every connection shut down, which fails its collective at once). It reads that a peer
  stopped (``guard.py``), and its state is step k's: step k+1 never reached its optimizer (that needs the waiting
  ranks' collectives), the step counter and the data position move only after the update, every step reseeds its
  random streams, and gradients are never saved (the next step's ``zero_grad`` drops them). It joins the meeting at step
  k, wakes the ranks that may be blocked on it, and every rank writes its shards of step k over a new gloo group
  formed over the job's store (the training group and the saves' group are broken), the chief commits, each says
  so. Each decision is claimed in the store (the first claim wins), so every rank acts on the same one; a rank that
  does not come even then leaves step k uncommitted, and each says so (over NCCL, where a collective waits on the
  GPU, the wake is untried: a rank it does not wake is such a rank).

Which of the two is the layout's fact, given once (``together``: its ranks each write their shards).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable
from typing import NoReturn, Protocol

import torch

from entrypoint.errors import StopRequested
from entrypoint.lifecycle.recorder import Recorder
from entrypoint.lifecycle.watch.watchdog import HangWatchdog
from entrypoint.outputs import checkpoints
from entrypoint.outputs.storage import Location
from entrypoint.planning.plan import Plan
from entrypoint.pytorch.checkpoints.resume import LoopCheckpoints
from entrypoint.pytorch.defaults import HookContext
from entrypoint.pytorch.launch.collectives import Collectives, TorchStore
from entrypoint.pytorch.recovery.guard import RunGuard
from entrypoint.pytorch.recovery.vote import StepVerdict, StepVote
from entrypoint.pytorch.state import TrainState

log = logging.getLogger("entrypoint.pytorch")
MEET_SECONDS = 5.0  # at most, for every rank of a sharded model to come to a stop outside a step
TOGETHER, WOKEN = "together", "woken"  # how the ranks of a sharded model met (``OffStep._meet``)


class Loop(Protocol):
    """What a stop outside a step uses of the loop's guard (``StepGuard``)."""

    plan: Plan
    comm: Collectives
    ctx: HookContext
    saver: LoopCheckpoints
    guard: RunGuard
    vote: StepVote
    watchdog: HangWatchdog
    record: Recorder

    def stop_agreed(self, state: TrainState, where: str = "") -> NoReturn:
        """Every rank agreed to stop at this step: commit it together, end."""

    def fail_nonfinite(self, state: TrainState, verdict: StepVerdict) -> NoReturn:
        """Every rank saw the same non-finite step: fail."""


class OffStep:
    """The stops that the step vote cannot agree on (``StepGuard`` holds one): the chief commits alone, or (with
    ``together``: every rank writes its shards) the ranks meet first."""

    def __init__(self, loop: Loop, together: bool) -> None:
        self.r, self.together = loop, together
        self.verdict: StepVerdict | None = None  # the vote a woken sharded model read before its stop

    @property
    def guard(self) -> RunGuard:
        """The run's guard (signals, the store, what is committed)."""
        return self.r.guard

    def stop(self, state: TrainState, where: str) -> NoReturn:
        """This rank stops while ``where`` (after ``state.step``): commit the last trained step as its layout
        allows, say what is committed, raise ``StopRequested``."""
        r = self.r
        r.watchdog.phase = f"saving before stopping ({where})"
        if self.together:
            met = self._meet(state)
            if met == TOGETHER:
                r.stop_agreed(state)  # every rank waits at this step: the usual stop, with its collectives
            if met == WOKEN:
                self._commit_woken(state, where)
            self.guard.post_stop(state.step)
            r.comm.leave()
            self._raise(state, where, committed=None)
        self.guard.post_stop(state.step)
        verdict = self._drain(state)
        if r.ctx.is_chief:
            self._commit_alone(state, verdict)
            self._raise(state, where, committed=checkpoints.is_committed(self._path(state)))
        r.comm.leave()  # a peer blocked in a collective on this rank sees it leave at once
        self._raise(state, where, committed=self.guard.wait_for_commit(state.step))

    def _drain(self, state: TrainState) -> StepVerdict | None:
        """The step vote in flight (every rank started it before it fetched its next batch, so it completes while
        they live); None when the group is already broken."""
        try:
            verdict = self.r.vote.drain()
        except Exception:  # the group broke: a peer left (or is lost); the vote's answer is gone with it
            return None
        if verdict is not None and verdict.nonfinite:
            self.r.fail_nonfinite(state, verdict)
        return verdict if verdict is not None else StepVerdict(state.step, False, 0)

    def _commit_alone(self, state: TrainState, verdict: StepVerdict | None) -> None:
        """The chief commits its state of ``state.step``, with no collective (a peer may be inside one)."""
        r = self.r
        if state.saved_step == state.step:
            r.saver.io.wait()  # its checkpoint is in flight (or committed): finish it
            return
        if verdict is None and not _finite(state):  # no vote to say the step was finite: its weights must be
            log.warning("the weights of step %d are not finite: not committing them", state.step)
            return
        with r.record.phase("checkpoint", step=state.step):
            r.saver.save(state, alone=True)
            r.saver.io.wait()
        r.record.committed(state.step)

    def _raise(self, state: TrainState, where: str, committed: bool | None) -> NoReturn:
        """End with a stop that says what is committed (``committed``: this step's checkpoint is, or is not)."""
        stopped = None if self.guard.request.requested else self.guard.peer_stopped()
        signum = self.guard.request.signum or int(stopped["signum"] if stopped else signal.SIGTERM)
        words = f"{self.guard.stop_words(stopped)} while {where} after step {state.step}"
        kept = True
        if committed:
            text = f"checkpoint {self._path(state)} committed; the restart resumes from it"
            if self.r.ctx.is_chief:
                log.info("%s: checkpoint %s committed", words, self._path(state).name)
        else:
            text, kept = self.guard.holding()
        raise StopRequested(signum, f"{words}: {text}", kept)

    def _path(self, state: TrainState) -> Location:
        return checkpoints.checkpoint_path(self.r.ctx.checkpoint_dir, state.step)

    # ---- a sharded model: meet in the job's store -----------------------------------------------------
    def _meet(self, state: TrainState) -> str | None:
        """Whether every rank comes to a stop outside a step at ``state.step``: ``TOGETHER`` (at once, the group
        intact), ``WOKEN`` (once the ranks blocked in the next step's collectives were woken, the group broken), or
        None (one never came: nothing newer can be committed). Each decision is claimed in the store, so every rank
        reads the same."""
        store, guard, step = self.guard.store, self.guard, state.step
        if not isinstance(store, TorchStore):
            return None
        key = f"trainer/stop-meet/{self.r.plan.topology.trial or ''}/{step}/"
        survivors = guard.survivors  # HSDP's survivors training without a lost node: the live ranks
        ranks = survivors.membership.members if survivors is not None else range(self.r.ctx.world_size)

        def here() -> bool | None:
            return all(store.fetch(f"{key}{r}") for r in ranks) or None

        try:
            store.put(f"{key}{self.r.ctx.rank}", "1")
            came = _until(here, min(MEET_SECONDS, guard.left() / 4))
            if store.claim(f"{key}verdict", TOGETHER if came else WOKEN) == TOGETHER:
                return TOGETHER
        except Exception:  # the store is gone with its host: no meeting
            return None
        self._wake(state)  # a rank not here is inside step ``step + 1``'s collectives, waiting for this one
        verdict = self.verdict
        bad = verdict is not None and verdict.nonfinite > 0
        try:
            came = None if bad else _until(here, min(MEET_SECONDS, guard.left() / 3))
            met = store.claim(f"{key}woken", "yes" if came else "no") == "yes"
        except Exception:
            return None
        if verdict is not None and bad:  # after the wake, once no rank can take this meeting for a commit: fail
            self.r.fail_nonfinite(state, verdict)
        return WOKEN if met else None

    def _wake(self, state: TrainState) -> None:
        """Wake the ranks blocked in step ``state.step + 1``'s collectives: the vote every rank started after that
        step is read (a non-finite one fails once the others are woken: ``_meet``), the write in flight finished,
        this stop posted (a woken rank learns that a peer stopped, ``guard.post_stop``), then every connection of
        this rank shut down (``Collectives.wake``). A woken rank's step never reached its optimizer (that needs this
        rank's collectives): its state is ``state.step``'s, and it wakes the others in turn."""
        r = self.r
        try:
            verdict = r.vote.drain()
            self.verdict = verdict if verdict is not None else StepVerdict(state.step, False, 0)
        except Exception:  # the group broke (this rank was woken): the vote's answer is gone with it
            self.verdict = None
        with contextlib.suppress(Exception):  # its failure was said in its log line; what it left is removed
            r.saver.io.wait()
        self.guard.post_stop(state.step)
        r.comm.wake()

    def _commit_woken(self, state: TrainState, where: str) -> NoReturn:
        """Every rank met after the wake: each writes its shards of ``state.step`` over a new group (the training
        group and the saves' group are broken), the chief commits; each says what is committed."""
        r = self.r
        r.watchdog.phase = f"saving before stopping ({where}; the ranks in the next step woken)"
        if self.verdict is None and not _finite(state):
            log.warning("the weights of step %d are not finite: not committing them", state.step)
        elif state.saved_step != state.step:
            r.saver.io.regroup()
            with r.record.phase("checkpoint", step=state.step):
                r.saver.save(state, alone=True)  # no gather of random streams: every step reseeds them
                r.saver.io.wait()
            r.record.committed(state.step)
        committed = checkpoints.is_committed(self._path(state)) if r.ctx.is_chief else \
            self.guard.wait_for_commit(state.step)
        self._raise(state, where, committed=committed)


def _until(look: Callable[[], object], seconds: float) -> object:
    """``look()`` until it answers (not None), at most ``seconds``; its answer, or None."""
    deadline = time.monotonic() + seconds
    while (answer := look()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return answer


def _finite(state: TrainState) -> bool:
    """Whether every parameter of the model is finite."""
    with torch.no_grad():
        return all(bool(torch.isfinite(p).all()) for p in state.model.parameters())
